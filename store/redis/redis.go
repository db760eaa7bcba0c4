// Package redis is Sluice's Redis store: the same decisions as store/memory, made inside Redis
// by Lua scripts (one file per algorithm, twins of algorithm/*.go) with Redis's own clock, so
// any number of stateless Sluice nodes share exact limits. It works against one Redis, Redis
// Sentinel and Redis Cluster.
//
// One request is one round trip: the ops of each hash slot go in one script call, all calls in
// one pipeline. A single node runs every op in one call, all or nothing. On a Cluster, ops on
// other slots (global and endpoint-wide buckets) are consumed by their own calls and refunded,
// in a second round trip, when a sibling limit denies.
package redis

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// source concatenates the prelude, the six algorithm files, concurrency's and the named entry points, which
// define local functions batch and refund.
func source(entries ...string) string {
	var b strings.Builder
	for _, f := range append([]string{"prelude", "token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "concurrency"}, entries...) {
		src, err := luaFiles.ReadFile("lua/" + f + ".lua")
		if err != nil {
			panic(err) // embedded at build time: cannot happen
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}

// The same code runs two ways. On Redis 7+ it is a Function library, loaded once per node, so
// a call runs only batch (re-running the definitions cost a quarter of each script call, and
// the library keeps parsed parameters between calls). Older servers, or a store built
// WithScripts, run it as EVALSHA scripts.
var (
	batchScript  = rueidis.NewLuaScript(source("batch") + "return batch(KEYS, ARGV)\n")
	multiScript  = rueidis.NewLuaScript(source("batch", "multi") + "return multi(KEYS, ARGV)\n")
	refundScript = rueidis.NewLuaScript(source("refund") + "return refund(KEYS, ARGV)\n")
	adjustScript = rueidis.NewLuaScript(source("batch", "adjust") + "return adjust(KEYS, ARGV)\n")
	leaseScript  = rueidis.NewLuaScript(source("lease") + "return settle_lease(KEYS, ARGV)\n")
	renewScript  = rueidis.NewLuaScript(source("lease") + "return renew_lease(KEYS, ARGV)\n")

	library, batchFunction, multiFunction, refundFunction, adjustFunction, leaseFunction, renewFunction = func() (string, string, string, string, string, string, string) {
		body := source("batch", "multi", "refund", "adjust", "lease")
		sum := sha256.Sum256([]byte(body))
		name := "sluice_" + hex.EncodeToString(sum[:6]) // a new version loads beside the old
		batchFn, multiFn, refundFn := name+"_batch", name+"_multi", name+"_refund"
		adjustFn, leaseFn, renewFn := name+"_adjust", name+"_lease", name+"_renew"
		return "#!lua name=" + name + "\n" + body +
				"redis.register_function('" + batchFn + "', function(keys, args) return batch(keys, args) end)\n" +
				"redis.register_function('" + multiFn + "', function(keys, args) return multi(keys, args) end)\n" +
				"redis.register_function('" + refundFn + "', function(keys, args) return refund(keys, args) end)\n" +
				"redis.register_function('" + adjustFn + "', function(keys, args) return adjust(keys, args) end)\n" +
				"redis.register_function('" + leaseFn + "', function(keys, args) return settle_lease(keys, args) end)\n" +
				"redis.register_function('" + renewFn + "', function(keys, args) return renew_lease(keys, args) end)\n",
			batchFn, multiFn, refundFn, adjustFn, leaseFn, renewFn
	}()
)

// DefaultMaxFlushDelay is how long a connection may wait to gather concurrent calls into one
// write (the URL's max_flush_delay). Gathering trades a few
// microseconds of latency for fewer writes, which paired load tests found worth it
// (docs/measurements.md).
const DefaultMaxFlushDelay = 50 * time.Microsecond

// MinVersion is the oldest Redis the scripts run on: SET with PXAT and KEEPTTL came in 6.2.
const MinVersion = 6

// Store is the Redis store. Create it with New.
type Store struct {
	client    rueidis.Client
	cluster   bool
	functions bool         // FCALL the library rather than EVALSHA the scripts
	scripts   bool         // WithScripts: never load the library
	now       func() int64 // tests only: pass the time instead of Redis TIME
	// calClock is the node's clock (µs) that calendar windows' bounds are computed around
	// (see opString); nil is now's, else the wall clock. Tests set it to skew the node.
	calClock func() int64
	timeout  time.Duration
	ops      [opCacheSize]atomic.Pointer[opEntry] // op strings by opKey.set (see opString)

	calls   sync.Pool    // *call, so that a guarded round trip allocates nothing
	waiting atomic.Int64 // calls inside rueidis, abandoned ones included (see do)

	coalesce  bool                         // decide concurrent batches in shared calls (coalesce.go)
	lane      *lane                        // a single server's
	slotLanes *[16384]atomic.Pointer[lane] // a Cluster's, per hash slot, made on first use
	scratches sync.Pool                    // *scratch
	pendings  sync.Pool                    // *pending

	coalescedCalls, coalescedBatches atomic.Uint64 // see CoalesceStats

	plainWindows                bool // count far fixed windows with plain commands (plain.go)
	keySeed                     maphash.Seed
	near                        keyTable // keys near their limit, until their window ends
	expiring                    keyTable // keys this node gave their window's expiry
	clock                       redisClock
	plainDecided, plainFellBack atomic.Uint64 // see PlainStats
	// single is a single server's route for plain windows; a Cluster's are per slot in
	// routes, read in the background (route.go).
	single    nodeRoute
	routes    atomic.Pointer[slotRoutes]
	routing   atomic.Bool     // a read of the slot map runs
	routedAt  atomic.Int64    // Store.since when the last read ended
	redirects atomic.Uint64   // flights a node refused for a slot it no longer serves
	nodes     map[string]node // by address: only the slot map's reader uses it

	// prefix starts every Redis key the store writes (the URL's key_prefix), so that
	// deployments can share one Redis; a key's hash tag comes after it, so the slot is the
	// same as without it.
	prefix string
	inbox  string // the region inbox's key, after prefix
}

// Option configures a Store.
type Option func(*Store)

// WithTimeForTests makes the scripts use now instead of Redis TIME, so tests can drive time
// and compare with the memory store at the same instants. Never in production.
func WithTimeForTests(now func() int64) Option { return func(s *Store) { s.now = now } }

// WithScripts makes the store run EVALSHA scripts even where Redis Functions are available.
func WithScripts() Option { return func(s *Store) { s.scripts = true } }

// WithCoalescing turns coalescing (coalesce.go) on or off; the URL's coalesce=false turns it
// off too. It is on by default.
func WithCoalescing(on bool) Option { return func(s *Store) { s.coalesce = on } }

// WithTimeout bounds every store call (default 1 s; the resilience layer sets it lower).
func WithTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

// Close closes the connections.
func (s *Store) Close() error {
	s.client.Close()
	return nil
}

// group is the ops of one hash slot, for one script call.
type group struct {
	slot uint16 // on a Cluster
	ops  []int  // indexes into the batch
	keys []string
	args []string // batch.lua's ARGV: the head (set by Apply), then one string per op
	// record is the key of the batch's idempotency record on this slot, when it has one.
	record string
}

// The first value of batch.lua's reply.
const (
	decided  = 0 // decided now: may have consumed, and written a record
	replay   = 1 // the record's answer
	mismatch = 2 // the record holds another fingerprint: nothing decided
)

// The parts of an op's code in batch.lua's reply.
const (
	codeAllowed = 1 // the op allowed
	codeRetry   = 2 // retry follows remaining and reset
	codeDelay   = 4 // delay follows them (and retry, if present)
	codeReason  = 8 // the reason is code / codeReason
)

// decodeBatch reads the reply of one batch of nops ops from msgs[at:] (see batch.lua), appends
// it to vals in the form Apply reads (status, now, then allowed, reason, remaining, reset,
// retry and delay per op; status and now alone for a mismatch), and returns where the next
// batch's reply starts. An error reply there is the batch's error. A malformed reply returns
// next -1: nothing after it can be read either.
func decodeBatch(msgs []rueidis.RedisMessage, at, nops int, vals []int64) (_ []int64, next int, err error) {
	if at >= len(msgs) {
		return vals, -1, errors.New("script answered too few values")
	}
	if err := msgs[at].Error(); err != nil {
		return vals, at + 1, err
	}
	var v int64
	read := func() bool {
		if at >= len(msgs) {
			err = errors.New("script answered too few values")
			return false
		}
		v, err = msgs[at].AsInt64()
		at++
		return err == nil
	}
	if !read() {
		return vals, -1, err
	}
	status := v
	if !read() {
		return vals, -1, err
	}
	vals = append(vals, status, v)
	switch status {
	case mismatch:
		return vals, at, nil
	case decided, replay:
	default:
		return vals, -1, fmt.Errorf("script answered status %d", status)
	}
	for range nops {
		if !read() {
			return vals, -1, err
		}
		code := v
		var remaining, reset, retry, delay int64
		if !read() {
			return vals, -1, err
		}
		remaining = v
		if !read() {
			return vals, -1, err
		}
		reset = v
		if code&codeRetry != 0 {
			if !read() {
				return vals, -1, err
			}
			retry = v
		}
		if code&codeDelay != 0 {
			if !read() {
				return vals, -1, err
			}
			delay = v
		}
		vals = append(vals, code&codeAllowed, code/codeReason, remaining, reset, retry, delay)
	}
	return vals, at, nil
}

// decodeReply decodes the reply of a call that decided one batch of nops ops (see
// decodeBatch).
func decodeReply(reply rueidis.RedisResult, nops int, vals []int64) ([]int64, error) {
	msgs, err := reply.ToArray()
	if err != nil {
		return vals, err
	}
	vals, next, err := decodeBatch(msgs, 0, nops, vals)
	if err == nil && next != len(msgs) {
		err = fmt.Errorf("script answered %d values, %d more than %d ops take", len(msgs), len(msgs)-next, nops)
	}
	return vals, err
}

// Apply decides the batch inside Redis: see the package comment.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	return s.apply(ctx, time.Time{}, b, results)
}

// ApplyBy is Apply that returns by deadline whatever Redis does, without a context made for
// it: the breaker's guard calls it on every check, and a context.WithTimeout per check was
// about nine allocations and a timer. ctx's deadline ends the call when it is sooner; a
// coalesced call whose ctx is cancelled while it waits leaves at deadline (see coalesced).
func (s *Store) ApplyBy(ctx context.Context, deadline time.Time, b *store.Batch, results []algorithm.Result) (bool, error) {
	return s.apply(ctx, deadline, b, results)
}

// apply is Apply; a zero deadline takes the store's timeout or ctx's deadline.
func (s *Store) apply(ctx context.Context, deadline time.Time, b *store.Batch, results []algorithm.Result) (bool, error) {
	if len(b.Ops) == 0 {
		return false, nil
	}
	var cancel context.CancelFunc
	switch {
	case deadline.IsZero():
		ctx, cancel = s.bound(ctx)
		if d, ok := ctx.Deadline(); ok {
			deadline = d
		}
	case s.coalesce:
		cancel = func() {} // the lane's watch keeps the deadline (see coalesced)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
	default:
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()
	sc := s.scratches.Get().(*scratch)
	keep := true // false once a round trip this call left may still read sc's strings
	defer func() {
		if keep {
			s.scratches.Put(sc)
		}
	}()
	groups := s.group(b, sc)
	now := ""
	if s.now != nil {
		now = strconv.FormatInt(s.now(), 10)
	}
	ttl, fp := "0", ""
	idem := len(b.IdempotencyKey) > 0
	if idem {
		ttl = strconv.FormatInt(max(1, b.IdempotencyTTL.Milliseconds()), 10)
		fp = hex.EncodeToString(b.IdempotencyFingerprint[:])
		groups = s.placeRecords(groups, b.IdempotencyKey)
	}
	execs := sc.execs[:0]
	for gi := range groups {
		g := &groups[gi]
		if idem {
			g.keys = append(g.keys, g.record)
		}
		// The short head, a bare op count, is the production case: Redis TIME, no
		// idempotency, one key per op.
		if now == "" && !idem && len(g.keys) == len(g.ops) {
			g.args[0] = smallInt(len(g.ops))
		} else {
			g.args[0] = smallInt(len(g.ops)) + "," + smallInt(len(g.keys)) + "," + now + "," + ttl + "," + fp
		}
		execs = append(execs, rueidis.LuaExec{Keys: g.keys, Args: g.args})
	}
	sc.execs = execs
	sc.size(len(groups))
	answers, nows, answered, fresh := sc.answers, sc.nows, sc.answered, sc.fresh
	if s.coalesce {
		err := s.coalesced(ctx, deadline, b, groups, execs, answers)
		defer s.release(answers)
		if err != nil {
			keep = false
			return false, fmt.Errorf("%w: redis: %w", store.ErrUnavailable, err)
		}
		for gi := range answers {
			if answers[gi].err != nil {
				// The lane's round trip may have failed at its deadline, and rueidis may
				// still write the strings.
				keep = false
			}
		}
	} else {
		replies, err := s.do(ctx, batchScript, batchFunction, execs, nil)
		if err != nil {
			keep = false
			// Nothing is known of any slot: each may or may not have consumed, as with any
			// call that timed out (see do).
			return false, fmt.Errorf("%w: redis: %w", store.ErrUnavailable, err)
		}
		for gi, reply := range replies {
			answers[gi].vals, answers[gi].err = decodeReply(reply, len(groups[gi].ops), sc.vals(gi))
			sc.decoded[gi] = answers[gi].vals // grown, kept for the next call
		}
	}
	replayed, denied, reused := false, false, false
	var failure error
	for gi := range answers {
		vals, err := answers[gi].vals, answers[gi].err
		if err != nil {
			// %w twice: a caller's own cancellation must stay visible (the breaker does not
			// count it against the store).
			failure = fmt.Errorf("%w: redis: %w", store.ErrUnavailable, err)
			continue
		}
		g := &groups[gi]
		// A replay answers as many ops as were decided: the fingerprint binds the ops.
		if len(vals) < 2 || vals[0] < decided || vals[0] > mismatch || (vals[0] != mismatch && len(vals) != 2+6*len(g.ops)) {
			failure = fmt.Errorf("%w: redis: script answered %d values for %d ops", store.ErrUnavailable, len(vals), len(g.ops))
			continue
		}
		answered[gi] = true
		nows[gi] = vals[1]
		if len(b.OpAt) == len(b.Ops) {
			for _, i := range groups[gi].ops {
				b.OpAt[i] = vals[1]
			}
		}
		switch vals[0] {
		case mismatch:
			reused = true
			continue
		case replay:
			replayed = true
		default:
			fresh[gi] = true
		}
		for j, i := range g.ops {
			v := vals[2+6*j:]
			results[i] = algorithm.Result{
				Allowed: v[0] == 1, Reason: algorithm.Reason(v[1]), Remaining: v[2],
				ResetAfter: v[3], RetryAfter: v[4], Delay: v[5],
			}
			if !results[i].Allowed && b.Ops[i].Binding() {
				denied = true
			}
		}
	}
	if reused {
		// The key holds another request's record (on a Cluster, at least on the key's own
		// slot): this request consumes nothing, so slots that decided it give back, what
		// counters counted included (the request was refused, not denied).
		s.refund(ctx, deadline, b, groups, nows, results, fresh, true)
		return false, store.ErrIdempotencyMismatch
	}
	if failure != nil {
		// Some slots decided and may have consumed: give it back, as for a denial.
		for gi := range groups {
			if !answered[gi] {
				for _, i := range groups[gi].ops {
					results[i] = algorithm.Result{} // nothing to give back there
				}
			}
		}
		if len(groups) > 1 {
			s.refund(ctx, deadline, b, groups, nows, results, fresh, false)
		}
		if !denied {
			return false, failure // undecided: the caller follows on_store_error
		}
		// A slot that answered denied: the request is denied whatever the others would have
		// said. Their limits report as untouched rather than as denials.
		for gi := range groups {
			if !answered[gi] {
				for _, i := range groups[gi].ops {
					results[i] = algorithm.Result{Allowed: true}
				}
			}
		}
		return false, nil
	}
	if denied && len(groups) > 1 {
		// A failed refund leaves the others' units consumed (quota lost, never double
		// granted); the request is denied all the same.
		s.refund(ctx, deadline, b, groups, nows, results, fresh, false)
	}
	return replayed, nil
}

// refund gives back what the groups decided now consumed, when another group denied or the
// request cannot stand, and drops the idempotency records they wrote: only an allowed request
// is remembered. refused is set for a request refused for reusing an idempotency key: it did
// not happen at all, so counters give back what they counted too (as the memory store, which
// refuses it before deciding anything).
func (s *Store) refund(ctx context.Context, deadline time.Time, b *store.Batch, groups []group, nows []int64, results []algorithm.Result, fresh []bool, refused bool) error {
	// A group that denied rolled itself back inside its script, counters apart, and wrote no
	// record, and one that replayed or did not answer consumed nothing here: only groups that
	// committed have anything to give back, and denied ones their counters' counts.
	var execs []rueidis.LuaExec
	var committed []int
	for gi := range groups {
		g := &groups[gi]
		if !fresh[gi] {
			continue
		}
		denied, counted := false, false
		for _, i := range g.ops {
			if !results[i].Allowed && b.Ops[i].Binding() {
				denied = true
			}
			if b.Ops[i].Counter && results[i].Allowed && b.Ops[i].Cost > 0 {
				counted = true
			}
		}
		if denied && !(refused && counted) {
			continue
		}
		keys := make([]string, 0, 2*len(g.ops)+1)
		args := append(make([]string, 0, 2+len(g.ops)), strconv.FormatInt(nows[gi], 10), strconv.Itoa(len(g.ops)))
		for _, i := range g.ops {
			op := b.Ops[i] // a copy: its cost becomes what to give back
			switch {
			case !results[i].Allowed:
				op.Cost = 0
			case op.Counter && !refused:
				op.Cost = 0 // a counter keeps what it counted, whatever the request's fate
			case !op.Counter && denied:
				op.Cost = 0 // rolled back by its own script
			}
			state := s.key(op.Key)
			keys = append(keys, state, state+":log")
			args = append(args, s.opString(&op))
		}
		if g.record != "" {
			keys = append(keys, g.record)
		}
		execs = append(execs, rueidis.LuaExec{Keys: keys, Args: args})
		committed = append(committed, gi)
	}
	if len(execs) == 0 {
		return nil
	}
	// The call's deadline holds the refund too: on the coalesced path under ApplyBy, ctx may
	// have none of its own.
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	replies, err := s.do(ctx, refundScript, refundFunction, execs, nil)
	if err != nil {
		return fmt.Errorf("%w: redis refund: %w", store.ErrUnavailable, err)
	}
	for x, r := range replies {
		vals, err := r.AsIntSlice()
		if err != nil {
			return fmt.Errorf("%w: redis refund: %w", store.ErrUnavailable, err)
		}
		for j, i := range groups[committed[x]].ops {
			if results[i].Allowed && b.Ops[i].Cost > 0 && !b.Ops[i].Counter && len(vals) >= 2*(j+1) {
				results[i].Remaining, results[i].ResetAfter, results[i].Delay = vals[2*j], vals[2*j+1], 0
			}
		}
	}
	return nil
}

// bound gives ctx the store's deadline, unless it already ends as soon: behind the breaker,
// which sets its own, a second timer per call (a timer and a child context registered with
// the caller's) would be paid for nothing.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= s.timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// Reset deletes the state of keys.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		state := s.key(k)
		cmds = append(cmds, s.client.B().Del().Key(state, state+":log").Build())
	}
	replies, err := s.do(ctx, nil, "", nil, cmds)
	if err != nil {
		return fmt.Errorf("%w: redis reset: %w", store.ErrUnavailable, err)
	}
	for _, r := range replies {
		if err := r.Error(); err != nil {
			return fmt.Errorf("%w: redis reset: %w", store.ErrUnavailable, err)
		}
	}
	return nil
}

// Client exposes the connection for tests and tools.
func (s *Store) Client() rueidis.Client { return s.client }
