// Package region makes rules with regions: global one limit across regions that never wait on
// each other, and forwards the decisions of rules with regions: home:NAME to their home
// region (docs/architecture.md, Regions).
//
// A Region wraps a region's store. Every --region-sync it reads its region's counts of the
// global rules' keys from the store (exact within the region, so all nodes of a region agree)
// and sends those that changed to every other region (Sync); it keeps what the others send. A
// global op is then decided by the region's own store against the limit less the others' last
// counts and a reservation of their in-flight demand: their recent rate × (sync interval +
// measured one-way delay). That is one in-process lookup per op and still one store round trip
// per request: a decision never waits on a peer.
package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// Config is a region node's configuration: the serve flags --region, --regions, --region-sync
// and --region-timeout. The links' own settings (--region-ca, --region-token-file) are the
// transport's (transport/regionrpc).
type Config struct {
	// Name is this region's name (--region).
	Name string
	// Peers maps every other region's name to the address of a node or load balancer there
	// (--regions), as the Dialer given to Start understands it.
	Peers map[string]string
	// Sync is how often counts are sent (--region-sync, default 100ms).
	Sync time.Duration
	// Timeout is how long a peer may stay silent before it counts as down (--region-timeout,
	// default 5s). A down peer's last rate is assumed meanwhile.
	Timeout time.Duration
	// Log receives peer state changes.
	Log *slog.Logger
	// Now is the clock (default time.Now); tests drive it.
	Now func() time.Time
	// Resend is how often all tracked counts are sent to each peer, not only those that
	// changed (default 30s): what a peer's node missed (a trimmed inbox, a restart) is made
	// good within it.
	Resend time.Duration
	// NoReservation turns the reservation off: the naive merge, for comparisons only.
	NoReservation bool
}

// Reader is what the sync needs of the region's own store, unguarded: the memory and Redis
// stores implement it.
type Reader interface {
	store.StateReader
	store.KeyDirectory
}

// Region is one node's part in the regions: a store.Store over the region's store, and the
// sync with the other regions through the links a Dialer makes (Start). What the other regions
// call on this node, Receive and Decide, a transport serves (transport/regionrpc).
type Region struct {
	cfg    Config
	inner  store.Store
	reader Reader
	now    func() time.Time
	log    *slog.Logger
	// noShare turns off remote's share of what is left: the simulation compares with it.
	noShare bool

	source atomic.Pointer[func() *policy.Snapshot]
	rules  atomic.Pointer[ruleSet]
	rulesM sync.Mutex // serialises rebuilds of rules

	peers  []*peer // sorted by name; index i is the table's peer i
	byName map[string]int
	table  table
	local  local

	// inbox is the region's shared log of received Syncs, nil when the store keeps none
	// (Inbox); nodeID marks this node's records in it. Sync queues records on inboxQ, and
	// counts in inboxDropped those the full queue refused.
	inbox        Inbox
	nodeID       uint64
	inboxQ       chan []byte
	inboxDropped atomic.Int64
	// inboxLost counts, for sluice_region_inbox_lost_total, the Syncs this node received that
	// did not reach the inbox (queue full or append failed), by reason; inboxSkipped the
	// records read from it that did not read or check.
	inboxLostQueue, inboxLostAppend, inboxSkipped atomic.Uint64

	scratch sync.Pool // *scratch

	stop chan struct{}
	kick chan struct{} // a sync now: a peer's link is ready again
	done sync.WaitGroup
	once sync.Once
}

