package escalation_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/escalation"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// escalationPolicy escalates bursts at /search; /other has a rule without escalation. Neither
// limit is reached: every warning and denial comes from escalation.
const escalationPolicy = `
rules:
  - {name: search, match: {endpoint: /search}, key: [tenant, user], algorithm: token_bucket, limit: 1000, period: 1s, escalation: {window: 10s, threshold: 5, penalty: 5m}}
  - {name: other, match: {endpoint: /other}, key: [tenant, user], algorithm: token_bucket, limit: 1000, period: 1s}
`

// fleet is one or more nodes deciding with one store and one control store, on one clock.
type fleet struct {
	clock  *testutil.Clock
	ctrl   control.Store
	nodes  []*sluice.Limiter
	rts    []*follower.Runtime
	mu     sync.Mutex
	bursts []sluice.Burst
	next   int // the node that decides the next request
}

func (f *fleet) hook(b sluice.Burst) { f.mu.Lock(); f.bursts = append(f.bursts, b); f.mu.Unlock() }

// newFleet starts len(stores) nodes, each a Limiter over its store following ctrl through a
// Runtime; hook, when set, replaces the fleet's own burst hook.
func newFleet(t *testing.T, c *testutil.Clock, stores []sluice.Store, hook func(sluice.Burst)) *fleet {
	t.Helper()
	f := &fleet{clock: c}
	ctrl, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "control.db"), control.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrl.Close() })
	f.ctrl = ctrl
	files, err := policy.ParseFiles(map[string][]byte{"policy.yaml": []byte(escalationPolicy)})
	if err != nil {
		t.Fatal(err)
	}
	if hook == nil {
		hook = f.hook
	}
	for i, st := range stores {
		lim, err := sluice.New(st, files.Snapshot(), sluice.WithClock(c.Now), sluice.WithBurstHook(hook))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		rt, err := follower.New(follower.Options{Store: ctrl, Limiter: lim, Files: files, NodeID: "node" + strconv.Itoa(i), Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		rt.Start(t.Context())
		t.Cleanup(rt.Close)
		f.nodes, f.rts = append(f.nodes, lim), append(f.rts, rt)
	}
	return f
}

// check decides one request of user at endpoint on the next node, in turn.
func (f *fleet) check(t *testing.T, user, endpoint string) *sluice.Decision {
	t.Helper()
	d := &sluice.Decision{}
	r := sluice.Request{Tenant: "acme", User: user, Endpoint: endpoint}
	if err := f.nodes[f.next%len(f.nodes)].Check(context.Background(), &r, d); err != nil {
		t.Fatal(err)
	}
	f.next++
	return d
}

// sync makes every node enforce control version v.
func (f *fleet) sync(t *testing.T, v int64) {
	t.Helper()
	for _, rt := range f.rts {
		if err := rt.Sync(t.Context(), v); err != nil {
			t.Fatal(err)
		}
	}
}

// burstCount returns how many bursts the nodes reported.
func (f *fleet) burstCount() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.bursts) }

// escalate writes the penalty of the last burst reported, as the escalator's goroutine does,
// and has every node enforce it.
func (f *fleet) escalate(t *testing.T, esc *escalation.Escalator) control.Override {
	t.Helper()
	f.mu.Lock()
	b := f.bursts[len(f.bursts)-1]
	f.mu.Unlock()
	o, err := esc.Escalate(t.Context(), b)
	if err != nil {
		t.Fatalf("Escalate(%+v): %v", b, err)
	}
	f.sync(t, o.Version)
	return o
}

// lastAudit returns the newest audit event.
func (f *fleet) lastAudit(t *testing.T) control.AuditEvent {
	t.Helper()
	evs, err := f.ctrl.Audit(t.Context(), control.AuditFilter{Limit: 1})
	if err != nil || len(evs) != 1 {
		t.Fatalf("Audit: %v, %v", evs, err)
	}
	return evs[0]
}

