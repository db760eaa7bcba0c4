// Package controlplane keeps a node's Limiter on the current policy: the policy files and the
// control store's state, compiled together into one snapshot (policy.CompileWith) and swapped
// into the Limiter whenever either changes (docs/architecture.md, Control plane). The hot path never
// reads the control store: it reads the snapshot the Runtime last swapped in.
//
// A Runtime hears of control changes through the store's Watch and, as a backstop for lost
// notifications, polls the control version every second. While the store does not answer it
// keeps the last snapshot it compiled, reports the store as down (Health,
// sluice_control_store_up), and catches up once it answers again. It also heartbeats the node
// with the control version it enforces, audits policy-file reloads, and runs the fleet's
// housekeeping: expiring overrides and exemptions, pruning old audit events, counts and nodes.
package follower

import (
	"context"
	"encoding/json"
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
	// DefaultPollInterval is how often the control version is polled: the bound on how late a
	// node hears of a change whose notification was lost.
	DefaultPollInterval = time.Second
	// DefaultHeartbeatInterval is how often a node heartbeats when nothing changes; it also
	// heartbeats at once after every swap. A node not seen for a few intervals is gone.
	DefaultHeartbeatInterval = 3 * time.Second
	// DefaultMaintenanceInterval is how often the fleet's housekeeping runs (on one node).
	DefaultMaintenanceInterval = 10 * time.Second
	// DefaultTimeout bounds each call to the control store. A read of its whole state (Load)
	// is bounded by it between two parts read, not as a whole (read).
	DefaultTimeout = 2 * time.Second
	// DefaultMaxLoadTimeout is as far as a Load's deadline stretches after stalls: a store
	// that answers but whose read stalls longer is reported down.
	DefaultMaxLoadTimeout = time.Minute
	// DefaultAuditRetention keeps audit events a year (--audit-retention).
	DefaultAuditRetention = 365 * 24 * time.Hour
	// DefaultCountsRetention keeps usage and violation counts 30 days (--violations-retention).
	DefaultCountsRetention = 30 * 24 * time.Hour
	// DefaultNodeRetention forgets nodes not seen for a day.
	DefaultNodeRetention = 24 * time.Hour
)

// LiveNodeWindow is how recently a node must have heartbeated to count as live for the admin
// API's node list: a few heartbeats, so one late heartbeat does not hide a node.
const LiveNodeWindow = 4 * DefaultHeartbeatInterval

// maintenanceLease is the control store lease whose holder runs the housekeeping, so that one
// node of a fleet does it rather than all of them at once.
const maintenanceLease = "maintenance"

// pruneEvery is how often the holder of the maintenance lease prunes old audit events, counts
// and nodes; expiring runs at every maintenance.
const pruneEvery = time.Hour

// Options configure a Runtime. Store, Limiter, Files and NodeID are required.
type Options struct {
	// Store is the control store.
	Store control.Store
	// Limiter is the node's limiter, whose policy the Runtime sets.
	Limiter *sluice.Limiter
	// Files is the policy files at start; SetFiles replaces them.
	Files *policy.Files
	// FilesPath is the files' path as the audit log names them (actor "file:PATH"); empty for
	// a built-in policy, whose changes are not audited.
	FilesPath string
	// NodeID identifies the node in heartbeats; Addr is the address it reports (its HTTP
	// listener).
	NodeID, Addr string
	// Stats, when set, returns the node's live statistics (telemetry/fleetstats, JSON) for each
	// heartbeat to carry.
	Stats func() []byte
	// Metrics receives sluice_control_store_up and the policy version; nil records nothing.
	Metrics Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock that exemption expiry is compiled against; time.Now when nil.
	Now func() time.Time

	// Intervals and bounds; zero takes the default of the same name.
	PollInterval        time.Duration
	HeartbeatInterval   time.Duration
	MaintenanceInterval time.Duration
	Timeout             time.Duration
	MaxLoadTimeout      time.Duration
	AuditRetention      time.Duration
	CountsRetention     time.Duration
	NodeRetention       time.Duration
	// TrustInterval is how often trusted identities' violation minutes are counted again
	// (adaptive limits, trust.go).
	TrustInterval time.Duration
}

