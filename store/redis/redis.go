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
	"crypto/tls"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/tlsreload"
	"github.com/sluicehq/sluice/store"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// source concatenates the prelude, the six algorithm files and the named entry points, which
// define local functions batch and refund.
func source(entries ...string) string {
	var b strings.Builder
	for _, f := range append([]string{"prelude", "token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"}, entries...) {
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

	library, batchFunction, multiFunction, refundFunction = func() (string, string, string, string) {
		body := source("batch", "multi", "refund")
		sum := sha256.Sum256([]byte(body))
		name := "sluice_" + hex.EncodeToString(sum[:6]) // a new version loads beside the old
		batchFn, multiFn, refundFn := name+"_batch", name+"_multi", name+"_refund"
		return "#!lua name=" + name + "\n" + body +
				"redis.register_function('" + batchFn + "', function(keys, args) return batch(keys, args) end)\n" +
				"redis.register_function('" + multiFn + "', function(keys, args) return multi(keys, args) end)\n" +
				"redis.register_function('" + refundFn + "', function(keys, args) return refund(keys, args) end)\n",
			batchFn, multiFn, refundFn
	}()
)

// DefaultMaxFlushDelay is how long a connection may wait to gather concurrent calls into one
// write (the URL's max_flush_delay). In paired load tests (RLS, c=50, Redis on the same 2-core
// VM) 50 µs cut Sluice's CPU per check by ~6% and raised throughput in 5 of 6 pairs by 3-8%.
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
	timeout   time.Duration
	ops       [opCacheSize]atomic.Pointer[opEntry] // op strings by opKey.set (see opString)

	calls   sync.Pool    // *call, so that a guarded round trip allocates nothing
	waiting atomic.Int64 // calls inside rueidis, abandoned ones included (see do)

	coalesce  bool                         // decide concurrent batches in shared calls (coalesce.go)
	lane      *lane                        // a single server's
	slotLanes *[16384]atomic.Pointer[lane] // a Cluster's, per hash slot, made on first use
	scratches sync.Pool                    // *scratch
	pendings  sync.Pool                    // *pending

	coalescedCalls, coalescedBatches atomic.Uint64 // see CoalesceStats
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

// New connects to the Redis that rawURL names:
//
//	redis://[user:pass@]host:port[/db]           one server (a Cluster node is detected)
//	rediss://...                                 the same over TLS
//	redis-sentinel://[user:pass@]h1:p1,h2:p2/master[?db=N]
//	redis-cluster://[user:pass@]h1:p1,h2:p2,...  a Cluster from several seeds
//
// Query parameters: read_timeout (bounds every call, default 1s), dial_timeout, write_timeout,
// max_flush_delay (durations; the last defaults to DefaultMaxFlushDelay, 0 turns it off),
// pool_size, pipeline_multiplex (integers), coalesce=false (one script call per request rather
// than one per lane's gathered requests, see coalesce.go), tls=true (sentinel and
// cluster forms), tls_ca_file (PEM of the CA that signed Redis's certificate),
// tls_insecure_skip_verify=true, tls_cert_file and tls_key_file (PEM client certificate and key
// for a Redis with tls-auth-clients, read again when they change). New fails with a clear error when Redis cannot be
// reached or is older than MinVersion.
func New(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	opt, cluster, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	timeout := time.Second
	if v := queryOf(rawURL).Get("read_timeout"); v != "" {
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			return nil, fmt.Errorf("--store: read_timeout %q: want a positive duration", v)
		}
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("redis store: connect to %s: %w", redact(rawURL), err)
	}
	s := &Store{client: client, cluster: cluster, timeout: timeout, coalesce: queryOf(rawURL).Get("coalesce") != "false"}
	s.calls.New = func() any { return newCall(s) }
	s.pendings.New = func() any { return &pending{done: make(chan struct{}, 1)} }
	s.scratches.New = func() any { return new(scratch) }
	s.lane = newLane(s)
	for _, o := range opts {
		o(s)
	}
	if err := s.check(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store %s: %w", redact(rawURL), err)
	}
	if s.cluster {
		s.slotLanes = new([16384]atomic.Pointer[lane])
	}
	return s, nil
}

