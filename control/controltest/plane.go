package controltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

func testAuditFilters(t *testing.T, e *env) {
	t0 := e.clock.Now()
	// alice creates rule a (t0), bob creates rule b (t0+1m), the file loader appends an
	// event (t0+2m), alice deletes a (t0+3m).
	if _, err := e.s.CreateRule(e.ctx, ch(""), "a", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	if _, err := e.s.CreateRule(e.ctx, control.Change{Actor: "bob"}, "b", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	v := e.version()
	file, err := e.s.AppendAudit(e.ctx, control.AuditEvent{
		Actor: "file:/etc/sluice/policy.yaml", Action: control.ActionUpdate, Kind: control.KindPolicyFiles,
		Target: "/etc/sluice/policy.yaml", After: json.RawMessage(`{"rules":3}`), Reason: "reload",
	})
	if err != nil {
		t.Fatalf("AppendAudit: %v", err)
	}
	if file.ID <= 0 || !file.At.Equal(e.now()) || file.Version != 0 {
		t.Errorf("appended event = %+v", file)
	}
	if got := e.version(); got != v {
		t.Errorf("AppendAudit moved the version from %d to %d", v, got)
	}
	e.clock.Advance(time.Minute)
	if _, err := e.s.DeleteRule(e.ctx, ch(""), "a"); err != nil {
		t.Fatal(err)
	}

	type ev struct {
		actor  string
		action control.Action
		target string
	}
	all := []ev{
		{"alice", control.ActionDelete, "a"},
		{"file:/etc/sluice/policy.yaml", control.ActionUpdate, "/etc/sluice/policy.yaml"},
		{"bob", control.ActionCreate, "b"},
		{"alice", control.ActionCreate, "a"},
	}
	evs := e.audit()
	for _, tc := range []struct {
		name string
		f    control.AuditFilter
		want []ev
	}{
		{"everything, newest first", control.AuditFilter{}, all},
		{"since", control.AuditFilter{Since: t0.Add(time.Minute)}, all[:3]},
		{"until", control.AuditFilter{Until: t0.Add(time.Minute)}, all[3:]},
		{"since and until", control.AuditFilter{Since: t0.Add(time.Minute), Until: t0.Add(3 * time.Minute)}, all[1:3]},
		{"actor", control.AuditFilter{Actor: "alice"}, []ev{all[0], all[3]}},
		{"kind", control.AuditFilter{Kind: control.KindPolicyFiles}, all[1:2]},
		{"target", control.AuditFilter{Target: "a"}, []ev{all[0], all[3]}},
		{"action", control.AuditFilter{Action: control.ActionCreate}, all[2:]},
		{"limit", control.AuditFilter{Limit: 2}, all[:2]},
		{"page", control.AuditFilter{BeforeID: evs[1].ID, Limit: 2}, all[2:]},
		{"actor and kind", control.AuditFilter{Actor: "bob", Kind: control.KindRule}, all[2:3]},
		{"no match", control.AuditFilter{Actor: "carol"}, nil},
		{"a target is not a pattern", control.AuditFilter{Target: "%"}, nil},
	} {
		got, err := e.s.Audit(e.ctx, tc.f)
		if err != nil {
			t.Errorf("Audit(%s): %v", tc.name, err)
			continue
		}
		var g []ev
		for _, x := range got {
			g = append(g, ev{x.Actor, x.Action, x.Target})
		}
		if !slices.Equal(g, tc.want) {
			t.Errorf("Audit(%s) = %v, want %v", tc.name, g, tc.want)
		}
	}
	if !sameJSON(t, evs[1].After, json.RawMessage(`{"rules":3}`)) || evs[1].Before != nil || evs[1].Reason != "reload" {
		t.Errorf("appended event read back as %+v", evs[1])
	}

	for _, tc := range []struct {
		name  string
		e     control.AuditEvent
		field string
	}{
		{"no actor", control.AuditEvent{Action: control.ActionUpdate, Kind: control.KindPolicyFiles}, "actor"},
		{"bad action", control.AuditEvent{Actor: "a", Action: "burn", Kind: control.KindPolicyFiles}, "action"},
		{"bad kind", control.AuditEvent{Actor: "a", Action: control.ActionCreate, Kind: "server"}, "kind"},
		{"bad JSON", control.AuditEvent{Actor: "a", Action: control.ActionCreate, Kind: control.KindPenalty, After: json.RawMessage(`{`)}, "after"},
	} {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.AppendAudit(e.ctx, tc.e)
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}
}

func testAuditRetention(t *testing.T, e *env) {
	for i := range 5 {
		if _, err := e.s.CreateRule(e.ctx, ch(""), "r"+strconv.Itoa(i), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(24 * time.Hour)
	}
	// Events at day 0..4; keep the last two days (3 and 4).
	n, err := e.s.PruneAudit(e.ctx, e.clock.Now().Add(-48*time.Hour))
	if err != nil || n != 3 {
		t.Fatalf("PruneAudit = %d, %v; want 3", n, err)
	}
	evs := e.audit()
	if len(evs) != 2 || evs[0].Target != "r4" || evs[1].Target != "r3" {
		t.Errorf("left after pruning: %+v", evs)
	}
	if n, err := e.s.PruneAudit(e.ctx, time.Time{}); err != nil || n != 0 {
		t.Errorf("PruneAudit(zero time) = %d, %v; want nothing pruned", n, err)
	}
	// Retention prunes the log, not the resources.
	if rules, _ := e.s.ListRules(e.ctx); len(rules) != 5 {
		t.Errorf("%d rules after pruning the audit log, want 5", len(rules))
	}
}

func testVersionAndLoad(t *testing.T, e *env) {
	empty, err := e.s.Load(e.ctx)
	if err != nil || empty.Version != 0 || len(empty.Rules)+len(empty.Overrides)+len(empty.Exemptions)+len(empty.Identities) != 0 {
		t.Fatalf("Load of an empty store = %+v, %v", empty, err)
	}
	r, _ := e.s.CreateRule(e.ctx, ch(""), "r", json.RawMessage(`{"limit":1}`))
	o1, _ := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Minute))
	o2, _ := e.s.CreateOverride(e.ctx, ch(""), e.override("globex", "", time.Hour))
	x1, _ := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{Tenant: "partner"})
	soon := e.clock.Now().Add(time.Minute)
	if _, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{IP: "192.0.2.1", ExpiresAt: &soon}); err != nil {
		t.Fatal(err)
	}
	i1, _, _ := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityTenant, Value: "acme", Tier: "gold"})
	if v := e.version(); v != 6 {
		t.Fatalf("version after 6 changes = %d", v)
	}
	e.clock.Advance(time.Minute) // o1 and the IP exemption expire
	st, err := e.s.Load(e.ctx)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &control.State{
		Version: 6, At: e.now(),
		Rules: []control.Rule{r}, Overrides: []control.Override{o2},
		Exemptions: []control.Exemption{x1}, Identities: []control.Identity{i1},
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("Load = %+v\nwant %+v", st, want)
	}
	_ = o1
}

