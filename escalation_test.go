package sluice_test

import (
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// escalationPolicy has a rule with an escalation whose bursts are mostly denied (search), one
// whose bursts are allowed (list), and a rule without one; plainPolicy is the same without
// the escalations.
const (
	escalationPolicy = `
rules:
  - {name: search, match: {endpoint: /search}, key: [user], algorithm: token_bucket, limit: 3, period: 1m, escalation: {window: 10s, threshold: 5, penalty: 5m}}
  - {name: list, match: {endpoint: /list}, key: [user], algorithm: gcra, limit: 100, period: 1m, escalation: {window: 10s, threshold: 5, penalty: 5m}}
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 100, period: 1h}
`
	plainPolicy = `
rules:
  - {name: search, match: {endpoint: /search}, key: [user], algorithm: token_bucket, limit: 3, period: 1m}
  - {name: list, match: {endpoint: /list}, key: [user], algorithm: gcra, limit: 100, period: 1m}
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 100, period: 1h}
`
)

// bursts records what a Limiter's burst hook is given.
type bursts struct {
	mu  sync.Mutex
	got []sluice.Burst
}

func (b *bursts) add(x sluice.Burst) { b.mu.Lock(); b.got = append(b.got, x); b.mu.Unlock() }

func (b *bursts) len() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.got) }

// limiterPair is a Limiter with escalationPolicy and one with plainPolicy, over stores of one
// kind on one clock, and the bursts the first reports. prefix keeps their callers apart when
// they share a store.
type limiterPair struct {
	name            string
	escal, plain    *sluice.Limiter
	clock           *testutil.Clock
	bursts          *bursts
	escalUser, user string
}