// check verifies the server's version and whether it runs as a Cluster.
func (s *Store) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := s.client.Do(ctx, s.client.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return fmt.Errorf("unreachable: %w", err)
	}
	version := field(info, "redis_version")
	parts := strings.SplitN(version, ".", 3)
	major, _ := strconv.Atoi(parts[0])
	minor := 0
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	if major < MinVersion || (major == MinVersion && minor < 2) {
		return fmt.Errorf("Redis %s is too old: the scripts need 6.2 or newer (SET ... PXAT)", version)
	}
	if info, err := s.client.Do(ctx, s.client.B().Info().Section("cluster").Build()).ToString(); err == nil && field(info, "cluster_enabled") == "1" {
		s.cluster = true
	}
	if major >= 7 && !s.scripts {
		if err := s.loadLibrary(ctx); err != nil {
			return fmt.Errorf("load the function library: %w", err)
		}
		s.functions = true
	}
	return nil
}

// loadLibrary loads the function library on every node. One already there is fine; a replica
// refuses the write and gets the library from its primary.
func (s *Store) loadLibrary(ctx context.Context) error {
	load := func(c rueidis.Client) error {
		err := c.Do(ctx, c.B().FunctionLoad().FunctionCode(library).Build()).Error()
		if err != nil && !strings.Contains(err.Error(), "already exists") && !strings.Contains(err.Error(), "READONLY") {
			return err
		}
		return nil
	}
	if !s.cluster {
		return load(s.client)
	}
	for addr, c := range s.client.Nodes() {
		if err := load(c); err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
	}
	return nil
}

func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func parseURL(raw string) (rueidis.ClientOption, bool, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error repeats the URL, password and all.
		return rueidis.ClientOption{}, false, errors.New("--store: not a valid URL")
	}
	q := u.Query()
	var opt rueidis.ClientOption
	cluster := false
	switch u.Scheme {
	case "redis", "rediss":
		// rueidis reads host, credentials, db, TLS and addr= from these itself.
		clean := *u
		clean.RawQuery = ""
		if opt, err = rueidis.ParseURL(clean.String()); err != nil {
			return opt, false, fmt.Errorf("--store %s: %v", redact(raw), strings.ReplaceAll(err.Error(), clean.String(), redact(clean.String())))
		}
	case "redis-sentinel", "redis-cluster":
		opt.InitAddress = strings.Split(u.Host, ",")
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		if u.Scheme == "redis-sentinel" {
			opt.Sentinel.MasterSet = strings.Trim(u.Path, "/")
			if opt.Sentinel.MasterSet == "" {
				return opt, false, errors.New("--store: redis-sentinel:// needs the master name as its path")
			}
			opt.Sentinel.Username, opt.Sentinel.Password = opt.Username, opt.Password
			if db := q.Get("db"); db != "" {
				if opt.SelectDB, err = strconv.Atoi(db); err != nil {
					return opt, false, fmt.Errorf("--store: db %q: %w", db, err)
				}
			}
		} else {
			cluster = true
			opt.ShuffleInit = true
		}
		if q.Get("tls") == "true" {
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	default:
		return opt, false, fmt.Errorf("--store: unsupported scheme %q (memory, redis://, rediss://, redis-sentinel://, redis-cluster://)", u.Scheme)
	}
	if len(opt.InitAddress) == 0 || opt.InitAddress[0] == "" {
		return opt, false, errors.New("--store: no Redis address")
	}
	if v := q.Get("dial_timeout"); v != "" {
		if opt.Dialer.Timeout, err = time.ParseDuration(v); err != nil {
			return opt, false, fmt.Errorf("--store: dial_timeout: %w", err)
		}
	}
	if v := q.Get("write_timeout"); v != "" {
		if opt.ConnWriteTimeout, err = time.ParseDuration(v); err != nil {
			return opt, false, fmt.Errorf("--store: write_timeout: %w", err)
		}
	}
	if q.Get("tls_insecure_skip_verify") == "true" && opt.TLSConfig != nil {
		opt.TLSConfig.InsecureSkipVerify = true
	}
	if path := q.Get("tls_ca_file"); path != "" {
		if opt.TLSConfig == nil {
			return opt, false, errors.New("--store: tls_ca_file needs rediss:// or tls=true")
		}
		pool, err := tlsreload.CertPool(path)
		if err != nil {
			return opt, false, fmt.Errorf("--store: tls_ca_file: %w", err)
		}
		opt.TLSConfig.RootCAs = pool
	}
	if err := clientCertificate(q, opt.TLSConfig); err != nil {
		return opt, false, err
	}
	// The limiter wants answers, not client-side caching of them.
	opt.DisableCache = true
	// Checks are pipelined over one connection per node; pool_size sizes the pool that
	// blocking commands would use, and pipeline_multiplex spreads pipelining over 2^n
	// connections.
	if v := q.Get("pool_size"); v != "" {
		if opt.BlockingPoolSize, err = strconv.Atoi(v); err != nil || opt.BlockingPoolSize < 1 {
			return opt, false, fmt.Errorf("--store: pool_size %q: want a positive integer", v)
		}
	}
	if v := q.Get("pipeline_multiplex"); v != "" {
		if opt.PipelineMultiplex, err = strconv.Atoi(v); err != nil || opt.PipelineMultiplex < 0 || opt.PipelineMultiplex > 8 {
			return opt, false, fmt.Errorf("--store: pipeline_multiplex %q: want 0 to 8", v)
		}
	}
	// max_flush_delay lets a connection gather concurrent requests before one write, so Sluice
	// and Redis make fewer system calls per check; rueidis waits only while several calls are
	// in flight, never for a lone one. 0 turns it off.
	opt.MaxFlushDelay = DefaultMaxFlushDelay
	if v := q.Get("max_flush_delay"); v != "" {
		if opt.MaxFlushDelay, err = time.ParseDuration(v); err != nil || opt.MaxFlushDelay < 0 {
			return opt, false, fmt.Errorf("--store: max_flush_delay %q: want a duration >= 0", v)
		}
	}
	return opt, cluster, nil
}