// testLoadReportsProgress: Load reports its progress as it reads (control.ReportProgress), at
// least once per table and once more per 256 rows, so that the follower can hold a large
// store's read to a deadline on progress rather than on the whole read.
func testLoadReportsProgress(t *testing.T, e *env) {
	const identities = 2*256 + 8
	for i := range identities {
		if _, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityAPIKey, Value: fmt.Sprint("key-", i), Tier: "gold"}); err != nil {
			t.Fatal(err)
		}
	}
	var calls int
	st, err := e.s.Load(control.WithProgress(e.ctx, func() { calls++ }))
	if err != nil || len(st.Identities) != identities {
		t.Fatalf("Load = %d identities, %v; want %d", len(st.Identities), err, identities)
	}
	if want := 4 + identities/256; calls < want {
		t.Errorf("Load reported progress %d times, want at least %d (each of 4 tables, and every 256 rows)", calls, want)
	}
}

// testWatchOtherStore makes a change through one Store and waits for a second Store on the
// same database (another node, for PostgreSQL) to announce it.
func testWatchOtherStore(t *testing.T, e *env) {
	other := e.open()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	w := other.Watch(ctx)
	own := e.s.Watch(ctx)
	// No waiting for a PostgreSQL listener to be ready: one that starts listening after the
	// change below announces the version it then finds.

	for i := 1; i <= 3; i++ {
		if _, err := e.s.CreateRule(e.ctx, ch(""), "r"+strconv.Itoa(i), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		waitVersion(t, w, int64(i), "the other store")
		waitVersion(t, own, int64(i), "the changing store")
	}
	// A failed change announces nothing; the next good one does.
	if _, err := e.s.CreateRule(e.ctx, ch(""), "r1", json.RawMessage(`{}`)); !errors.Is(err, control.ErrConflict) {
		t.Fatal(err)
	}
	if _, err := other.DeleteRule(e.ctx, ch(""), "r1"); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, own, 4, "the first store, for a change made by the other")

	// A reader that does not keep up gets the latest version, not a backlog.
	for i := range 20 {
		if _, err := e.s.CreateRule(e.ctx, ch(""), "burst"+strconv.Itoa(i), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	waitVersion(t, w, 24, "the other store, after a burst")
}

// waitVersion reads w until it announces at least want. One second is the propagation bound
// the control plane promises; a notification normally takes milliseconds.
func waitVersion(t *testing.T, w <-chan int64, want int64, who string) {
	t.Helper()
	deadline := time.After(time.Second)
	for {
		select {
		case v, ok := <-w:
			if !ok {
				t.Fatalf("%s: watch channel closed waiting for version %d", who, want)
			}
			if v >= want {
				return
			}
		case <-deadline:
			t.Fatalf("%s: version %d not announced within 1s", who, want)
		}
	}
}

func testWatchClose(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(e.ctx)
	w := e.s.Watch(ctx)
	cancel()
	closed(t, w, "after its context ended")

	other := e.open()
	w = other.Watch(e.ctx)
	if err := other.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed(t, w, "after its Store closed")
	if err := other.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	closed(t, other.Watch(e.ctx), "from a closed Store")
	// The first Store is unaffected by the other's Close.
	w = e.s.Watch(e.ctx)
	if _, err := e.s.CreateRule(e.ctx, ch(""), "r", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, w, 1, "the open store")
}

// closed waits (1 s at most) for w to be closed, skipping values still buffered.
func closed(t *testing.T, w <-chan int64, when string) {
	t.Helper()
	deadline := time.After(time.Second)
	for {
		select {
		case _, ok := <-w:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("watch channel still open %s", when)
		}
	}
}

func testExpire(t *testing.T, e *env) {
	o1, _ := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Minute))
	o2, _ := e.s.CreateOverride(e.ctx, ch(""), e.override("globex", "", time.Hour))
	soon := e.clock.Now().Add(30 * time.Second)
	x1, _ := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "u", ExpiresAt: &soon})
	x2, _ := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "v"})

	if n, v, err := e.s.Expire(e.ctx); err != nil || n != 0 || v != 0 {
		t.Fatalf("Expire with nothing due = %d, %d, %v", n, v, err)
	}
	if e.version() != 4 || len(e.audit()) != 4 {
		t.Errorf("an Expire with nothing due changed something: version %d, %d events", e.version(), len(e.audit()))
	}
	e.clock.Advance(time.Minute) // o1 (exactly due) and x1
	n, v, err := e.s.Expire(e.ctx)
	if err != nil || n != 2 || v != 5 {
		t.Fatalf("Expire = %d, %d, %v; want 2 in version 5", n, v, err)
	}
	evs := e.audit()[:2]
	targets := []string{evs[0].Target, evs[1].Target}
	slices.Sort(targets)
	wantTargets := []string{strconv.FormatInt(o1.ID, 10), strconv.FormatInt(x1.ID, 10)}
	slices.Sort(wantTargets)
	for _, ev := range evs {
		if ev.Action != control.ActionExpire || ev.Actor != control.ActorSystem || ev.Version != 5 || ev.Before == nil || ev.After != nil {
			t.Errorf("expire event = %+v", ev)
		}
	}
	if !slices.Equal(targets, wantTargets) {
		t.Errorf("expired %v, want %v", targets, wantTargets)
	}
	if _, err := e.s.GetOverride(e.ctx, o1.ID); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("expired override still there: %v", err)
	}
	if _, err := e.s.GetExemption(e.ctx, x1.ID); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("expired exemption still there: %v", err)
	}
	for _, err := range []error{
		func() error { _, err := e.s.GetOverride(e.ctx, o2.ID); return err }(),
		func() error { _, err := e.s.GetExemption(e.ctx, x2.ID); return err }(),
	} {
		if err != nil {
			t.Errorf("a live resource went: %v", err)
		}
	}
	if n, _, _ := e.s.Expire(e.ctx); n != 0 {
		t.Errorf("a second Expire found %d", n)
	}
}