// Runtime keeps a Limiter on the files and the control store compiled together. Its methods
// are safe for concurrent use.
type Runtime struct {
	o   Options
	log *slog.Logger
	now func() time.Time

	// loadMu serializes reading the store and installing what was read, so that an older
	// read never replaces a newer one. It is held across I/O, but only by the Runtime's own
	// goroutines and Sync, never by a check.
	loadMu sync.Mutex
	// loadTimeout is how long the next Load may go without progress, guarded by loadMu: it
	// stretches when a store that answers stalls, so that a slow read is not mistaken for a
	// store that is down.
	loadTimeout time.Duration
	// mu guards the fields below: what the snapshot is compiled from. It is never held across
	// I/O.
	mu      sync.Mutex
	files   *policy.Files
	held    *held       // nil until the store was read once
	pending *filesEvent // a files change not yet in the audit log
	logged  int64       // the control version whose skipped entries were logged
	// violations holds the violation minutes of trusted identities (trust.go), compiled
	// into adaptive limits.
	violations map[trustID]int
	// domains keeps the store's Envoy domains as last compiled, so that a change parses
	// only the domains it changed.
	domains policy.DomainCache

	up      atomic.Bool
	started atomic.Bool // the store answered or failed at least once
	lastErr atomic.Pointer[storeError]

	swapped   chan struct{} // a swap happened: heartbeat now
	expiry    chan struct{} // the snapshot's next expiry may have changed
	auditNow  chan struct{} // a files change waits for its audit event
	trustNow  chan struct{} // the identities may have changed: count violations again
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// storeError is the last failure of the store and since when it has been failing.
type storeError struct {
	err   error
	since time.Time
}

// filesEvent is a change of the policy files to record in the audit log.
type filesEvent struct {
	path, version, trigger string
	rules                  int
}

// Metrics is what the follower reports; telemetry/metrics.Metrics implements it. The
// follower declares it so that the control plane never imports telemetry.
type Metrics interface {
	// ControlStoreUp reports whether the control store answered the last read.
	ControlStoreUp(up bool)
	// PolicyLoaded reports the version of the policy swapped in, or why a load failed.
	PolicyLoaded(version string, err error)
}

// noMetrics records nothing.
type noMetrics struct{}

func (noMetrics) ControlStoreUp(bool)        {}
func (noMetrics) PolicyLoaded(string, error) {}

// New returns a Runtime and sets the Limiter's policy to the files compiled alone, at control
// version 0, until Start has read the control store.
func New(o Options) (*Runtime, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("controlplane: no control store")
	case o.Limiter == nil:
		return nil, errors.New("controlplane: no limiter")
	case o.Files == nil:
		return nil, errors.New("controlplane: no policy files")
	}
	if err := (control.Node{ID: o.NodeID, Addr: o.Addr}).Validate(); err != nil {
		return nil, fmt.Errorf("controlplane: node: %w", err)
	}
	defaults := []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&o.PollInterval, DefaultPollInterval}, {&o.HeartbeatInterval, DefaultHeartbeatInterval},
		{&o.MaintenanceInterval, DefaultMaintenanceInterval}, {&o.Timeout, DefaultTimeout},
		{&o.MaxLoadTimeout, DefaultMaxLoadTimeout},
		{&o.AuditRetention, DefaultAuditRetention}, {&o.CountsRetention, DefaultCountsRetention},
		{&o.NodeRetention, DefaultNodeRetention}, {&o.TrustInterval, DefaultTrustInterval},
	}
	for _, d := range defaults {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	o.MaxLoadTimeout = max(o.MaxLoadTimeout, o.Timeout)
	if o.Metrics == nil {
		o.Metrics = noMetrics{}
	}
	r := &Runtime{
		o: o, log: o.Logger, now: o.Now, files: o.Files, loadTimeout: o.Timeout,
		swapped: make(chan struct{}, 1), expiry: make(chan struct{}, 1), auditNow: make(chan struct{}, 1),
		trustNow: make(chan struct{}, 1),
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	if o.FilesPath != "" {
		r.pending = newFilesEvent(o.FilesPath, o.Files, "start")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.compileLocked("start"); err != nil {
		return nil, err
	}
	return r, nil
}

func newFilesEvent(path string, f *policy.Files, trigger string) *filesEvent {
	return &filesEvent{path: path, version: f.Version, trigger: trigger, rules: len(f.Snapshot().Rules())}
}

// Start reads the control store once, so that a node whose store answers starts on the whole
// policy; then it follows the store in the background until ctx ends or Close. A store that
// does not answer is not an error: the node starts on its files after about two Timeouts (the
// read's and the probe's, see read) and catches up when the store answers. A store that
// answers but is large holds Start until it is read.
func (r *Runtime) Start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.load(ctx, "start")
	r.o.Metrics.ControlStoreUp(r.up.Load())
	r.wg.Add(4)
	go func() { defer r.wg.Done(); r.follow(ctx) }()
	go func() { defer r.wg.Done(); r.heartbeats(ctx) }()
	go func() { defer r.wg.Done(); r.maintenance(ctx) }()
	go func() { defer r.wg.Done(); r.trust(ctx) }()
}

// Close stops the background work and waits for it. It does not close the store.
func (r *Runtime) Close() {
	r.closeOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
		r.wg.Wait()
	})
}

