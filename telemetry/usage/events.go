// Package events counts decisions off the hot path (docs/architecture.md, Violations and
// usage): each node adds up, per minute, every decision per (rule, tenant) and the denied and
// soft ones per (rule, identity), and writes the sums to the control store every few seconds,
// where every node's counts add up to the fleet's.
//
// What is counted, precisely:
//
//   - A decision is a Check (HTTP POST /v1/check, gRPC Check, cost >= 1) or an Envoy
//     ShouldRateLimit. Looks are not decisions: /v1/quota, GetQuota, a cost of 0, and an RLS
//     descriptor whose hits_addend is 0.
//   - Each limit that applied counts once under its rule: a request three rules match adds one
//     to each of the three rules' rows. A limit's outcome is its own, exclusive: allowed
//     (state normal), soft (allowed past its soft threshold or inside the hard threshold's
//     tolerance) or denied (state hard, bans included). So allowed + soft + denied is the
//     number of decisions the rule took part in, and one limit that denies makes the other
//     limits of that request count as what they alone decided, though all-or-nothing
//     consumed nothing from them.
//   - Besides, each request counts once under DecisionRule (rule "", what
//     GET /admin/v1/usage/history reads without rule=), by its final state over all its
//     limits: denied if any denied it, soft if allowed and any was soft, else allowed.
//   - Not counted: exempt requests (allowed and not counted, as exemptions are defined),
//     requests no limit applies to, shadow limits (they decide nothing; sluice_checks_total
//     with mode="shadow" shows what they would have done), idempotent replays (the first
//     decision was counted), and RLS per-request limit overrides (they have no rule to count
//     under).
//   - The tenant and user are those decided for (identity assignments applied). An API key
//     is kept as its hashed prefix (HashAPIKey), never as the key. RLS limits count under
//     their name, else "domain/id", with tenant "" and, for violations, the descriptor's
//     remote_address entry as the ip.
//   - The minute is the recorder's clock when it takes the decision from its queue,
//     microseconds to milliseconds after the decision.
//
// The hot path pays one non-blocking send of a fixed-size struct on a buffered channel per
// decision (two or more only past MaxResults limits): no allocation, no lock beyond the
// channel's, no I/O. A full queue drops the event and counts it (Stats.Dropped,
// sluice_events_dropped_total); a decision never waits for the recorder.
package usage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Defaults of Options.
const (
	// DefaultFlush is how often counts are written (--events-flush), and so the most a node
	// killed outright (SIGKILL, OOM) loses: about a second of its counts (issue 29). Each
	// flush is one transaction of every row gathered (AddCounts, in chunks), and none when
	// nothing was counted, so a fleet of N busy nodes writes N transactions a second.
	DefaultFlush = time.Second
	// DefaultQueue is the queue's length in events (--events-queue): 16 MB of 248-byte
	// events, emptied every DefaultPoll; it absorbs the gatherer being descheduled for
	// hundreds of milliseconds at a node's peak rate.
	DefaultQueue = 1 << 16
	// DefaultMaxRows caps the rows held unwritten (per minute, rule and tenant or identity),
	// in the counts being gathered and in those the store has not taken yet: at ~300 bytes a
	// row, under 200 MB each. Only a control store down for long, or an attack spraying
	// identities, reaches it; the counts past it are lost and counted (Stats.Lost).
	DefaultMaxRows = 500_000
	// DefaultWriteTimeout bounds one write to the control store.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultPoll is how often the queue is emptied. DefaultQueue events per DefaultPoll is
	// far above what a node decides, and far below what the gatherer takes (BenchmarkRecord;
	// docs/measurements.md).
	DefaultPoll = 10 * time.Millisecond
)

// Writer takes the counts of one flush. A Writer whose error wraps ErrRefused will never
// take those counts (they are invalid); the recorder drops them rather than retry. Any other
// error is retried with the next flush.
type Writer interface {
	WriteCounts(ctx context.Context, usage []UsageCount, violations []ViolationCount) error
}

// ErrRefused, wrapped by a Writer's error, says that the counts will never be taken.
var ErrRefused = errors.New("counts refused")

// DecisionRule is UsageCount.Rule of a per-decision count: each request once, by its final
// state, whatever rules it matched (control.DecisionRule).
const DecisionRule = ""

// UsageCount is one node's decisions of one minute for one rule and tenant ("" for requests
// without a tenant).
type UsageCount struct {
	Minute                time.Time
	Rule, Tenant          string
	Allowed, Denied, Soft int64
}

// ViolationCount is the denied and soft decisions of one minute for one rule and identity.
type ViolationCount struct {
	Minute                                   time.Time
	Rule, Tenant, User, APIKey, IP, Endpoint string
	Denied, Soft                             int64
	// Limit is the rule's effective limit when it was counted: its limit per period after a
	// tier or override, as an Envoy limit's requests_per_unit, not a bucket's burst.
	Limit int64
}

// The longest rule name and attribute value a row keeps, in characters: the control store's
// bounds (control.MaxNameLen and MaxValueLen; node's tests hold them equal). Longer values
// are cut and marked (storable).
const (
	MaxNameLen  = 128
	MaxValueLen = 512
)