func testHeartbeats(t *testing.T, e *env) {
	beat := func(n control.Node) {
		t.Helper()
		if err := e.s.Heartbeat(e.ctx, n); err != nil {
			t.Fatalf("Heartbeat(%+v): %v", n, err)
		}
	}
	beat(control.Node{ID: "node-b", Addr: "10.0.0.2:8080", PolicyVersion: 3})
	e.clock.Advance(5 * time.Second)
	beat(control.Node{ID: "node-a", Addr: "10.0.0.1:8080", PolicyVersion: 4})
	v := e.version()
	nodes, err := e.s.Nodes(e.ctx, e.clock.Now().Add(-10*time.Second))
	want := []control.Node{
		{ID: "node-a", Addr: "10.0.0.1:8080", PolicyVersion: 4, SeenAt: e.now()},
		{ID: "node-b", Addr: "10.0.0.2:8080", PolicyVersion: 3, SeenAt: e.now().Add(-5 * time.Second)},
	}
	if err != nil || !reflect.DeepEqual(nodes, want) {
		t.Errorf("Nodes = %+v, %v\nwant %+v", nodes, err, want)
	}
	// Live nodes only: b was last seen 5 s ago.
	nodes, _ = e.s.Nodes(e.ctx, e.clock.Now().Add(-time.Second))
	if len(nodes) != 1 || nodes[0].ID != "node-a" {
		t.Errorf("Nodes(last second) = %+v, want node-a", nodes)
	}
	e.clock.Advance(time.Second)
	beat(control.Node{ID: "node-b", Addr: "10.0.0.2:9090", PolicyVersion: 4})
	nodes, _ = e.s.Nodes(e.ctx, e.clock.Now())
	if len(nodes) != 1 || nodes[0].Addr != "10.0.0.2:9090" || nodes[0].PolicyVersion != 4 {
		t.Errorf("after b's new heartbeat: %+v", nodes)
	}
	if e.version() != v || len(e.audit()) != 0 {
		t.Errorf("heartbeats are not changes: version %d, %d audit events", e.version(), len(e.audit()))
	}
	if n, err := e.s.PruneNodes(e.ctx, e.clock.Now()); err != nil || n != 1 {
		t.Errorf("PruneNodes = %d, %v; want node-a pruned", n, err)
	}
	if err := e.s.Heartbeat(e.ctx, control.Node{Addr: "x"}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a heartbeat without id: %v", err)
	}
	if err := e.s.Heartbeat(e.ctx, control.Node{ID: "n", PolicyVersion: -1}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a negative policy version: %v", err)
	}
	// Stats ride along with the heartbeat, replaced by each one; bad ones change nothing.
	stats := []byte(`{"rules":[{"rule":"r","allowed":3}]}`)
	statsOf := func() []byte {
		nodes, _ := e.s.Nodes(e.ctx, e.clock.Now())
		for _, n := range nodes {
			if n.ID == "node-s" {
				return n.Stats
			}
		}
		t.Fatalf("node-s not listed: %+v", nodes)
		return nil
	}
	beat(control.Node{ID: "node-s", Addr: "s", PolicyVersion: 4, Stats: stats})
	if got := statsOf(); string(got) != string(stats) {
		t.Errorf("stats = %s, want %s", got, stats)
	}
	for _, bad := range [][]byte{[]byte(`{"rules":`), make([]byte, control.MaxNodeStatsLen+1)} {
		var ie *control.InvalidError
		if err := e.s.Heartbeat(e.ctx, control.Node{ID: "node-s", Stats: bad}); !errors.As(err, &ie) || ie.Field != "stats" {
			t.Errorf("bad stats (%d bytes): %v", len(bad), err)
		}
	}
	beat(control.Node{ID: "node-s", Addr: "s", PolicyVersion: 4})
	if got := statsOf(); got != nil {
		t.Errorf("a heartbeat without stats kept the old ones: %s", got)
	}
}

