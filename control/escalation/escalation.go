// Package escalation turns the bursts that rules' escalations detect into penalties (docs/architecture.md,
// Escalation and adaptive limits). A caller that bursts at a rule is warned for the rule's
// penalty: a warn override for its target and the rule, under which its decisions are soft
// with X-RateLimit-Warning. A burst while warned bans it from the rule for the penalty: the
// warning is replaced by a ban. Both are automatic overrides written to the control store with
// their audit events (burst_detected_warning, burst_detected_blocked; actor abuse-detector),
// so every node of the fleet enforces them within a second, through its control plane.
//
// Bursts come from the Limiter's burst hook (sluice.WithBurstHook), during a check: Report
// hands them to a bounded queue and never blocks, and one goroutine writes the penalties, off
// the hot path. A full queue drops the burst and counts it (Dropped); the counter that found it
// reports the caller's next burst, a window later.
package escalation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// Defaults of Options.
const (
	// DefaultQueueSize bounds the bursts waiting for their penalty. A burst is reported once
	// per caller, rule and window fleet-wide, so even a flood of callers fills it slowly.
	DefaultQueueSize = 4096
	// DefaultTimeout bounds each escalation's calls to the control store.
	DefaultTimeout = 2 * time.Second
)

// Options configure an Escalator. Store is required.
type Options struct {
	// Store is the control store the penalties are written to.
	Store control.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock penalties expire by; time.Now when nil.
	Now func() time.Time
	// QueueSize and Timeout: zero takes the default.
	QueueSize int
	Timeout   time.Duration
	// Applied, when set, is called with every penalty written (for metrics).
	Applied func(control.Override)
}