// TestEscalationStates walks a caller through every state of a rule's escalation, with an
// injected clock: normal; more than 5 requests within 10 s warns it (soft decisions with
// X-RateLimit-Warning naming the rule and the burst, audit burst_detected_warning); a burst
// while warned bans it from the rule (audit burst_detected_blocked); the ban ends after the
// penalty, and the caller is back to normal. On the memory store (one node) and on Redis
// (two nodes sharing it, the requests of a burst spread over both: the fleet counts them
// together and reports the burst once).
func TestEscalationStates(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		nodes int
	}{{"memory", 1}, {"redis", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := testutil.NewClock()
			var stores []sluice.Store
			if tc.name == "memory" {
				stores = append(stores, memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)))
			} else {
				// A day ahead of the real clock: Redis expires keys by it.
				c.Add(time.Now().Add(48 * time.Hour).Truncate(24 * time.Hour).Sub(c.Now()))
				for range tc.nodes {
					rs, err := redis.New(t.Context(), "redis://"+srv.Addr, redis.WithTimeForTests(c.Micros), redis.WithTimeout(10*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					stores = append(stores, rs)
				}
			}
			f := newFleet(t, c, stores, nil)
			esc, err := escalation.New(escalation.Options{Store: f.ctrl, Now: c.Now})
			if err != nil {
				t.Fatal(err)
			}

			// Normal: up to the threshold, nothing happens.
			for i := range 5 {
				if d := f.check(t, "bob", "/search"); !d.Allowed || d.State != sluice.StateNormal || d.Warning != "" {
					t.Fatalf("request %d: %s", i+1, d.AppendJSON(nil))
				}
			}
			if n := f.burstCount(); n != 0 {
				t.Fatalf("%d bursts at the threshold", n)
			}
			// The 6th request within the window is a burst, reported once by the fleet.
			f.check(t, "bob", "/search")
			if n := f.burstCount(); n != 1 {
				t.Fatalf("%d bursts after 6 requests, want 1", n)
			}
			warn := f.escalate(t, esc)
			if warn.Type != control.OverrideWarn || warn.User != "bob" || warn.Tenant != "acme" || warn.Rule != "search" ||
				warn.Source != control.SourceAutomatic || !warn.ExpiresAt.Equal(c.Now().Add(5*time.Minute)) {
				t.Fatalf("warning = %+v", warn)
			}
			ev := f.lastAudit(t)
			if ev.Action != control.ActionBurstWarning || ev.Actor != control.ActorAbuseDetector || ev.Kind != control.KindOverride ||
				ev.Target != strconv.FormatInt(warn.ID, 10) || !strings.Contains(ev.Reason, "more than 5 requests within 10s") {
				t.Fatalf("warning's audit event = %+v", ev)
			}

			// Warned: soft, with the warning header, on every node; others and other rules
			// are untouched.
			for range len(f.nodes) {
				d := f.check(t, "bob", "/search")
				h := http.Header{}
				httplimit.SetHeaders(h, d)
				w := h.Get("X-RateLimit-Warning")
				if !d.Allowed || d.State != sluice.StateSoft || d.Results[0].Warning == "" || w != d.Warning ||
					!strings.Contains(w, `rule "search"`) || !strings.Contains(w, "more than 5 requests within 10s") {
					t.Fatalf("warned: %s, X-RateLimit-Warning %q", d.AppendJSON(nil), w)
				}
			}
			if d := f.check(t, "alice", "/search"); d.State != sluice.StateNormal {
				t.Fatalf("another caller: %s", d.AppendJSON(nil))
			}
			if d := f.check(t, "bob", "/other"); d.State != sluice.StateNormal || d.Warning != "" {
				t.Fatalf("bob on another rule: %s", d.AppendJSON(nil))
			}

			// A burst while warned (the next window) bans bob from the rule.
			c.Add(10 * time.Second)
			for i := range 6 {
				if d := f.check(t, "bob", "/search"); !d.Allowed || d.State != sluice.StateSoft {
					t.Fatalf("warned, request %d: %s", i+1, d.AppendJSON(nil))
				}
			}
			if n := f.burstCount(); n != 2 {
				t.Fatalf("%d bursts after the second, want 2", n)
			}
			ban := f.escalate(t, esc)
			if ban.Type != control.OverrideBan || ban.User != "bob" || ban.Rule != "search" || !ban.ExpiresAt.Equal(c.Now().Add(5*time.Minute)) {
				t.Fatalf("ban = %+v", ban)
			}
			ev = f.lastAudit(t)
			var before control.Override
			if ev.Action != control.ActionBurstBlocked || ev.Actor != control.ActorAbuseDetector ||
				json.Unmarshal(ev.Before, &before) != nil || before.ID != warn.ID {
				t.Fatalf("ban's audit event = %+v", ev)
			}
			for range len(f.nodes) {
				d := f.check(t, "bob", "/search")
				if d.Allowed || d.State != sluice.StateHard || d.RetryAfter != 5*time.Minute ||
					!strings.HasPrefix(d.Reason, "banned: burst again while warned: more than 5 requests within 10s") {
					t.Fatalf("banned: %s", d.AppendJSON(nil))
				}
			}
			if d := f.check(t, "bob", "/other"); !d.Allowed || d.State != sluice.StateNormal {
				t.Fatalf("banned from search, on another rule: %s", d.AppendJSON(nil))
			}
			// A banned caller is not counted: its requests reach no store.
			for range 10 {
				f.check(t, "bob", "/search")
			}
			if n := f.burstCount(); n != 2 {
				t.Fatalf("%d bursts while banned, want none more", n)
			}

			// The ban ends after the penalty: normal again, and the next burst warns afresh.
			c.Add(5 * time.Minute)
			for i := range 5 {
				if d := f.check(t, "bob", "/search"); !d.Allowed || d.State != sluice.StateNormal || d.Warning != "" {
					t.Fatalf("after the ban, request %d: %s", i+1, d.AppendJSON(nil))
				}
			}
			f.check(t, "bob", "/search")
			if again := f.escalate(t, esc); again.Type != control.OverrideWarn {
				t.Fatalf("a burst after the ban ended: %+v, want a warning", again)
			}
			if ev := f.lastAudit(t); ev.Action != control.ActionBurstWarning {
				t.Fatalf("audit = %+v", ev)
			}
		})
	}
}

