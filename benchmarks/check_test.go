// Package benchmarks compares Sluice's Check with baselines in one run, so that ratios hold on a
// noisy machine: golang.org/x/time/rate's Allow and a plain mutex+map token bucket. It is its
// own module so the main module never depends on what it is compared with.
//
//	cd benchmarks && go test -bench . -benchmem
package benchmarks

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

const oneLimit = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 1000000000, period: 1s}
`

const fourLimits = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 1000000000, period: 1s}
  - {name: per-tenant, key: [tenant], algorithm: gcra, limit: 1000000000, period: 1s}
  - {name: per-endpoint, match: {endpoint: "/api/*"}, key: [endpoint], algorithm: sliding_window_counter, limit: 1000000000, period: 1m}
  - {name: global, key: [], algorithm: fixed_window, limit: 1000000000, period: 1s}
`

func limiter(b *testing.B, yml string, opts ...memory.Option) *sluice.Limiter {
	cfg, err := policy.ParseConfig("bench.yaml", []byte(yml))
	if err != nil {
		b.Fatal(err)
	}
	snap, err := policy.Compile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	l, err := sluice.New(memory.New(append(opts, memory.WithSweepInterval(0))...), snap)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkCheck is the whole Check path on warm keys: validation, policy resolution, key
// building, the memory store's atomic apply and the decision.
func BenchmarkCheck(b *testing.B) {
	for _, c := range []struct {
		name string
		yml  string
	}{{"1limit", oneLimit}, {"4limits", fourLimits}} {
		b.Run(c.name+"/serial", func(b *testing.B) {
			l := limiter(b, c.yml)
			req := sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}
			var d sluice.Decision
			l.Check(context.Background(), &req, &d)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Check(context.Background(), &req, &d); err != nil || !d.Allowed {
					b.Fatal(err, d.Allowed)
				}
			}
		})
		// The same Check with the store's clock stopped: what is left is Sluice's own work, apart
		// from the clock read that a virtual machine can make dear (kvm-clock: ~29 ns here).
		b.Run(c.name+"/serial-fixed-clock", func(b *testing.B) {
			l := limiter(b, c.yml, memory.WithClock(func() int64 { return 1_700_000_000_000_000 }))
			req := sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}
			var d sluice.Decision
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Check(context.Background(), &req, &d); err != nil || !d.Allowed {
					b.Fatal(err, d.Allowed)
				}
			}
		})
		// The same 1k-key traffic on one goroutine: the baseline for the parallel figure, which
		// misses the cache the way a single warm key does not.
		b.Run(c.name+"/serial-1k-keys", func(b *testing.B) {
			l := limiter(b, c.yml)
			reqs := make([]sluice.Request, 1000)
			for i := range reqs {
				reqs[i] = sluice.Request{Tenant: "t0", User: fmt.Sprint("u", i), Endpoint: "/api/items", Method: "GET"}
			}
			var d sluice.Decision
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				l.Check(context.Background(), &reqs[i%len(reqs)], &d)
				i++
			}
		})
		b.Run(c.name+"/parallel-1k-keys", func(b *testing.B) {
			l := limiter(b, c.yml)
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1)
				reqs := make([]sluice.Request, 1000)
				for i := range reqs {
					reqs[i] = sluice.Request{Tenant: fmt.Sprint("t", g), User: fmt.Sprint("u", i), Endpoint: "/api/items", Method: "GET"}
				}
				var d sluice.Decision
				i := 0
				for pb.Next() {
					l.Check(context.Background(), &reqs[i%len(reqs)], &d)
					i++
				}
			})
		})
	}
}

// BenchmarkCheckIdempotentRetry is a Check that carries an idempotency key, retried: the
// request's fingerprint is computed and compared with the record's, and the first decision is
// replayed. Checks without a key (BenchmarkCheck) pay none of this.
func BenchmarkCheckIdempotentRetry(b *testing.B) {
	for _, c := range []struct {
		name string
		yml  string
	}{{"1limit", oneLimit}, {"4limits", fourLimits}} {
		b.Run(c.name, func(b *testing.B) {
			l := limiter(b, c.yml)
			req := sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET", IdempotencyKey: "req-8812"}
			var d sluice.Decision
			l.Check(context.Background(), &req, &d)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Check(context.Background(), &req, &d); err != nil || !d.Replayed {
					b.Fatal(err, d.Replayed)
				}
			}
		})
	}
}

// BenchmarkXTimeRate is golang.org/x/time/rate's Allow on one limiter: no key lookup, no lock
// striping, the floor for an in-process token bucket.
func BenchmarkXTimeRate(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 1e9)
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("parallel-1k-keys", func(b *testing.B) {
		var mu sync.Mutex
		lims := map[string]*rate.Limiter{}
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprint("u", i)
			lims[keys[i]] = rate.NewLimiter(rate.Limit(1e9), 1e9)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				mu.Lock()
				lim := lims[keys[i%len(keys)]]
				mu.Unlock()
				lim.Allow()
				i++
			}
		})
	})
}

// mutexBucket is the hand-rolled limiter many services start with: one mutex, one map, float
// tokens.
type mutexBucket struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	rate    float64
	burst   float64
}

type bucket struct {
	tokens float64
	last   time.Time
}