// hostile are strings that break naively built SQL, LIKE patterns, JSON or byte-counting
// length checks; every one must come back exactly as it went in.
var hostile = []string{
	`'; DROP TABLE rules; --`,
	`" OR 1=1 --`,
	`Robert'); DELETE FROM tokens WHERE ('1'='1`,
	`\'\\"\x00`, // a backslash, quote and the text \x00 (not a NUL byte)
	`%_*?[]`,
	"tab\tnewline\nreturn\r",
	"ünïcødé 名前 🚦🚦 עברית \u202e",
	"e\u0301", // a combining accent
	strings.Repeat("🚦", control.MaxValueLen), // the longest value, at 4 bytes a character
	"$1 ?1 :name @p", // placeholder syntax
	`{"json":"looking"}`,
}

func testHostileStrings(t *testing.T, e *env) {
	for i, s := range hostile {
		name := s
		if len([]rune(name)) > control.MaxNameLen {
			name = string([]rune(name)[:control.MaxNameLen])
		}
		actor := s
		if len([]rune(actor)) > control.MaxActorLen {
			actor = string([]rune(actor)[:control.MaxActorLen])
		}
		c := control.Change{Actor: actor, Reason: s}
		body, _ := json.Marshal(map[string]string{"name": s})
		if _, err := e.s.CreateRule(e.ctx, c, name, body); err != nil {
			t.Errorf("CreateRule(%q): %v", name, err)
			continue
		}
		if got, err := e.s.GetRule(e.ctx, name); err != nil || got.Name != name || string(got.Body) != string(body) || got.UpdatedBy != actor {
			t.Errorf("GetRule(%q) = %+v, %v", name, got, err)
		}
		o, err := e.s.CreateOverride(e.ctx, c, control.Override{
			Tenant: s, User: s, APIKey: s, Endpoint: s, Rule: name, Type: control.OverrideBan,
			ExpiresAt: e.clock.Now().Add(time.Hour), Reason: s, Source: control.SourceAPI,
		})
		if err != nil {
			t.Errorf("CreateOverride(%q): %v", s, err)
			continue
		}
		got, err := e.s.GetOverride(e.ctx, o.ID)
		if err != nil || !reflect.DeepEqual(got, o) || got.Tenant != s || got.Reason != s {
			t.Errorf("GetOverride for %q = %+v, %v", s, got, err)
		}
		if list, err := e.s.ListOverrides(e.ctx, control.OverrideFilter{Tenant: s, User: s, APIKey: s}); err != nil || len(list) != 1 || list[0].ID != o.ID {
			t.Errorf("ListOverrides filtered on %q = %+v, %v", s, list, err)
		}
		x, err := e.s.CreateExemption(e.ctx, c, control.Exemption{User: s, Reason: s})
		if err != nil {
			t.Errorf("CreateExemption(%q): %v", s, err)
		} else if got, err := e.s.GetExemption(e.ctx, x.ID); err != nil || got.User != s || got.Reason != s {
			t.Errorf("GetExemption for %q = %+v, %v", s, got, err)
		}
		id := control.Identity{Kind: control.IdentityAPIKey, Value: s, Tier: s, Tenant: s, User: s}
		if _, _, err := e.s.PutIdentity(e.ctx, c, id); err != nil {
			t.Errorf("PutIdentity(%q): %v", s, err)
		} else if got, err := e.s.GetIdentity(e.ctx, control.IdentityAPIKey, s); err != nil || got.Value != s || got.Tier != s || got.User != s {
			t.Errorf("GetIdentity(%q) = %+v, %v", s, got, err)
		}
		tok := control.Token{Name: name, Role: control.RoleRead, Hash: control.HashToken(strconv.Itoa(i))}
		if _, err := e.s.CreateToken(e.ctx, c, tok); err != nil {
			t.Errorf("CreateToken(%q): %v", name, err)
		} else if got, err := e.s.GetToken(e.ctx, name); err != nil || got.Name != name {
			t.Errorf("GetToken(%q) = %+v, %v", name, got, err)
		}
		if err := e.s.Heartbeat(e.ctx, control.Node{ID: actor, Addr: actor}); err != nil {
			t.Errorf("Heartbeat(%q): %v", actor, err)
		}
		evs, err := e.s.Audit(e.ctx, control.AuditFilter{Actor: actor, Target: name, Kind: control.KindRule})
		if err != nil || len(evs) != 1 || evs[0].Reason != s || evs[0].Actor != actor {
			t.Errorf("Audit filtered on %q = %+v, %v", actor, evs, err)
		}
	}
	// Nothing was dropped or rewritten on the way.
	st, err := e.s.Load(e.ctx)
	if err != nil || len(st.Rules) != len(hostile) || len(st.Overrides) != len(hostile) || len(st.Identities) != len(hostile) {
		t.Errorf("Load after hostile writes: %d rules, %d overrides, %d identities, %v; want %d each",
			len(st.Rules), len(st.Overrides), len(st.Identities), err, len(hostile))
	}
	nodes, _ := e.s.Nodes(e.ctx, time.Time{})
	if len(nodes) != len(hostile) {
		t.Errorf("%d nodes, want %d", len(nodes), len(hostile))
	}
}