// TestReportWritesPenalties: bursts that the burst hook reports reach the control store off the
// hot path (Report queues; Start's goroutine writes), and the node enforces the warning.
func TestReportWritesPenalties(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	var esc *escalation.Escalator
	f := newFleet(t, c, []sluice.Store{memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0))},
		func(b sluice.Burst) { esc.Report(b) })
	var err error
	esc, err = escalation.New(escalation.Options{Store: f.ctrl, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	esc.Start(t.Context(), f.rts[0].Sync)
	defer esc.Close()
	for range 6 {
		f.check(t, "bob", "/search")
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.check(t, "bob", "/search").State != sluice.StateSoft {
		if time.Now().After(deadline) {
			t.Fatal("no warning 10 s after the burst")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ev := f.lastAudit(t); ev.Action != control.ActionBurstWarning {
		t.Fatalf("audit = %+v", ev)
	}
}

// TestReportNeverBlocks: with the queue full, Report drops and counts.
func TestReportNeverBlocks(t *testing.T) {
	t.Parallel()
	ctrl, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "control.db"), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	esc, err := escalation.New(escalation.Options{Store: ctrl, QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		esc.Report(sluice.Burst{Rule: "r", User: "u", Penalty: time.Minute}) // not started: nothing reads
	}
	if got := esc.Dropped(); got != 3 {
		t.Fatalf("Dropped = %d, want 3", got)
	}
}

// TestOperatorOverrideStands: a caller's target holding an override that is not a warning
// (here an operator's multiplier for the same rule) is left as it is.
func TestOperatorOverrideStands(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	ctrl, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "control.db"), control.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	if _, err := ctrl.CreateOverride(t.Context(), control.Change{Actor: "alice"}, control.Override{
		Tenant: "acme", User: "bob", Rule: "search", Type: control.OverrideMultiplier, Value: 2,
		ExpiresAt: c.Now().Add(time.Hour), Source: control.SourceAPI,
	}); err != nil {
		t.Fatal(err)
	}
	esc, err := escalation.New(escalation.Options{Store: ctrl, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	b := sluice.Burst{Rule: "search", Tenant: "acme", User: "bob", Window: 10 * time.Second, Threshold: 5, Penalty: 5 * time.Minute}
	if _, err := esc.Escalate(t.Context(), b); err != escalation.ErrOverridden {
		t.Fatalf("Escalate over an operator's override: %v, want ErrOverridden", err)
	}
	// Another rule of the same caller is another target: warned.
	b.Rule = "other"
	if o, err := esc.Escalate(t.Context(), b); err != nil || o.Type != control.OverrideWarn {
		t.Fatalf("Escalate on another rule: %+v, %v", o, err)
	}
}