func limiterPairs(t *testing.T) []limiterPair {
	t.Helper()
	var pairs []limiterPair
	newPair := func(name string, c *testing.T, st func() sluice.Store, clock *testutil.Clock, separate bool) limiterPair {
		p := limiterPair{name: name, clock: clock, bursts: &bursts{}, escalUser: "bob", user: "bob"}
		if !separate {
			p.user = "bob-plain"
		}
		var err error
		p.escal, err = sluice.New(st(), testutil.Snapshot(c, escalationPolicy), sluice.WithClock(clock.Now), sluice.WithBurstHook(p.bursts.add))
		if err != nil {
			c.Fatal(err)
		}
		p.plain, err = sluice.New(st(), testutil.Snapshot(c, plainPolicy), sluice.WithClock(clock.Now))
		if err != nil {
			c.Fatal(err)
		}
		c.Cleanup(func() { p.escal.Close(); p.plain.Close() })
		return p
	}
	mc := testutil.NewClock()
	pairs = append(pairs, newPair("memory", t, func() sluice.Store {
		return memory.New(memory.WithClock(mc.Micros), memory.WithSweepInterval(0))
	}, mc, true))
	srv := redistest.Start(t)
	rc := testutil.NewClock()
	rc.Add(time.Now().Add(48 * time.Hour).Truncate(24 * time.Hour).Sub(rc.Now())) // Redis expires keys by it
	pairs = append(pairs, newPair("redis", t, func() sluice.Store {
		rs, err := redis.New(ctx, "redis://"+srv.Addr, redis.WithTimeForTests(rc.Micros), redis.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}, rc, false))
	return pairs
}

// sameDecision fails unless a and b decided alike, but for the policy version.
func sameDecision(t *testing.T, what string, a, b *sluice.Decision) {
	t.Helper()
	x, y := *a, *b
	x.PolicyVersion, y.PolicyVersion = "", ""
	if x.Allowed != y.Allowed || x.State != y.State || x.Limit != y.Limit || x.Remaining != y.Remaining ||
		x.ResetAfter != y.ResetAfter || x.RetryAfter != y.RetryAfter || x.Rule != y.Rule || x.Reason != y.Reason ||
		x.Warning != y.Warning || !reflect.DeepEqual(x.Results, y.Results) {
		t.Fatalf("%s:\nwith escalation %s\nwithout         %s", what, x.AppendJSON(nil), y.AppendJSON(nil))
	}
}

// TestEscalationCounterChangesNoDecision: a rule's escalation counts its callers' requests in a
// counter of its own, in the same store batch, and changes no decision: the same traffic
// through the same rules with and without an escalation gets the same answers, to the units
// remaining, for the rule itself and for the rule without one. The counter counts denied
// requests too: the burst is found on the 6th request, which the rule (3 per minute) denies,
// once per window, on the memory store and on Redis.
func TestEscalationCounterChangesNoDecision(t *testing.T) {
	t.Parallel()
	for _, p := range limiterPairs(t) {
		t.Run(p.name, func(t *testing.T) {
			var a, b sluice.Decision
			send := func(what, endpoint string, cost int64, quota bool) {
				t.Helper()
				ra := sluice.Request{User: p.escalUser, Endpoint: endpoint, Cost: cost}
				rb := sluice.Request{User: p.user, Endpoint: endpoint, Cost: cost}
				call := (*sluice.Limiter).Check
				if quota {
					call = (*sluice.Limiter).Quota
				}
				if err := call(p.escal, ctx, &ra, &a); err != nil {
					t.Fatal(err)
				}
				if err := call(p.plain, ctx, &rb, &b); err != nil {
					t.Fatal(err)
				}
				sameDecision(t, what, &a, &b)
			}
			for i := range 5 {
				send("request "+string(rune('1'+i)), "/search", 1, false)
				send("a look", "/search", 0, true)
				if p.bursts.len() != 0 {
					t.Fatalf("request %d: a burst at %d requests, threshold 5", i+1, i+1)
				}
			}
			send("request 6", "/search", 1, false)
			if a.Allowed || p.bursts.len() != 1 {
				t.Fatalf("request 6: allowed %v, %d bursts; want denied (3 per minute) and counted: 1 burst", a.Allowed, p.bursts.len())
			}
			want := sluice.Burst{Rule: "search", User: p.escalUser, Window: 10 * time.Second, Threshold: 5, Penalty: 5 * time.Minute}
			if got := p.bursts.got[0]; got != want {
				t.Fatalf("burst = %+v, want %+v", got, want)
			}
			for range 10 {
				send("more requests in the window", "/search", 2, false)
				send("another rule", "/other", 1, false)
			}
			if p.bursts.len() != 1 {
				t.Fatalf("%d bursts in one window, want 1", p.bursts.len())
			}
			p.clock.Add(10 * time.Second)
			for range 6 {
				send("the next window", "/search", 1, false)
			}
			if p.bursts.len() != 2 {
				t.Fatalf("%d bursts after two windows of bursting, want 2", p.bursts.len())
			}
			// A burst the rule allows: the counter past its threshold denies nothing.
			for range 12 {
				send("a burst the rule allows", "/list", 1, false)
				if !a.Allowed {
					t.Fatalf("list denied: %+v", a)
				}
			}
			if p.bursts.len() != 3 || p.bursts.got[2].Rule != "list" {
				t.Fatalf("bursts = %+v, want a third, of rule list", p.bursts.got)
			}
		})
	}
}

// TestEscalationNeedsACallerToName: escalation names a caller by its API key or its user; a
// request known only by its address is not counted, nor is an anonymous one.
func TestEscalationNeedsACallerToName(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	got := &bursts{}
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)),
		testutil.Snapshot(t, strings.ReplaceAll(escalationPolicy, "key: [user]", "key: [identity]")), sluice.WithClock(c.Now), sluice.WithBurstHook(got.add))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name  string
		req   sluice.Request
		burst bool
	}{
		{"api key", sluice.Request{APIKey: "k1", User: "u1", Tenant: "acme"}, true},
		{"user of a tenant", sluice.Request{User: "u1", Tenant: "acme"}, true},
		{"address", sluice.Request{IP: "192.0.2.1"}, false},
		{"nobody", sluice.Request{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := got.len()
			var d sluice.Decision
			for range 6 {
				r := tc.req
				r.Endpoint = "/search"
				if err := l.Check(ctx, &r, &d); err != nil {
					t.Fatal(err)
				}
			}
			if n := got.len() - before; n != map[bool]int{true: 1, false: 0}[tc.burst] {
				t.Fatalf("%d bursts, want burst %v", n, tc.burst)
			}
			if tc.burst {
				b := got.got[len(got.got)-1]
				if tc.req.APIKey != "" && (b.APIKey != "k1" || b.User != "" || b.Tenant != "") ||
					tc.req.APIKey == "" && (b.User != "u1" || b.Tenant != "acme" || b.APIKey != "") {
					t.Errorf("burst names %+v", b)
				}
			}
		})
	}
}