// SetFiles replaces the policy files (a reload), compiles them with the control store's state
// and swaps the result in. The change is written to the audit log with actor "file:PATH" as
// soon as the store answers. trigger says what caused the reload, for the audit event's reason.
func (r *Runtime) SetFiles(f *policy.Files, trigger string) error {
	if f == nil {
		return errors.New("controlplane: no policy files")
	}
	r.mu.Lock()
	old := r.files
	r.files = f
	err := r.compileLocked("files " + trigger)
	if err != nil {
		r.files = old
	} else if r.o.FilesPath != "" && f.Version != old.Version {
		r.pending = newFilesEvent(r.o.FilesPath, f, trigger)
	}
	r.mu.Unlock()
	if err == nil {
		notify(r.auditNow)
	}
	return err
}

// Sync makes sure the node enforces control version v or a later one: it reads the store now
// unless it has already. The admin API calls it after a change, so that the node that made
// the change enforces it before it answers (the other nodes follow within a second).
func (r *Runtime) Sync(ctx context.Context, v int64) error {
	if r.ControlVersion() >= v {
		return nil
	}
	if err := r.load(ctx, "sync"); err != nil {
		return err
	}
	if got := r.ControlVersion(); got < v {
		return fmt.Errorf("controlplane: the control store is at version %d, below %d", got, v)
	}
	return nil
}

// ControlVersion returns the control version of the snapshot the Limiter enforces.
func (r *Runtime) ControlVersion() int64 { return r.o.Limiter.Policy().ControlVersion() }

// PolicyVersion returns the policy version that control version v gives with the node's
// current files: policy.Version(files version, v). The admin API reports it for a change
// (header Sluice-Policy-Version) and for each node's heartbeat.
func (r *Runtime) PolicyVersion(v int64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return policy.Version(r.files.Version, v)
}

// Up reports whether the control store answered the last call made to it.
func (r *Runtime) Up() bool { return r.up.Load() }

// Health answers nil while the control store answers, and otherwise says since when it has
// not and which policy the node keeps enforcing: the check of /readyz's "control_store",
// which is optional since the node still decides.
func (r *Runtime) Health(context.Context) error {
	if r.up.Load() {
		return nil
	}
	msg := "not reached yet"
	if e := r.lastErr.Load(); e != nil {
		msg = fmt.Sprintf("down since %s: %v", e.since.UTC().Format(time.RFC3339), e.err)
	}
	return fmt.Errorf("%s; enforcing policy %s", msg, r.o.Limiter.Policy().Version)
}

// Files returns the policy files in force.
func (r *Runtime) Files() *policy.Files {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.files
}

// notify signals ch without blocking; a signal already pending stands for both.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// compileLocked compiles the files with the state as of now and swaps the snapshot in.
// r.mu is held.
func (r *Runtime) compileLocked(why string) error {
	var st *policy.State
	if r.held != nil {
		st = r.held.state()
	}
	snap, skipped := policy.CompileWith(r.files, st, r.now(), policy.WithViolationMinutes(r.violationMinutes), policy.WithDomainCache(&r.domains))
	return r.swapLocked(snap, skipped, why)
}

// swapLocked swaps snap in, logging the control store's entries it left out once per
// control version. r.mu is held.
func (r *Runtime) swapLocked(snap *policy.Snapshot, skipped []error, why string) error {
	if r.held != nil && r.held.version != r.logged {
		r.logged = r.held.version
		for _, err := range skipped {
			r.log.Warn("control store entry not applied", "err", err)
		}
	}
	prev := r.o.Limiter.Policy()
	if err := r.o.Limiter.SetPolicy(snap); err != nil {
		return err
	}
	r.o.Metrics.PolicyLoaded(snap.Version, nil)
	if prev.Version != snap.Version {
		r.log.Info("policy swapped", "why", why, "version", snap.Version, "previous", prev.Version,
			"rules", len(snap.Rules()), "identities", snap.Identities())
	}
	notify(r.swapped)
	notify(r.expiry)
	return nil
}