// MaxResults is how many limits one event carries. A decision with more sends one event per
// MaxResults limits; requests matched by more than four rules are rare.
const MaxResults = 4

// Options configure a Recorder.
type Options struct {
	// Writer receives the counts; required. In a node it is the control store
	// (node.UsageWriter).
	Writer Writer
	// Flush is the time between writes; DefaultFlush when 0.
	Flush time.Duration
	// Queue is the queue's length in events; DefaultQueue when 0.
	Queue int
	// MaxRows caps the rows held unwritten; DefaultMaxRows when 0.
	MaxRows int
	// WriteTimeout bounds one write; DefaultWriteTimeout when 0.
	WriteTimeout time.Duration
	// Poll is how often the queue is emptied; DefaultPoll when 0. Queue / Poll is the most
	// decisions per second the recorder takes without dropping.
	Poll time.Duration
	// Now stamps each event's minute; time.Now when nil. Tests inject a clock.
	Now    func() time.Time
	Logger *slog.Logger
	// Observe, when set, sees each limit's outcome as it is counted, on the gathering
	// goroutine (off the hot path); it must be quick, or the queue fills and drops. The
	// dashboard's live statistics (telemetry/fleetstats) are fed this way.
	Observe func(Observation)
	// TenantThrottle, when set, is called by the writer with each hand-over's throttle ratio
	// (denied and soft over all decisions, every rule together) of the TopTenants tenants with
	// the most throttled decisions in it: bounded, so a metric labelled by tenant stays small
	// however many tenants there are.
	TenantThrottle func(map[string]float64)
}

// Outcome is what one limit decided, exclusive, as the counts have it.
type Outcome uint8

// The outcomes of a limit.
const (
	OutcomeAllowed = Outcome(allowed)
	OutcomeSoft    = Outcome(soft)
	OutcomeDenied  = Outcome(denied)
)

// Observation is one limit's outcome of one counted decision, for Options.Observe. APIKey is
// the hashed prefix (HashAPIKey), never the key. At is when the recorder counted it (one
// clock read per decision rather than one per limit: a read is not free on a VM); an
// observer takes its own clock when At is zero.
type Observation struct {
	Rule, Tenant, User, APIKey, IP string
	Outcome                        Outcome
	At                             time.Time
}

// TopTenants bounds the tenants Options.TenantThrottle reports.
const TopTenants = 20

// outcome is what one limit decided, exclusive: allowed, soft or denied.
type outcome uint8

const (
	allowed outcome = iota
	soft
	denied
)

// result is one limit's part of an event. envoy names an RLS limit without a name: its
// "domain/id" is built off the hot path, from this pointer into the immutable configuration.
type result struct {
	rule    string
	envoy   *envoyconf.Limit
	limit   int64
	outcome outcome
}

// event is what the hot path queues: strings are headers of immutable strings (the request's
// attributes, which the RLS decoder takes from one copy of the whole request; rule names from
// the policy), so queuing copies no bytes and allocates nothing. add copies those a new row
// keeps.
type event struct {
	tenant, user, apiKey, ip, endpoint string
	n                                  uint8
	// last marks a request's last event (its only one up to MaxResults limits), which
	// carries final, the request's own state over all its limits: it is counted once
	// under DecisionRule ("") by add.
	last    bool
	final   outcome
	results [MaxResults]result
}

// worse returns the request's state after one more limit's outcome o: denied if any limit
// denied it, soft if allowed and any was soft, else allowed.
func worse(final, o outcome) outcome { return max(final, o) }

// Recorder counts decisions and writes them to the control store. Its methods are safe for
// concurrent use; a nil *Recorder records nothing, so servers call it unconditionally.
type Recorder struct {
	o       Options
	log     *slog.Logger
	q       chan event
	flushes chan chan error // Flush asks the gatherer to hand over now
	handoff chan handoff    // gatherer → writer
	stop    chan struct{}
	stopped sync.Once
	gDone   chan struct{} // the gatherer has handed over its last counts
	wDone   chan struct{} // the writer has written them
	ctx     context.Context
	cancel  context.CancelFunc

	dropped     atomic.Int64
	lost        atomic.Int64
	writes      atomic.Int64
	writeErrors atomic.Int64
	rows        atomic.Int64
}

// Stats are a Recorder's counters since it started.
type Stats struct {
	// Dropped counts events the full queue refused (sluice_events_dropped_total).
	Dropped int64
	// Lost counts what was gathered but never written, one per limit outcome in the usage
	// counts, one more in the violations and one per request in the per-decision counts: past MaxRows while the store did not take them,
	// refused by it as invalid, or still unwritten at Close (sluice_events_lost_total).
	Lost int64
	// Writes and WriteErrors count writes to the control store (sluice_events_writes_total);
	// Rows, the rows they upserted (sluice_events_rows_written_total): the write load.
	Writes, WriteErrors, Rows int64
	// Queued is the events waiting in the queue now.
	Queued int
}