func queryOf(raw string) url.Values {
	u, err := url.Parse(raw)
	if err != nil {
		return url.Values{}
	}
	return u.Query()
}

// redact hides the password of a URL for errors and logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

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
// about nine allocations and a timer. ctx may still end the call sooner.
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
		cancel = func() {} // the wait below keeps the deadline by a pooled timer
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
		err := s.coalesced(ctx, deadline, sc, groups, execs, answers)
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
		// slot): this request consumes nothing, so slots that decided it give back.
		s.refund(ctx, deadline, b, groups, nows, results, fresh)
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
			s.refund(ctx, deadline, b, groups, nows, results, fresh)
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
		s.refund(ctx, deadline, b, groups, nows, results, fresh)
	}
	return replayed, nil
}

// maxWaiting bounds the calls left inside rueidis at once (see do). Past it a call fails at
// once rather than start one more goroutine that would only join the wait: a healthy store
// holds a few calls per connection in flight, far from this; a store that stopped answering
// to callers without a breaker in front would otherwise gather goroutines for as long as it
// hangs.
const maxWaiting = 1 << 13

var errBacklog = fmt.Errorf("%d calls already waiting on Redis", maxWaiting)

// do makes one round trip (run's script or function calls, or cmds when set) and returns by
// ctx's deadline whatever rueidis does. rueidis honours a context while it waits for a reply,
// but not while it waits for room in a connection's ring of pending calls (ring.PutOne
// blocks on a condition variable), nor while another caller dials and handshakes the
// connection, nor while a Cluster client refreshes its slots: calls abandoned at their
// deadline keep their ring slots until Redis answers, so a Redis that stops answering
// (SIGSTOP, a fork, a swap storm, a partition that drops packets) fills a connection's 1,024
// slots in a fraction of a second under load, and every later call then waits, deadline or
// not, until Redis comes back. So the round trip runs on a goroutine of its own and the
// caller leaves at the deadline. The goroutine reads only what the caller built for this call
// (execs, cmds: fresh strings, never the caller's batch) and writes only into its call; the
// caller reads the replies only when they came in time, so an abandoned round trip can never
// touch the caller's batch or results. An abandoned call that rueidis sends later still runs
// in Redis, as does any call that timed out after it was written.
func (s *Store) do(ctx context.Context, script *rueidis.Lua, fn string, execs []rueidis.LuaExec, cmds rueidis.Commands) ([]rueidis.RedisResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.waiting.Add(1) > maxWaiting {
		s.waiting.Add(-1)
		return nil, errBacklog
	}
	c := s.calls.Get().(*call)
	c.ctx, c.script, c.fn, c.execs, c.cmds = ctx, script, fn, execs, cmds
	c.state.Store(callRunning)
	go c.start()
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			return nil, ctx.Err() // the goroutine recycles c when rueidis returns
		}
		<-c.done // it finished as the deadline passed: the replies are whole
	}
	replies := c.replies
	c.recycle()
	return replies, nil
}