func (m *mutexBucket) allow(key string) bool {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[key]
	if b == nil {
		b = &bucket{tokens: m.burst, last: now}
		m.buckets[key] = b
	}
	b.tokens = min(m.burst, b.tokens+now.Sub(b.last).Seconds()*m.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func BenchmarkMutexMap(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		m := &mutexBucket{buckets: map[string]*bucket{}, rate: 1e9, burst: 1e9}
		b.ReportAllocs()
		for b.Loop() {
			m.allow("acme:u1")
		}
	})
	b.Run("parallel-1k-keys", func(b *testing.B) {
		m := &mutexBucket{buckets: map[string]*bucket{}, rate: 1e9, burst: 1e9}
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprint("acme:u", i)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				m.allow(keys[i%len(keys)])
				i++
			}
		})
	})
}

// controlState is a control store of n overrides (a multiplier per tenant) and n identity
// assignments (n/2 API keys given a tenant and a tier, n/2 users given a tier).
func controlState(n int) *policy.State {
	st := &policy.State{Version: 1}
	expires := time.Now().Add(24 * time.Hour)
	for i := range n {
		st.Overrides = append(st.Overrides, policy.StateOverride{ID: int64(i + 1), Override: policy.Override{Tenant: fmt.Sprint("tenant-", i), Type: policy.OverrideMultiplier, Value: 2,
			ExpiresAt: expires, Source: policy.SourceAPI, Reason: "bench",
		}})
		if i%2 == 0 {
			st.Identities = append(st.Identities, policy.Identity{Kind: policy.IdentityAPIKey, Value: fmt.Sprint("key-", i), Tenant: fmt.Sprint("tenant-", i), Tier: "gold"})
		} else {
			st.Identities = append(st.Identities, policy.Identity{Kind: policy.IdentityUser, Value: fmt.Sprint("user-", i), Tier: "gold"})
		}
	}
	return st
}

// BenchmarkCheckControl is BenchmarkCheck's serial Check on a policy compiled with a control
// store: empty; holding 10 or 10,000 overrides and as many identity assignments, for a
// request that none of them names; and with 10,000, for an API key assigned a tenant whose
// override applies.
func BenchmarkCheckControl(b *testing.B) {
	for _, c := range []struct {
		name string
		yml  string
	}{{"1limit", oneLimit}, {"4limits", fourLimits}} {
		files, err := policy.ParseFiles(map[string][]byte{"bench.yaml": []byte(c.yml)})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range []struct {
			name string
			st   *policy.State
			req  sluice.Request
		}{
			{"empty", &policy.State{}, sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}},
			{"10+10/unmatched", controlState(10), sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}},
			{"10k+10k/unmatched", controlState(10000), sluice.Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}},
			{"10k+10k/assigned", controlState(10000), sluice.Request{APIKey: "key-42", User: "u1", Endpoint: "/api/items", Method: "GET"}},
		} {
			b.Run(c.name+"/"+s.name, func(b *testing.B) {
				snap, skipped := policy.CompileWith(files, s.st, time.Now())
				if len(skipped) > 0 {
					b.Fatal(skipped)
				}
				l := limiter(b, c.yml)
				if err := l.SetPolicy(snap); err != nil {
					b.Fatal(err)
				}
				req := s.req
				var d sluice.Decision
				l.Check(context.Background(), &req, &d)
				b.ReportAllocs()
				for b.Loop() {
					if err := l.Check(context.Background(), &req, &d); err != nil || !d.Allowed {
						b.Fatal(err, d.Allowed)
					}
				}
			})
		}
	}
}

// BenchmarkCheckEscalation is BenchmarkCheck's serial Check of one limit whose rule has an
// escalation (the request also sends its caller's burst counter, a second op of the same
// batch), one whose rule is adaptive (for a caller with a trust score, and one without), and
// one under a warning override. The threshold is never reached.
func BenchmarkCheckEscalation(b *testing.B) {
	trust := 0.5
	st := &policy.State{Version: 1,
		Identities: []policy.Identity{{Kind: policy.IdentityUser, Value: "trusted", Trust: &trust}},
		Overrides: []policy.StateOverride{{ID: 1, Override: policy.Override{User: "warned", Rule: "per-user", Type: policy.OverrideWarn,
			ExpiresAt: time.Now().Add(time.Hour), Source: policy.SourceAutomatic, Reason: "burst"}}},
	}
	for _, c := range []struct {
		name, rule, user string
	}{
		{"escalation", "escalation: {window: 10s, threshold: 1000000000, penalty: 5m}", "u1"},
		{"adaptive/trusted", "adaptive: trust", "trusted"},
		{"adaptive/untrusted", "adaptive: trust", "u1"},
		{"warned", "escalation: {window: 10s, threshold: 1000000000, penalty: 5m}", "warned"},
	} {
		b.Run(c.name, func(b *testing.B) {
			yml := strings.Replace(oneLimit, "period: 1s}", "period: 1s, "+c.rule+"}", 1)
			files, err := policy.ParseFiles(map[string][]byte{"bench.yaml": []byte(yml)})
			if err != nil {
				b.Fatal(err)
			}
			snap, skipped := policy.CompileWith(files, st, time.Now())
			if len(skipped) > 0 {
				b.Fatal(skipped)
			}
			l := limiter(b, yml, memory.WithClock(func() int64 { return 1_700_000_000_000_000 }))
			if err := l.SetPolicy(snap); err != nil {
				b.Fatal(err)
			}
			req := sluice.Request{Tenant: "acme", User: c.user, Endpoint: "/api/items", Method: "GET"}
			var d sluice.Decision
			l.Check(context.Background(), &req, &d)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Check(context.Background(), &req, &d); err != nil || !d.Allowed {
					b.Fatal(err, d.Allowed)
				}
			}
		})
	}
}
