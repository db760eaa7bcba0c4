package abuse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/control"
)

// LeaseName is the control store lease whose holder runs the detector for the fleet.
const LeaseName = "abuse-detector"

// Options configure a Detector. Store and Holder are required.
type Options struct {
	// Store is the control store: the counts are read from it, the lease and the penalties
	// written to it.
	Store control.Store
	// Holder names this node in the lease: its node id, unique in the fleet.
	Holder string
	// Config is what to detect and how to penalize; Validate it first.
	Config Config
	// Metrics receives the detector's metrics; nil records nothing.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock of runs and penalties; time.Now when nil. It must agree with the
	// store's clock, which times the lease and the overrides' expiry.
	Now func() time.Time
}

// Detector runs the abuse detector on the node that holds the lease. Its methods are safe
// for concurrent use.
//
// Every node steps every half Interval: the holder renews the lease for one Interval, and the
// others try to take it. So the holder renews twice per lease, and when it dies (no release)
// another node takes the lease within 1.5 Intervals of its last renewal and runs at once: the
// job moves within two intervals. The holder runs every Interval; a node that does not hold
// the lease counts StatusNotLeader once per Interval.
type Detector struct {
	o   Options
	log *slog.Logger
	now func() time.Time

	// mu serializes steps and guards the fields below. It is held across the store calls of a
	// step, which only the detector's own goroutine and tests make.
	mu      sync.Mutex
	held    bool      // this node held the lease at its last step
	nextRun time.Time // when the next run is due
	failing bool      // the lease failed at the last due step

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Detector; Start runs it.
func New(o Options) (*Detector, error) {
	if o.Store == nil {
		return nil, errors.New("abuse: no control store")
	}
	if err := control.CheckText("holder", o.Holder, 1, control.MaxActorLen); err != nil {
		return nil, fmt.Errorf("abuse: %w", err)
	}
	if err := o.Config.Validate(); err != nil {
		return nil, fmt.Errorf("abuse: %w", err)
	}
	d := &Detector{o: o, log: o.Logger, now: o.Now}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d, nil
}

// Start steps the detector every half Interval, from now until ctx ends or Close.
func (d *Detector) Start(ctx context.Context) {
	ctx, d.cancel = context.WithCancel(ctx)
	d.done = make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(d.o.Config.Interval / 2)
		defer t.Stop()
		for {
			d.Step(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the detector if it was started and gives the lease up, so that another node
// takes over at its next step rather than when the lease expires.
func (d *Detector) Close() {
	d.closeOnce.Do(func() {
		if d.cancel != nil {
			d.cancel()
			<-d.done
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.held {
			return
		}
		d.held = false
		ctx, cancel := context.WithTimeout(context.Background(), d.leaseTimeout())
		defer cancel()
		if err := d.o.Store.ReleaseLease(ctx, LeaseName, d.o.Holder); err != nil {
			d.log.Warn("abuse detector: releasing the lease failed; another node takes over when it expires", "err", err)
		}
	})
}

// leaseTimeout bounds a lease call: well inside the half interval between steps.
func (d *Detector) leaseTimeout() time.Duration { return min(d.o.Config.Interval/4, 5*time.Second) }

// Step takes or renews the lease and, when a run is due, runs the detector if this node holds
// the lease. It returns the status of the run, StatusIdle when none was due, and counts it in
// sluice_abuse_runs_total.
func (d *Detector) Step(ctx context.Context) Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	interval := d.o.Config.Interval
	lctx, cancel := context.WithTimeout(ctx, d.leaseTimeout())
	held, err := d.o.Store.AcquireLease(lctx, LeaseName, d.o.Holder, interval)
	cancel()
	if ctx.Err() != nil {
		return StatusIdle // shutting down: not a failure
	}
	// A failed call leaves held as it was: the lease may well still be ours, and a run right
	// after the store answers again would come early.
	tookOver := err == nil && held && !d.held
	if err == nil {
		d.held = held
	}
	now := d.now()
	// A quarter interval of slack, so that a tick that fires a little early does not push
	// the run to the next one.
	if !tookOver && now.Before(d.nextRun.Add(-interval/4)) {
		return StatusIdle
	}
	d.nextRun = now.Add(interval)
	if err == nil && d.failing {
		d.log.Info("abuse detector: the control store lease answers again")
	}
	var status Status
	switch {
	case err != nil:
		status = StatusError
		// Warn once per outage: the control plane's runtime reports the store as down too.
		level := slog.LevelWarn
		if d.failing {
			level = slog.LevelDebug
		}
		d.log.Log(ctx, level, "abuse detector: the control store lease failed; retrying next interval", "err", err)
		d.failing = true
	case !held:
		status = StatusNotLeader
	default:
		if tookOver {
			d.log.Info("abuse detector: this node runs it now", "holder", d.o.Holder)
		}
		status = d.run(ctx)
	}
	if err == nil {
		d.failing = false
	}
	d.o.Metrics.Run(status)
	return status
}

// run runs Detect within the interval, so that a slow store never makes runs overlap.
func (d *Detector) run(parent context.Context) Status {
	ctx, cancel := context.WithTimeout(parent, d.o.Config.Interval)
	defer cancel()
	start := time.Now()
	flags, err := d.Detect(ctx)
	if parent.Err() != nil {
		return StatusIdle // shutting down mid-run: not a failure of the run
	}
	if err != nil {
		d.log.Warn("abuse detector run failed", "err", err, "flags", len(flags))
		return StatusError
	}
	d.log.Debug("abuse detector ran", "flags", len(flags), "took", time.Since(start))
	return StatusOK
}