// call is one round trip of do, pooled with its goroutine's function so that starting it
// allocates nothing.
type call struct {
	s      *Store
	start  func() // c.work, bound once: `go c.work()` would allocate a closure per call
	done   chan struct{}
	state  atomic.Int32 // callRunning, then callDone (the caller takes c) or callAbandoned
	ctx    context.Context
	script *rueidis.Lua
	fn     string
	execs  []rueidis.LuaExec
	cmds   rueidis.Commands

	replies []rueidis.RedisResult
}

const (
	callRunning int32 = iota
	callDone
	callAbandoned
)

func newCall(s *Store) *call {
	c := &call{s: s, done: make(chan struct{}, 1)}
	c.start = c.work
	return c
}

func (c *call) work() {
	var replies []rueidis.RedisResult
	if c.cmds != nil {
		replies = c.s.client.DoMulti(c.ctx, c.cmds...)
	} else {
		replies = c.s.run(c.ctx, c.script, c.fn, c.execs)
	}
	c.s.waiting.Add(-1)
	c.replies = replies
	if c.state.CompareAndSwap(callRunning, callDone) {
		c.done <- struct{}{} // buffered: never blocks
		return
	}
	c.recycle() // the caller left at its deadline and will not read them
}

// recycle clears c (a pooled call must not keep a context or replies alive) and pools it.
func (c *call) recycle() {
	c.ctx, c.script, c.fn, c.execs, c.cmds, c.replies = nil, nil, "", nil, nil, nil
	c.s.calls.Put(c)
}