// TestEscalationValidation: every mistake in an escalation or adaptive field names it.
func TestEscalationValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, rule, field string
	}{
		{"no window", `escalation: {threshold: 5, penalty: 5m}`, "escalation.window"},
		{"window too short", `escalation: {window: 500us, threshold: 5, penalty: 5m}`, "escalation.window"},
		{"no threshold", `escalation: {window: 10s, penalty: 5m}`, "escalation.threshold"},
		{"negative threshold", `escalation: {window: 10s, threshold: -1, penalty: 5m}`, "escalation.threshold"},
		{"no penalty", `escalation: {window: 10s, threshold: 5}`, "escalation.penalty"},
		{"penalty too short", `escalation: {window: 10s, threshold: 5, penalty: 10ms}`, "escalation.penalty"},
		{"unknown field", `escalation: {window: 10s, threshold: 5, penalty: 5m, ban: 1h}`, "escalation.ban"},
		{"not a map", `escalation: 5`, "escalation"},
		{"bad duration", `escalation: {window: soon, threshold: 5, penalty: 5m}`, "escalation.window"},
		{"adaptive", `adaptive: trusted`, "adaptive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yml := "rules:\n  - {name: r, key: [user], limit: 10, period: 1m, " + tc.rule + "}\n"
			_, err := policy.LoadFiles(map[string][]byte{"p.yaml": []byte(yml)})
			if err == nil || !strings.Contains(err.Error(), "rules[0]."+tc.field+":") {
				t.Fatalf("err = %v, want one naming rules[0].%s", err, tc.field)
			}
		})
	}
	for _, tc := range []struct{ name, body, field string }{
		{"threshold", `{"name":"r","key":["user"],"limit":10,"period":"1m","escalation":{"window":"10s","threshold":0,"penalty":"5m"}}`, "escalation.threshold"},
		{"window type", `{"name":"r","key":["user"],"limit":10,"period":"1m","escalation":{"window":10,"threshold":5,"penalty":"5m"}}`, "escalation.window"},
		{"unknown", `{"name":"r","key":["user"],"limit":10,"period":"1m","escalation":{"window":"10s","threshold":5,"penalty":"5m","x":1}}`, "escalation.x"},
		{"adaptive", `{"name":"r","key":["user"],"limit":10,"period":"1m","adaptive":"always"}`, "adaptive"},
	} {
		t.Run("json "+tc.name, func(t *testing.T) {
			_, err := policy.ParseRule("r", []byte(tc.body))
			if err == nil || !strings.HasPrefix(err.Error(), tc.field+":") {
				t.Fatalf("err = %v, want one naming %s", err, tc.field)
			}
		})
	}
	ok := `{"name":"r","key":["user"],"limit":10,"period":"1m","escalation":{"window":"10s","threshold":50,"penalty":"5m"},"adaptive":"trust"}`
	if _, err := policy.ParseRule("r", []byte(ok)); err != nil {
		t.Fatalf("a valid rule: %v", err)
	}
}

// TestEscalationChecksAllocateNothing: the counter op and a warning cost a check no
// allocation, as Check promises.
func TestEscalationChecksAllocateNothing(t *testing.T) {
	files, err := policy.ParseFiles(map[string][]byte{"p.yaml": []byte(escalationPolicy)})
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.NewClock()
	st := &policy.State{Version: 1, Overrides: []policy.StateOverride{{ID: 1, Override: policy.Override{User: "bob", Rule: "search", Type: policy.OverrideWarn,
		ExpiresAt: c.Now().Add(time.Hour), Reason: "burst", Source: policy.SourceAutomatic}}}}
	snap, skipped := policy.CompileWith(files, st, c.Now())
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), snap, sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var d sluice.Decision
	r := sluice.Request{User: "bob", Endpoint: "/search"}
	l.Check(ctx, &r, &d)
	if d.State != sluice.StateSoft || d.Warning != `rule "search": burst` {
		t.Errorf("bob under a warning: %s", d.AppendJSON(nil))
	}
	for _, r := range []sluice.Request{{User: "alice", Endpoint: "/list"}, {User: "bob", Endpoint: "/list"}} {
		if n := testing.AllocsPerRun(100, func() {
			req := r
			l.Check(ctx, &req, &d)
		}); n != 0 {
			t.Errorf("%s: %v allocations per check, want 0", r.User, n)
		}
	}
}

// TestWarningHeaderNamesTheWarning: when the deciding limit (the least room) is soft for its
// threshold and another limit is soft under a warning override, X-RateLimit-Warning is the
// warning's, and the numbers are the deciding limit's.
func TestWarningHeaderNamesTheWarning(t *testing.T) {
	t.Parallel()
	files, err := policy.ParseFiles(map[string][]byte{"p.yaml": []byte(`
rules:
  - {name: search, match: {endpoint: /search}, key: [user], limit: 1000, period: 1m, escalation: {window: 10s, threshold: 50, penalty: 5m}}
  - {name: per-user, key: [user], limit: 100, period: 1m, soft: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.NewClock()
	st := &policy.State{Version: 1, Overrides: []policy.StateOverride{{ID: 1, Override: policy.Override{User: "bob", Rule: "search", Type: policy.OverrideWarn,
		ExpiresAt: c.Now().Add(time.Hour), Reason: "burst: more than 50 requests within 10s", Source: policy.SourceAutomatic}}}}
	snap, _ := policy.CompileWith(files, st, c.Now())
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), snap, sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var d sluice.Decision
	r := sluice.Request{User: "bob", Endpoint: "/search"}
	if err := l.Check(ctx, &r, &d); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	httplimit.SetHeaders(h, &d)
	if d.Rule != "per-user" || d.Limit != 100 || h.Get("X-RateLimit-Warning") != `rule "search": burst: more than 50 requests within 10s` {
		t.Fatalf("decision %s, X-RateLimit-Warning %q", d.AppendJSON(nil), h.Get("X-RateLimit-Warning"))
	}
}