// New returns the Region of a node over inner, its region's store as the limiter uses it
// (guards included), and reader, the same store unguarded. policy returns the policy in force
// (sluice.Limiter.Policy); nil until UsePolicy sets it, when no rule spans regions. Start
// begins the sync.
func New(cfg Config, inner store.Store, reader Reader, pol func() *policy.Snapshot) (*Region, error) {
	if msg := policy.ValidRegionName(cfg.Name); msg != "" {
		return nil, fmt.Errorf("--region: %s", msg)
	}
	if cfg.Sync <= 0 {
		cfg.Sync = 100 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Resend <= 0 {
		cfg.Resend = defaultResend
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Region{cfg: cfg, inner: inner, reader: reader, now: cfg.Now, log: cfg.Log,
		byName: map[string]int{}, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	if pol != nil {
		r.UsePolicy(pol)
	}
	names := make([]string, 0, len(cfg.Peers))
	for name, addr := range cfg.Peers {
		if msg := policy.ValidRegionName(name); msg != "" {
			return nil, fmt.Errorf("--regions: %s", msg)
		}
		if name == cfg.Name {
			return nil, fmt.Errorf("--regions: %s is this region (--region); list the other regions only", name)
		}
		if addr == "" {
			return nil, fmt.Errorf("--regions: %s has no address", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		r.peers = append(r.peers, &peer{name: name, addr: cfg.Peers[name]})
		r.byName[name] = i
	}
	r.table.init(len(r.peers))
	r.local.init()
	if ib, ok := reader.(Inbox); ok {
		r.inbox, r.nodeID, r.inboxQ = ib, newNodeID(), make(chan []byte, inboxQueue)
	}
	r.scratch.New = func() any { return new(scratch) }
	return r, nil
}

// UsePolicy sets where the policy in force is read: the limiter's, which its store (this
// Region) is created before.
func (r *Region) UsePolicy(pol func() *policy.Snapshot) { r.source.Store(&pol) }

// Peers returns the other regions' names.
func (r *Region) Peers() []string {
	names := make([]string, len(r.peers))
	for i, p := range r.peers {
		names[i] = p.name
	}
	return names
}

// Name returns the region's name.
func (r *Region) Name() string { return r.cfg.Name }

// nowMicros is the region's clock in µs since the Unix epoch.
func (r *Region) nowMicros() int64 { return r.now().UnixMicro() }

// ruleInfo is what the region needs of a global or home rule.
type ruleInfo struct {
	name   string
	mode   policy.RegionMode
	home   string
	kind   algorithm.Kind
	period int64 // µs, the longest of the rule's limits (tiers included)
}

// ruleSet is the region rules of one policy snapshot, by key head.
type ruleSet struct {
	snap   *policy.Snapshot
	byHead map[string]*ruleInfo
}

// rulesNow returns the region rules of the policy in force, rebuilt when it changed.
func (r *Region) rulesNow() *ruleSet {
	var snap *policy.Snapshot
	if src := r.source.Load(); src != nil {
		snap = (*src)()
	}
	if rs := r.rules.Load(); rs != nil && rs.snap == snap {
		return rs
	}
	r.rulesM.Lock()
	defer r.rulesM.Unlock()
	if rs := r.rules.Load(); rs != nil && rs.snap == snap {
		return rs
	}
	rs := &ruleSet{snap: snap, byHead: map[string]*ruleInfo{}}
	if snap != nil {
		for _, c := range snap.RegionRules() {
			mode, home := c.Regions()
			info := &ruleInfo{name: c.Name, mode: mode, home: home, kind: c.Algorithm, period: c.MaxPeriod().Microseconds()}
			rs.byHead[string(c.Head())] = info
		}
		// Envoy-format limits with regions, by the head of their keys (policy.AppendEnvoyHead).
		for _, lim := range snap.EnvoyRegionLimits() {
			info := &ruleInfo{name: lim.Label(), mode: policy.RegionGlobal, kind: lim.Params.Kind, period: lim.Period.Microseconds()}
			if home, ok := lim.HomeRegion(); ok {
				info.mode, info.home = policy.RegionHome, home
			}
			rs.byHead[string(policy.AppendEnvoyHead(nil, lim))] = info
		}
	}
	r.rules.Store(rs)
	return rs
}

// headOf returns the part of a bucket key that names its rule, sl:<name>:<version>, or its
// Envoy-format limit, sl:@<domain>:<id>: parts escape ':', so it ends at the key's third ':'.
func headOf(k []byte) []byte {
	n := 0
	for i, c := range k {
		if c == ':' {
			if n++; n == 3 {
				return k[:i]
			}
		}
	}
	return k
}

// scratch is the per-call bookkeeping of Apply, pooled so that a check allocates nothing.
type scratch struct {
	params []algorithm.Params
	orig   []*algorithm.Params
	global []int // indexes of adjusted ops
	home   []int // indexes of ops forwarded home
}

// Apply decides b (store.Store). Global ops are decided by the region's store against their
// limit less the other regions' share (see the package comment); ops of rules homed in another
// region are decided there first, and the rest of the batch then looks (consumes nothing) if
// the home denied.
func (r *Region) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	rs := r.rulesNow()
	if len(rs.byHead) == 0 {
		return r.inner.Apply(ctx, b, results)
	}
	sc := r.scratch.Get().(*scratch)
	defer r.scratch.Put(sc)
	sc.global, sc.home, sc.orig = sc.global[:0], sc.home[:0], sc.orig[:0]
	if cap(sc.params) < len(b.Ops) {
		sc.params = make([]algorithm.Params, len(b.Ops))
	}
	sc.params = sc.params[:len(b.Ops)]
	now := r.nowMicros()
	for i := range b.Ops {
		op := &b.Ops[i]
		info := rs.byHead[string(headOf(op.Key))]
		if info == nil || op.Counter {
			continue
		}
		switch info.mode {
		case policy.RegionGlobal:
			if op.Cost > 0 {
				r.local.touch(op.Key, info)
			}
			remote := r.remote(op.Key, op.Params, now)
			if remote <= 0 {
				continue
			}
			p := &sc.params[i]
			*p = *op.Params
			p.Limit = max(0, p.Limit-remote)
			p.Burst = p.Limit
			sc.global = append(sc.global, i)
			sc.orig = append(sc.orig, op.Params)
			op.Params = p
		case policy.RegionHome:
			if info.home != r.cfg.Name {
				sc.home = append(sc.home, i)
			}
		}
	}
	defer func() {
		for j, i := range sc.global {
			b.Ops[i].Params = sc.orig[j]
		}
	}()
	if len(sc.home) > 0 {
		return r.applyHome(ctx, b, results, sc, rs)
	}
	replayed, err := r.inner.Apply(ctx, b, results)
	if err == nil {
		r.fixResults(b, results, sc, now)
	}
	return replayed, err
}

// fixResults turns the "cost exceeds capacity" of an op denied by its lowered limit into a
// plain denial: the cost fits the rule, only not now, in this window.
func (r *Region) fixResults(b *store.Batch, results []algorithm.Result, sc *scratch, now int64) {
	for j, i := range sc.global {
		res, orig := &results[i], sc.orig[j]
		if res.Reason == algorithm.ReasonCostExceedsCapacity && b.Ops[i].Cost <= orig.Limit {
			res.Reason = algorithm.ReasonNone
			res.RetryAfter = res.ResetAfter
			if res.RetryAfter <= 0 {
				res.RetryAfter = orig.Period - now%orig.Period
			}
		}
	}
}

// Reset drops the state of keys in the region's store (store.Store). Global keys are reset in
// this region only: the others' counts are grow-only.
func (r *Region) Reset(ctx context.Context, keys [][]byte) error { return r.inner.Reset(ctx, keys) }

// Close stops the sync and closes the inner store.
func (r *Region) Close() error {
	r.Stop()
	return r.inner.Close()
}

// Stop stops the sync and closes the peer connections, leaving the store open.
func (r *Region) Stop() {
	r.once.Do(func() {
		close(r.stop)
		r.done.Wait()
		for _, p := range r.peers {
			p.close()
		}
	})
}

// Ping reports whether the inner store answers, when it can tell (for /readyz).
func (r *Region) Ping(ctx context.Context) error {
	if p, ok := r.inner.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return nil
}

// errNoPeer is returned for a home region that --regions does not list.
var errNoPeer = errors.New("home region not in --regions")