// run calls the library's function fn (or the script) once per exec, in one pipeline. A node
// that lost the library (restarted without persistence, or new) gets it again, and the calls
// are retried once.
func (s *Store) run(ctx context.Context, script *rueidis.Lua, fn string, execs []rueidis.LuaExec) []rueidis.RedisResult {
	if !s.functions {
		if len(execs) == 1 {
			return []rueidis.RedisResult{script.Exec(ctx, s.client, execs[0].Keys, execs[0].Args)}
		}
		return script.ExecMulti(ctx, s.client, execs...)
	}
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = s.client.B().Fcall().Function(fn).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	var replies []rueidis.RedisResult
	if len(cmds) == 1 {
		replies = []rueidis.RedisResult{s.client.Do(ctx, cmds[0])}
	} else {
		replies = s.client.DoMulti(ctx, cmds...)
	}
	// Re-run only the calls that found no library: the others ran, and running them again
	// would consume twice.
	var again []int
	for i, r := range replies {
		if err := r.Error(); err != nil && strings.Contains(err.Error(), "Function not found") {
			again = append(again, i)
		}
	}
	if len(again) == 0 || s.loadLibrary(ctx) != nil {
		return replies
	}
	// Built anew: rueidis recycles a command once it has run.
	retry := make(rueidis.Commands, len(again))
	for j, i := range again {
		e := execs[i]
		retry[j] = s.client.B().Fcall().Function(fn).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	for j, r := range s.client.DoMulti(ctx, retry...) {
		replies[again[j]] = r
	}
	return replies
}

// group splits the ops by hash slot; a single server takes them all in one call. Each group's
// args start with a place for batch.lua's head, which Apply fills. An op's log list goes in the
// keys only for sliding_window_log, the one algorithm that reads it.
func (s *Store) group(b *store.Batch, sc *scratch) []group {
	gs := sc.groups[:0]
	arena := sc.arena[:0]
	for i := range b.Ops {
		op := &b.Ops[i]
		gi := 0
		if s.cluster {
			slot := Slot(op.Key)
			gi = -1
			for j := range gs {
				if gs[j].slot == slot {
					gi = j
					break
				}
			}
			if gi < 0 {
				gs = addGroup(gs, slot)
				gi = len(gs) - 1
			}
		} else if len(gs) == 0 {
			gs = addGroup(gs, 0)
		}
		g := &gs[gi]
		g.ops = append(g.ops, i)
		var state, log string
		state, log, arena = redisKeys(arena, op.Key)
		g.keys = append(g.keys, state)
		if op.Params.Kind == algorithm.SlidingWindowLog {
			g.keys = append(g.keys, log)
		}
		g.args = append(g.args, s.opString(op))
	}
	sc.groups, sc.arena = gs, arena
	return gs
}

// addGroup appends a group for slot to gs, reusing the slices of one an earlier call left
// beyond gs's length.
func addGroup(gs []group, slot uint16) []group {
	if len(gs) == cap(gs) {
		return append(gs, group{slot: slot, args: []string{""}})
	}
	gs = gs[:len(gs)+1]
	g := &gs[len(gs)-1]
	g.slot, g.record = slot, ""
	g.ops, g.keys, g.args = g.ops[:0], g.keys[:0], append(g.args[:0], "")
	return gs
}

// redisKeys appends a bucket key's Redis key and its log list's key to arena, as one string
// and its prefix (see redisKey).
func redisKeys(arena, k []byte) (state, log string, grown []byte) {
	start := len(arena)
	tagged := len(key.HashTag(k)) < len(k)
	if !tagged {
		arena = append(arena, '{')
	}
	arena = append(arena, k...)
	if !tagged {
		arena = append(arena, '}')
	}
	arena = append(arena, ":log"...)
	// The bytes are never written again while the strings live: a call's scratch (and its
	// arena) is reused only once every round trip that read the strings has returned.
	log = unsafe.String(&arena[start], len(arena)-start)
	return log[:len(log)-len(":log")], log, arena
}

// scratch is what one Apply needs, pooled so that a request allocates next to nothing.
type scratch struct {
	groups   []group
	arena    []byte // the groups' key strings
	execs    []rueidis.LuaExec
	answers  []answer
	nows     []int64
	answered []bool
	fresh    []bool      // the group decided now
	decoded  [][]int64   // the uncoalesced path's replies, decoded (see decodeReply)
	timer    *time.Timer // the coalesced wait's deadline, stopped between uses
}

// vals returns group gi's buffer for a decoded reply, emptied.
func (sc *scratch) vals(gi int) []int64 {
	for len(sc.decoded) <= gi {
		sc.decoded = append(sc.decoded, nil)
	}
	return sc.decoded[gi][:0]
}

// size sizes the per-group slices for n groups, zeroed.
func (sc *scratch) size(n int) {
	sc.answers = resize(sc.answers, n)
	sc.nows = resize(sc.nows, n)
	sc.answered = resize(sc.answered, n)
	sc.fresh = resize(sc.fresh, n)
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// redisKey is the Redis key of a bucket key. A key without a hash tag gets its whole self as
// the tag, so its log list lands on the same slot.
func redisKey(k []byte) string {
	if tag := key.HashTag(k); len(tag) < len(k) {
		return string(k)
	}
	return "{" + string(k) + "}"
}

// placeRecords names where each group remembers its part of an idempotent request's decision.
// A single server keeps one record per request. On a Cluster each slot of the request keeps its
// own part, so that a retry replays in one round trip; and the key's own slot (its caller's hash
// tag, usually a slot the request uses anyway) always takes part, with a group of no ops if
// need be: there any two requests with the key meet, so a reuse for another request is caught
// wherever its limits live. The name changes with the record's format ("idem2" came with
// fingerprints, "idem3" with batch.lua's compact op values): nodes of an earlier version,
// during a rolling upgrade, neither read nor misread these records.
func (s *Store) placeRecords(gs []group, id []byte) []group {
	sum := sha256.Sum256(id)
	name := key.Prefix + "idem3:" + hex.EncodeToString(sum[:16])
	if !s.cluster {
		gs[0].record = name
		return gs
	}
	tag := string(key.HashTag(id))
	if len(tag) == len(id) {
		tag = hex.EncodeToString(sum[:16]) // no caller: no attribute in plain in the name
	}
	own := "{" + tag + "}:" + name
	slot := Slot([]byte(own))
	found := false
	for gi := range gs {
		if gs[gi].slot == slot {
			gs[gi].record, found = own, true
		} else {
			gs[gi].record = "{" + string(key.HashTag([]byte(gs[gi].keys[0]))) + "}:" + name
		}
	}
	if !found {
		gs = addGroup(gs, slot)
		gs[len(gs)-1].record = own
	}
	return gs
}

// opCacheSize is how many op strings the store keeps, in a table of sets of two indexed by a
// hash of the op: a policy has few distinct limits and most requests cost 1, so nearly every
// op finds its string; per-request limits (Envoy's descriptor limit, a region's lowered global
// limits) and costs can make any number, and each new one takes the place of the older of its
// set rather than fill a map for good. Two to a set, so that two busy ops whose hashes meet
// do not evict each other on every request. A table rather than a sync.Map: hashing a whole
// opKey through an interface cost each op ~250 ns, a tenth of the store's CPU per request.
const opCacheSize = 1 << 10

// opKey is what an op string is made of.
type opKey struct {
	params algorithm.Params
	cost   int64
	mode   int8
}

// opEntry is an op string and the op it was made of.
type opEntry struct {
	key opKey
	str string
}

// set is the first of the two slots where k's string may be kept: a mix of the fields that
// tell ops apart (the derived ones follow from them).
func (k *opKey) set() int {
	p := &k.params
	h := uint64(p.Kind)*0x9e3779b97f4a7c15 ^ uint64(p.Limit)*0xbf58476d1ce4e5b9 ^ uint64(p.Burst)*0x94d049bb133111eb ^
		uint64(p.Period)*0xd6e8feb86659fd93 ^ uint64(k.cost)*0xff51afd7ed558ccd ^ uint64(k.mode)
	return int((h ^ h>>29) & (opCacheSize - 2))
}

// opString is op as the scripts read it (see parse_op): the limit's parameters, its cost and
// its mode (0 binding, 1 shadow, 2 counter) in one string, formatted once per distinct op.
// One string rather than three: each ARGV value costs Redis a string object and a Lua string,
// and the script one more conversion.
func (s *Store) opString(op *store.Op) string {
	k := opKey{params: *op.Params, cost: op.Cost}
	switch {
	case op.Counter:
		k.mode = 2
	case op.Shadow:
		k.mode = 1
	}
	set := s.ops[k.set():][:2]
	for i := range set {
		if e := set[i].Load(); e != nil && e.key == k {
			return e.str
		}
	}
	p := op.Params
	tick, tickExp, periodTicks, scale, rate, capacity := p.Derived()
	b := make([]byte, 0, 112)
	for i, v := range [...]int64{int64(p.Kind), p.Limit, p.Burst, p.Period, tick, tickExp, periodTicks, scale, rate, capacity, k.cost, int64(k.mode)} {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	str := string(b)
	set[1].Store(set[0].Load()) // the newest first; racing stores lose an entry, never mix one
	set[0].Store(&opEntry{key: k, str: str})
	return str
}

// refund gives back what the groups decided now consumed, when another group denied or the
// request cannot stand, and drops the idempotency records they wrote: only an allowed request
// is remembered.
func (s *Store) refund(ctx context.Context, deadline time.Time, b *store.Batch, groups []group, nows []int64, results []algorithm.Result, fresh []bool) error {
	// A group that denied rolled itself back inside its script and wrote no record, and one
	// that replayed or did not answer consumed nothing here: only groups that committed have
	// anything to give back.
	var execs []rueidis.LuaExec
	var committed []int
	for gi := range groups {
		g := &groups[gi]
		ok := fresh[gi]
		for _, i := range g.ops {
			if !results[i].Allowed && b.Ops[i].Binding() {
				ok = false
			}
		}
		if !ok {
			continue
		}
		keys := make([]string, 0, 2*len(g.ops)+1)
		args := append(make([]string, 0, 2+len(g.ops)), strconv.FormatInt(nows[gi], 10), strconv.Itoa(len(g.ops)))
		for _, i := range g.ops {
			op := b.Ops[i] // a copy: its cost becomes what to give back
			if !results[i].Allowed || op.Counter {
				op.Cost = 0 // a counter keeps what it counted, whatever the request's fate
			}
			state := redisKey(op.Key)
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
		state := redisKey(k)
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

// clientCertificate sets the client certificate that tls_cert_file and tls_key_file name, if
// any, on cfg. The files are read again on a new connection when they changed (checked at most
// once a second), so a rotated certificate is used from the next reconnect on; a bad file is
// logged and the last good pair kept.
func clientCertificate(q url.Values, cfg *tls.Config) error {
	certFile, keyFile := q.Get("tls_cert_file"), q.Get("tls_key_file")
	if certFile == "" && keyFile == "" {
		return nil
	}
	if certFile == "" {
		return errors.New("--store: tls_key_file needs tls_cert_file")
	}
	if keyFile == "" {
		return errors.New("--store: tls_cert_file needs tls_key_file")
	}
	if cfg == nil {
		return errors.New("--store: tls_cert_file needs rediss:// or tls=true")
	}
	r, err := tlsreload.New(tlsreload.Options{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		return fmt.Errorf("--store: tls_cert_file: %w", err)
	}
	cfg.GetClientCertificate = r.ClientConfig().GetClientCertificate
	return nil
}