// New starts a Recorder writing to o.Writer. Close it to write what it holds.
func New(o Options) (*Recorder, error) {
	if o.Writer == nil {
		return nil, errors.New("usage: no writer")
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"flush", &o.Flush, DefaultFlush}, {"write timeout", &o.WriteTimeout, DefaultWriteTimeout}, {"poll", &o.Poll, DefaultPoll}} {
		if *d.v < 0 {
			return nil, fmt.Errorf("events: %s %v: must be > 0", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	for _, n := range []struct {
		name string
		v    *int
		def  int
	}{{"queue", &o.Queue, DefaultQueue}, {"max rows", &o.MaxRows, DefaultMaxRows}} {
		if *n.v < 0 {
			return nil, fmt.Errorf("events: %s %d: must be > 0", n.name, *n.v)
		}
		if *n.v == 0 {
			*n.v = n.def
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Recorder{
		o: o, log: log,
		q:       make(chan event, o.Queue),
		flushes: make(chan chan error),
		handoff: make(chan handoff, 1),
		stop:    make(chan struct{}),
		gDone:   make(chan struct{}),
		wDone:   make(chan struct{}),
		ctx:     ctx, cancel: cancel,
	}
	go r.gather()
	go r.write()
	return r, nil
}

// Check records a native decision d of request req (HTTP or gRPC Check). Call it for checks
// only, not for looks (Quota), and only when the check returned no error.
func (r *Recorder) Check(req *sluice.Request, d *sluice.Decision) {
	if r == nil || d.Exempt || d.Replayed || len(d.Results) == 0 {
		return
	}
	var e event
	e.tenant, e.user = d.Caller()
	e.apiKey, e.ip, e.endpoint = req.APIKey, req.IP, req.Endpoint
	final := allowed
	for i := range d.Results {
		res := &d.Results[i]
		if res.Shadow {
			continue
		}
		if e.n == MaxResults {
			r.send(&e)
			e.n = 0
		}
		o := allowed
		switch {
		case !res.Allowed:
			o = denied
		case res.State == sluice.StateSoft:
			o = soft
		}
		final = worse(final, o)
		p := &e.results[e.n]
		// Quota, not Limit: the violations log has always shown the rule's limit per period,
		// and a bucket's answer now shows its burst as the limit (issue 30).
		p.rule, p.envoy, p.limit, p.outcome = res.Rule, nil, res.Quota, o
		e.n++
	}
	if e.n > 0 {
		e.last, e.final = true, final
		r.send(&e)
	}
}

// Descriptors records an Envoy RLS decision: each descriptor that had a limit of the
// configuration counts as a result, under the caller the request's entries name (tenant, user,
// api_key and ip, Envoy's remote_address included: DescriptorDecision.Caller). An exempt
// caller's request is not recorded, as a native one is not.
func (r *Recorder) Descriptors(req *sluice.DescriptorRequest, d *sluice.DescriptorDecision) {
	if r == nil || d.Exempt {
		return
	}
	var e event
	caller := d.Caller()
	e.tenant, e.user, e.apiKey, e.ip, e.endpoint = caller.Tenant, caller.User, caller.APIKey, caller.IP, caller.Endpoint
	final := allowed
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if !st.HasLimit || st.Limit == nil || st.Limit.Shadow || i >= len(req.Descriptors) {
			continue
		}
		desc := &req.Descriptors[i]
		if desc.HasHitsAddend && desc.HitsAddend == 0 {
			continue // a look
		}
		if e.n == MaxResults {
			r.send(&e)
			e.n = 0
		}
		o := allowed
		if !st.OK {
			o = denied
		}
		final = worse(final, o)
		e.results[e.n] = result{rule: st.Name, envoy: st.Limit, limit: int64(st.RequestsPerUnit), outcome: o}
		e.n++
	}
	if e.n > 0 {
		e.last, e.final = true, final
		r.send(&e)
	}
}

// send queues e, or drops it when the queue is full: a decision never waits.
func (r *Recorder) send(e *event) {
	select {
	case r.q <- *e:
	default:
		r.dropped.Add(1)
	}
}

// Stats returns the recorder's counters.
func (r *Recorder) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	return Stats{Dropped: r.dropped.Load(), Lost: r.lost.Load(), Writes: r.writes.Load(), WriteErrors: r.writeErrors.Load(), Rows: r.rows.Load(), Queued: len(r.q)}
}

// Flush writes everything queued before it was called and returns the write's error. Tests
// and shutdown use it; the recorder flushes on its own every Options.Flush.
func (r *Recorder) Flush(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case r.flushes <- done:
	case <-r.gDone:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errClosed = errors.New("events: recorder closed")

// Close stops the recorder after writing what it holds (the queue drained), waiting for the
// write until ctx ends, when it abandons it. Events recorded after Close are dropped.
func (r *Recorder) Close(ctx context.Context) error {
	if r == nil {
		return nil
	}
	r.stopped.Do(func() { close(r.stop) })
	select {
	case <-r.wDone:
		return nil
	case <-ctx.Done():
		r.cancel()
		<-r.wDone
		return fmt.Errorf("events: close: counts not written: %w", ctx.Err())
	}
}