// setUp records the outcome of a call to the store.
func (r *Runtime) setUp(err error) {
	up := err == nil
	if !up {
		e := &storeError{err: err, since: r.now()}
		if old := r.lastErr.Load(); old != nil && !r.up.Load() && r.started.Load() {
			e.since = old.since
		}
		r.lastErr.Store(e)
	}
	first := !r.started.Swap(true)
	if was := r.up.Swap(up); was == up && !first {
		return
	}
	r.o.Metrics.ControlStoreUp(up)
	if up {
		r.log.Info("control store up", "enforcing", r.o.Limiter.Policy().Version)
	} else {
		r.log.Warn("control store down; enforcing the last policy compiled and retrying", "policy", r.o.Limiter.Policy().Version, "err", err)
	}
}

// load reads the store's state and installs it.
func (r *Runtime) load(ctx context.Context, why string) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	if done, err := r.loadChanges(ctx, why); done {
		if err != nil {
			return fmt.Errorf("controlplane: load changes: %w", err)
		}
		return nil
	}
	st, err := r.read(ctx)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return err // shutting down: not the store's fault
	}
	r.setUp(err)
	if err != nil {
		return fmt.Errorf("controlplane: load: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != nil && r.held.version == st.Version {
		return nil // same contents; expiries are the expiry timer's
	}
	r.held = newHeld(st)
	notify(r.trustNow)
	return r.compileLocked(why)
}

// read runs Load with a deadline on its progress: each part the store reports read
// (control.ReportProgress) gives it loadTimeout more, so that a store larger than one deadline
// is read whole, while one that hangs is cut off loadTimeout after it last moved (a store that
// reports nothing is held to loadTimeout for the whole read). A Load cut off is not taken as
// the store being down until the store fails a probe too (Version, bounded by Timeout): while
// the store answers, the deadline doubles and the Load runs again, up to MaxLoadTimeout. After
// a success the deadline halves back towards Timeout. r.loadMu is held.
func (r *Runtime) read(ctx context.Context) (*control.State, error) {
	for {
		timeout := r.loadTimeout
		stalled := fmt.Errorf("no progress within %v: %w", timeout, context.DeadlineExceeded)
		lctx, cancel := context.WithCancelCause(ctx)
		watchdog := time.AfterFunc(timeout, func() { cancel(stalled) })
		st, err := r.o.Store.Load(control.WithProgress(lctx, func() { watchdog.Reset(timeout) }))
		watchdog.Stop()
		cause := context.Cause(lctx)
		cancel(nil)
		if err == nil {
			r.loadTimeout = max(r.o.Timeout, timeout/2)
			return st, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if cause == stalled {
			err = fmt.Errorf("%w (%w)", err, stalled)
		} else if !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if timeout >= r.o.MaxLoadTimeout {
			return nil, err
		}
		pctx, pcancel := context.WithTimeout(ctx, r.o.Timeout)
		_, perr := r.o.Store.Version(pctx)
		pcancel()
		if perr != nil {
			return nil, err
		}
		r.loadTimeout = min(2*timeout, r.o.MaxLoadTimeout)
		r.log.Info("control store answers but its read stalled; reading again with a longer deadline",
			"deadline", timeout, "next_deadline", r.loadTimeout, "err", err)
	}
}

// heldVersion is the control version of the state last read, or -1 before any.
func (r *Runtime) heldVersion() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil {
		return -1
	}
	return r.held.version
}

// follow reads the store when its Watch announces a newer version or its version differs
// from the one held at a poll, and compiles again when an exemption expires.
func (r *Runtime) follow(ctx context.Context) {
	watch := r.o.Store.Watch(ctx)
	poll := time.NewTicker(r.o.PollInterval)
	defer poll.Stop()
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-watch:
			if !ok {
				watch = nil // the store closed: polls go on failing until ctx ends
				continue
			}
			if v > r.heldVersion() {
				r.load(ctx, "change")
			}
		case <-poll.C:
			r.poll(ctx)
		case <-r.expiry:
			if next := r.o.Limiter.Policy().NextExpiry(); !next.IsZero() {
				expiry.Reset(max(0, next.Sub(r.now())))
			} else {
				expiry.Stop()
			}
		case <-expiry.C:
			r.mu.Lock()
			r.compileLocked("exemption expiry")
			r.mu.Unlock()
		}
	}
}

// poll compares the store's version with the one held, and reads the store when they differ
// (a lost notification, or the store coming back).
func (r *Runtime) poll(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	v, err := r.o.Store.Version(cctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		r.setUp(err)
		return
	}
	if v != r.heldVersion() {
		r.load(ctx, "poll")
		return
	}
	r.setUp(nil)
}