// testRejectedStrings: what one database would keep and the other refuse is refused by both,
// before it reaches either, with the field named.
func testRejectedStrings(t *testing.T, e *env) {
	for _, tc := range []struct {
		name, s string
	}{
		{"NUL", "a\x00b"},
		{"invalid UTF-8", "a\xffb"},
		{"too long", strings.Repeat("x", control.MaxValueLen+1)},
	} {
		e.unchanged("override tenant, "+tc.name, control.ErrInvalid, func() error {
			o := e.override(tc.s, "", time.Hour)
			_, err := e.s.CreateOverride(e.ctx, ch(""), o)
			invalid(t, tc.name, err, "tenant")
			return err
		})
		e.unchanged("identity value, "+tc.name, control.ErrInvalid, func() error {
			_, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityUser, Value: tc.s})
			invalid(t, tc.name, err, "value")
			return err
		})
		e.unchanged("exemption reason, "+tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "u", Reason: tc.s + strings.Repeat("r", control.MaxReasonLen)})
			invalid(t, tc.name, err, "reason")
			return err
		})
		e.unchanged("actor, "+tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateRule(e.ctx, control.Change{Actor: tc.s + strings.Repeat("a", control.MaxActorLen)}, "r", json.RawMessage(`{}`))
			invalid(t, tc.name, err, "actor")
			return err
		})
	}
	// JSON's escaped NUL is text, not a NUL byte: it is kept.
	body := json.RawMessage(`{"name":"a\u0000b"}`)
	if r, err := e.s.CreateRule(e.ctx, ch(""), "escaped-nul", body); err != nil || string(r.Body) != string(body) {
		t.Errorf("CreateRule with an escaped NUL = %+v, %v", r, err)
	}
}