// Escalator writes escalation penalties. Report is safe for concurrent use.
type Escalator struct {
	o       Options
	log     *slog.Logger
	now     func() time.Time
	queue   chan sluice.Burst
	dropped atomic.Uint64

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New returns an Escalator; Start runs it.
func New(o Options) (*Escalator, error) {
	if o.Store == nil {
		return nil, errors.New("escalation: no control store")
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	e := &Escalator{o: o, log: o.Logger, now: o.Now, queue: make(chan sluice.Burst, o.QueueSize)}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.now == nil {
		e.now = time.Now
	}
	return e, nil
}

// Report queues b for its penalty, or drops and counts it when the queue is full: it never
// blocks, as it runs inside a check (sluice.WithBurstHook).
func (e *Escalator) Report(b sluice.Burst) {
	select {
	case e.queue <- b:
	default:
		e.dropped.Add(1)
	}
}

// Dropped returns how many bursts found the queue full.
func (e *Escalator) Dropped() uint64 { return e.dropped.Load() }

// Start writes the penalties of the bursts reported, until ctx ends or Close. enforce, when set,
// is called with the control version of each penalty written, so that this node enforces it
// before the next burst is handled (controlplane.Runtime.Sync); the other nodes follow within a
// second.
func (e *Escalator) Start(ctx context.Context, enforce func(context.Context, int64) error) {
	ctx, e.cancel = context.WithCancel(ctx)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		var dropped uint64
		for {
			select {
			case <-ctx.Done():
				return
			case b := <-e.queue:
				o, err := e.Escalate(ctx, b)
				switch {
				case errors.Is(err, ErrOverridden):
					e.log.Debug("escalation: burst not penalized: an override of the caller applies already", "rule", b.Rule, "tenant", b.Tenant, "user", b.User, "api_key", b.APIKey != "")
				case err != nil:
					if ctx.Err() == nil {
						e.log.Warn("escalation: writing a penalty failed", "rule", b.Rule, "err", err)
					}
				case enforce != nil:
					cctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
					if err := enforce(cctx, o.Version); err != nil && ctx.Err() == nil {
						e.log.Debug("escalation: enforcing the penalty here waits for the control plane", "err", err)
					}
					cancel()
				}
				if d := e.dropped.Load(); d != dropped {
					e.log.Warn("escalation: queue full, bursts dropped", "dropped_total", d)
					dropped = d
				}
			}
		}
	}()
}

// Close stops the Escalator and waits for it; bursts still queued are dropped.
func (e *Escalator) Close() {
	e.once.Do(func() {
		if e.cancel != nil {
			e.cancel()
		}
		e.wg.Wait()
	})
}

// ErrOverridden is returned by Escalate when the caller's target holds an override that is
// neither a warning nor missing (a ban already, or an operator's multiplier): escalation
// leaves it as it is.
var ErrOverridden = errors.New("escalation: the target has an override that is not a warning")

// maxAttempts bounds the retries of an escalation that raced another node's.
const maxAttempts = 3

// Escalate writes the penalty of burst b and returns it: a warning when the caller's target
// (its API key, or its tenant and user, with the rule) has no live override, a ban replacing
// it when it has a warning. The control store checks the state it was decided on, so two
// nodes escalating one caller at once write one penalty each in turn, never two warnings.
func (e *Escalator) Escalate(ctx context.Context, b sluice.Burst) (control.Override, error) {
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	target := control.Override{Tenant: b.Tenant, User: b.User, APIKey: b.APIKey, Rule: b.Rule}
	if b.APIKey != "" {
		target.Tenant, target.User = "", ""
	}
	var err error
	for range maxAttempts {
		var cur *control.Override
		if cur, err = e.current(ctx, target); err != nil {
			return control.Override{}, err
		}
		var o control.Override
		switch {
		case cur == nil:
			o, err = e.write(ctx, b, target, control.OverrideWarn, "")
			if errors.Is(err, control.ErrConflict) {
				continue // another node's penalty came first: look again
			}
		case cur.Type == control.OverrideWarn:
			o, err = e.write(ctx, b, target, control.OverrideBan, cur.ETag())
			if errors.Is(err, control.ErrPreconditionFailed) {
				continue
			}
		default:
			return control.Override{}, ErrOverridden
		}
		if err == nil && e.o.Applied != nil {
			e.o.Applied(o)
		}
		return o, err
	}
	return control.Override{}, fmt.Errorf("escalation: %d attempts raced other writers: %w", maxAttempts, err)
}

// current returns the live override of exactly target, or nil.
func (e *Escalator) current(ctx context.Context, target control.Override) (*control.Override, error) {
	os, err := e.o.Store.ListOverrides(ctx, control.OverrideFilter{Tenant: target.Tenant, User: target.User, APIKey: target.APIKey})
	if err != nil {
		return nil, fmt.Errorf("escalation: %w", err)
	}
	for i := range os {
		o := &os[i]
		if o.Tenant == target.Tenant && o.User == target.User && o.APIKey == target.APIKey && o.Endpoint == "" && o.Rule == target.Rule {
			return o, nil
		}
	}
	return nil, nil
}

// write creates the penalty typ for target, replacing the override whose ETag is ifMatch when
// set.
func (e *Escalator) write(ctx context.Context, b sluice.Burst, target control.Override, typ control.OverrideType, ifMatch string) (control.Override, error) {
	o := target
	o.Type, o.Source, o.ExpiresAt = typ, control.SourceAutomatic, e.now().Add(b.Penalty)
	action := control.ActionBurstWarning
	o.Reason = fmt.Sprintf("burst: more than %d requests within %s; warned for %s, banned if it bursts again",
		b.Threshold, duration(b.Window), duration(b.Penalty))
	if typ == control.OverrideBan {
		action = control.ActionBurstBlocked
		o.Reason = fmt.Sprintf("burst again while warned: more than %d requests within %s; banned for %s",
			b.Threshold, duration(b.Window), duration(b.Penalty))
	}
	ch := control.Change{Actor: control.ActorAbuseDetector, Action: action, IfMatch: ifMatch}
	out, err := e.o.Store.CreateOverride(ctx, ch, o)
	if err != nil {
		return control.Override{}, fmt.Errorf("escalation: %s rule %q: %w", typ, b.Rule, err)
	}
	e.log.Info("escalation: penalty applied", "type", typ, "rule", b.Rule, "tenant", o.Tenant, "user", o.User,
		"api_key", o.APIKey != "", "until", out.ExpiresAt, "override", out.ID)
	return out, nil
}

// duration writes d as policies do: 10s, 5m.
func duration(d time.Duration) string {
	b, _ := policy.Duration(d).MarshalText()
	return string(b)
}