// heartbeats reports the node and the control version it enforces: at once after a swap, and
// every HeartbeatInterval.
func (r *Runtime) heartbeats(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.swapped:
		}
		n := control.Node{ID: r.o.NodeID, Addr: r.o.Addr, PolicyVersion: r.ControlVersion()}
		if r.o.Stats != nil {
			n.Stats = r.o.Stats()
		}
		cctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
		err := r.o.Store.Heartbeat(cctx, n)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.Debug("control store heartbeat failed", "err", err)
		}
		t.Reset(r.o.HeartbeatInterval)
	}
}

// maintenance writes the pending audit event of a files change, and on the node holding the
// maintenance lease expires overrides and exemptions and prunes what is past retention.
func (r *Runtime) maintenance(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	var lastPrune time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.auditNow:
			r.recordFiles(ctx)
			continue
		case <-t.C:
		}
		t.Reset(r.o.MaintenanceInterval)
		if !r.up.Load() {
			continue
		}
		r.recordFiles(ctx)
		if r.housekeep(ctx, time.Since(lastPrune) >= pruneEvery) {
			lastPrune = time.Now()
		}
	}
}

// housekeep expires, and prunes when prune is set, if this node holds the maintenance lease.
// It reports whether it pruned.
func (r *Runtime) housekeep(ctx context.Context, prune bool) bool {
	ctx, cancel := context.WithTimeout(ctx, 4*r.o.Timeout)
	defer cancel()
	held, err := r.o.Store.AcquireLease(ctx, maintenanceLease, r.o.NodeID, 3*r.o.MaintenanceInterval)
	if err != nil || !held {
		return false
	}
	if n, v, err := r.o.Store.Expire(ctx); err != nil {
		r.log.Warn("control store: expiring overrides and exemptions failed", "err", err)
	} else if n > 0 {
		r.log.Info("control store: expired overrides and exemptions", "count", n, "control_version", v)
	}
	if !prune {
		return false
	}
	now := r.now()
	for _, p := range []struct {
		what  string
		keep  time.Duration
		prune func(context.Context, time.Time) (int64, error)
	}{
		{"audit events", r.o.AuditRetention, r.o.Store.PruneAudit},
		{"usage and violation counts", r.o.CountsRetention, r.o.Store.PruneCounts},
		{"nodes", r.o.NodeRetention, r.o.Store.PruneNodes},
	} {
		n, err := p.prune(ctx, now.Add(-p.keep))
		if err != nil {
			r.log.Warn("control store: pruning failed", "what", p.what, "err", err)
			return false
		}
		if n > 0 {
			r.log.Info("control store: pruned", "what", p.what, "count", n, "older_than", p.keep)
		}
	}
	return true
}

// filesState is the audit log's before and after of a policy-files change.
type filesState struct {
	Version string `json:"version"`
	Rules   int    `json:"rules"`
}

// recordFiles writes the pending files change to the audit log, unless the last event of the
// same files already records this version: a node restarting on the same files, or the other
// nodes of a fleet reloading a change that one of them recorded, add nothing.
func (r *Runtime) recordFiles(ctx context.Context) {
	r.mu.Lock()
	p := r.pending
	r.mu.Unlock()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	last, err := r.o.Store.Audit(ctx, control.AuditFilter{Kind: control.KindPolicyFiles, Target: p.path, Limit: 1})
	if err != nil {
		return // retried at the next maintenance
	}
	var before json.RawMessage
	if len(last) > 0 {
		var prev filesState
		if json.Unmarshal(last[0].After, &prev) == nil && prev.Version == p.version {
			r.clearPending(p)
			return
		}
		before = last[0].After
	}
	after, _ := json.Marshal(filesState{Version: p.version, Rules: p.rules})
	_, err = r.o.Store.AppendAudit(ctx, control.AuditEvent{
		Actor: "file:" + p.path, Action: control.ActionUpdate, Kind: control.KindPolicyFiles,
		Target: p.path, Before: before, After: after,
		Reason: fmt.Sprintf("policy files loaded on node %s (%s)", r.o.NodeID, p.trigger),
	})
	if err != nil {
		r.log.Warn("control store: auditing the policy files failed; retrying", "err", err)
		return
	}
	r.clearPending(p)
}

// clearPending forgets p unless a newer change replaced it meanwhile.
func (r *Runtime) clearPending(p *filesEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == p {
		r.pending = nil
	}
}