// testReopen closes the Store and opens the database again: everything is still there.
func testReopen(t *testing.T, e *env) {
	r, _ := e.s.CreateRule(e.ctx, ch(""), "r", json.RawMessage(`{"limit":1}`))
	o, _ := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Hour))
	x, _ := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{IP: "10.0.0.0/8"})
	i, _, _ := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityUser, Value: "john", Tier: "gold"})
	tok, _ := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ci", Role: control.RoleAdmin, Hash: control.HashToken("x")})
	if err := e.s.Heartbeat(e.ctx, control.Node{ID: "n1", PolicyVersion: 5}); err != nil {
		t.Fatal(err)
	}
	before, err := e.s.Load(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	events := e.audit()
	if err := e.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	e.s = e.open() // migrations run again and find nothing to do
	after, err := e.s.Load(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) || after.Version != 5 {
		t.Errorf("after reopening: %+v\nwant %+v", after, before)
	}
	if got, err := e.s.TokenByHash(e.ctx, control.HashToken("x")); err != nil || !reflect.DeepEqual(got, tok) {
		t.Errorf("token after reopening = %+v, %v", got, err)
	}
	if got := e.audit(); !reflect.DeepEqual(got, events) {
		t.Errorf("audit log after reopening: %d events, want %d", len(got), len(events))
	}
	if nodes, _ := e.s.Nodes(e.ctx, time.Time{}); len(nodes) != 1 {
		t.Errorf("nodes after reopening = %+v", nodes)
	}
	// And it goes on where it stopped.
	r2, err := e.s.UpdateRule(e.ctx, ch(r.ETag()), "r", json.RawMessage(`{"limit":2}`))
	if err != nil || r2.Version != 6 {
		t.Errorf("UpdateRule after reopening = %+v, %v; want version 6", r2, err)
	}
	_, _, _ = o, x, i
}

// testConcurrentWriters writes from many goroutines through two Stores: every change gets its
// own version, none is lost, and the audit log has one event per change.
func testConcurrentWriters(t *testing.T, e *env) {
	other := e.open()
	const writers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		s := e.s
		if w%2 == 1 {
			s = other
		}
		wg.Go(func() {
			for i := range each {
				o := e.override(fmt.Sprintf("tenant-%d-%d", w, i), "", time.Hour)
				if _, err := s.CreateOverride(e.ctx, ch(""), o); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent CreateOverride: %v", err)
	}
	if v := e.version(); v != writers*each {
		t.Errorf("version = %d, want %d", v, writers*each)
	}
	evs := e.audit()
	versions := map[int64]bool{}
	for _, ev := range evs {
		versions[ev.Version] = true
	}
	if len(evs) != writers*each || len(versions) != writers*each {
		t.Errorf("%d audit events with %d distinct versions, want %d of each", len(evs), len(versions), writers*each)
	}
}
