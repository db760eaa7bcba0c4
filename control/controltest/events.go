package controltest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testCountsAddUp flushes counts from two Stores (two nodes) and reads back their sums.
func testCountsAddUp(t *testing.T, e *env) {
	other := e.open()
	m0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	flush := func(s control.Store, u []control.UsageCount, v []control.ViolationCount) {
		t.Helper()
		if err := s.AddCounts(e.ctx, u, v); err != nil {
			t.Fatalf("AddCounts: %v", err)
		}
	}
	// Node A: minute 0 and 1 of rule r for acme; node B: minute 0 again (seconds inside the
	// minute are truncated), and globex. Each node flushes twice.
	for range 2 {
		flush(e.s, []control.UsageCount{
			{Minute: m0.Add(10 * time.Second), Rule: "r", Tenant: "acme", Allowed: 10, Denied: 2, Soft: 1},
			{Minute: m0.Add(time.Minute), Rule: "r", Tenant: "acme", Allowed: 5},
			{Minute: m0.Add(10 * time.Second), Rule: control.DecisionRule, Tenant: "acme", Allowed: 8, Denied: 2, Soft: 1},
			{Minute: m0.Add(time.Minute), Rule: control.DecisionRule, Tenant: "acme", Allowed: 5},
		}, []control.ViolationCount{
			{Minute: m0, Rule: "r", Tenant: "acme", User: "john", Denied: 2, Soft: 1, Limit: 100},
		})
		flush(other, []control.UsageCount{
			{Minute: m0.Add(59 * time.Second), Rule: "r", Tenant: "acme", Allowed: 1, Denied: 1},
			{Minute: m0, Rule: "r", Tenant: "globex", Allowed: 7},
			{Minute: m0.Add(61 * time.Minute), Rule: "other", Tenant: "acme", Allowed: 3},
			{Minute: m0.Add(59 * time.Second), Rule: control.DecisionRule, Tenant: "acme", Allowed: 1},
			{Minute: m0, Rule: control.DecisionRule, Tenant: "acme", Denied: 1}, // the same row twice: adds up
			{Minute: m0, Rule: control.DecisionRule, Tenant: "globex", Allowed: 7},
			{Minute: m0.Add(61 * time.Minute), Rule: control.DecisionRule, Tenant: "acme", Allowed: 3},
		}, []control.ViolationCount{
			{Minute: m0, Rule: "r", Tenant: "acme", User: "john", Denied: 1, Limit: 100},
			{Minute: m0.Add(time.Minute), Rule: "r", Tenant: "acme", APIKey: "k:1a2b", IP: "192.0.2.1", Endpoint: "/api", Soft: 4, Limit: 100},
		})
	}
	for _, tc := range []struct {
		name string
		f    control.UsageFilter
		want []control.UsagePoint
	}{
		{"per minute, acme, rule r", control.UsageFilter{Rule: "r", Tenant: "acme", Step: time.Minute}, []control.UsagePoint{
			{At: m0, Allowed: 22, Denied: 6, Soft: 2},
			{At: m0.Add(time.Minute), Allowed: 10},
		}},
		{"per hour, rule r, every tenant", control.UsageFilter{Rule: "r", Step: time.Hour}, []control.UsagePoint{
			{At: m0, Allowed: 46, Denied: 6, Soft: 2},
		}},
		// Without a rule: the per-decision rows only, never the rules' rows added up.
		{"per hour, decisions, every tenant", control.UsageFilter{Step: time.Hour}, []control.UsagePoint{
			{At: m0, Allowed: 42, Denied: 6, Soft: 2},
			{At: m0.Add(time.Hour), Allowed: 6},
		}},
		{"per day, decisions", control.UsageFilter{Tenant: "acme", Step: 24 * time.Hour}, []control.UsagePoint{
			{At: time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC), Allowed: 34, Denied: 6, Soft: 2},
		}},
		{"from and to", control.UsageFilter{From: m0.Add(time.Minute), To: m0.Add(time.Hour), Step: time.Minute}, []control.UsagePoint{
			{At: m0.Add(time.Minute), Allowed: 10},
		}},
		{"no match", control.UsageFilter{Tenant: "initech", Step: time.Minute}, nil},
	} {
		got, err := e.s.UsageHistory(e.ctx, tc.f)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("UsageHistory(%s) = %+v, %v\nwant %+v", tc.name, got, err, tc.want)
		}
	}
	if _, err := e.s.UsageHistory(e.ctx, control.UsageFilter{Step: time.Second}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a step of a second: %v, want ErrInvalid", err)
	}

	viols, err := e.s.Violations(e.ctx, control.ViolationFilter{})
	want := []control.ViolationCount{
		{Minute: m0.Add(time.Minute), Rule: "r", Tenant: "acme", APIKey: "k:1a2b", IP: "192.0.2.1", Endpoint: "/api", Soft: 8, Limit: 100},
		{Minute: m0, Rule: "r", Tenant: "acme", User: "john", Denied: 6, Soft: 2, Limit: 100},
	}
	if err != nil || !reflect.DeepEqual(viols, want) {
		t.Errorf("Violations = %+v, %v\nwant %+v", viols, err, want)
	}
	for _, tc := range []struct {
		name string
		f    control.ViolationFilter
		n    int
	}{
		{"user", control.ViolationFilter{User: "john"}, 1},
		{"api key", control.ViolationFilter{APIKey: "k:1a2b"}, 1},
		{"ip", control.ViolationFilter{IP: "192.0.2.1"}, 1},
		{"rule", control.ViolationFilter{Rule: "other"}, 0},
		{"since", control.ViolationFilter{Since: m0.Add(time.Minute)}, 1},
		{"until", control.ViolationFilter{Until: m0.Add(time.Minute)}, 1},
		{"limit", control.ViolationFilter{Limit: 1}, 1},
	} {
		got, err := e.s.Violations(e.ctx, tc.f)
		if err != nil || len(got) != tc.n {
			t.Errorf("Violations(%s) = %+v, %v; want %d", tc.name, got, err, tc.n)
		}
	}

	n, err := e.s.PruneCounts(e.ctx, m0.Add(time.Minute))
	if err != nil || n != 5 { // acme and globex of minute 0 (a rule's and the decisions'), john's violation
		t.Errorf("PruneCounts = %d, %v; want 5", n, err)
	}
	if got, _ := e.s.UsageHistory(e.ctx, control.UsageFilter{Step: time.Hour}); len(got) != 2 || got[0].Allowed != 10 {
		t.Errorf("usage after pruning = %+v", got)
	}
	if err := e.s.AddCounts(e.ctx, []control.UsageCount{{Minute: m0, Rule: strings.Repeat("r", control.MaxNameLen+1), Allowed: 1}}, nil); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a count of a rule name too long: %v", err)
	}
	if err := e.s.AddCounts(e.ctx, []control.UsageCount{{Minute: m0, Rule: control.DecisionRule, Soft: -1}}, nil); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a negative decision count: %v", err)
	}
	if err := e.s.AddCounts(e.ctx, nil, []control.ViolationCount{{Minute: m0, Rule: "r", Denied: -1}}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a negative count: %v", err)
	}
	if e.version() != 0 || len(e.audit()) != 0 {
		t.Errorf("counts are not changes: version %d, %d audit events", e.version(), len(e.audit()))
	}
}

// testCountsInBulk: one AddCounts of more rows than a statement takes at once, with rows given
// twice (seconds apart in one minute), adds everything up; the last limit given wins.
func testCountsInBulk(t *testing.T, e *env) {
	m0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	const n = 12_345
	var usage []control.UsageCount
	var viols []control.ViolationCount
	for i := range n {
		usage = append(usage, control.UsageCount{Minute: m0.Add(time.Duration(i%3) * time.Minute), Rule: "r", Tenant: fmt.Sprintf("t%d", i%1000), Allowed: 1})
		viols = append(viols, control.ViolationCount{Minute: m0, Rule: "r", User: fmt.Sprintf("u%d", i), Denied: 1, Limit: 10})
		if i == 7 { // again, seconds later, in the same statement
			viols = append(viols, control.ViolationCount{Minute: m0.Add(59 * time.Second), Rule: "r", User: "u7", Soft: 3, Limit: 20})
		}
	}
	usage = append(usage, control.UsageCount{Minute: m0.Add(30 * time.Second), Rule: "r", Tenant: "t0", Denied: 5, Soft: 2})
	// The same counts again as per-decision rows (rule ""): they take the same path in bulk.
	for _, u := range slices.Clone(usage) {
		u.Rule = control.DecisionRule
		usage = append(usage, u)
	}
	if err := e.s.AddCounts(e.ctx, usage, viols); err != nil {
		t.Fatalf("AddCounts: %v", err)
	}
	for _, rule := range []string{"r", control.DecisionRule} {
		pts, err := e.s.UsageHistory(e.ctx, control.UsageFilter{Rule: rule, Step: time.Hour})
		if want := []control.UsagePoint{{At: m0, Allowed: n, Denied: 5, Soft: 2}}; err != nil || !reflect.DeepEqual(pts, want) {
			t.Errorf("UsageHistory(rule %q) = %+v, %v; want %+v", rule, pts, err, want)
		}
		pts, err = e.s.UsageHistory(e.ctx, control.UsageFilter{Rule: rule, Tenant: "t0", Step: time.Minute})
		if want := []control.UsagePoint{{At: m0, Allowed: 5, Denied: 5, Soft: 2}, {At: m0.Add(time.Minute), Allowed: 4}, {At: m0.Add(2 * time.Minute), Allowed: 4}}; err != nil || !reflect.DeepEqual(pts, want) {
			t.Errorf("UsageHistory(rule %q, t0) = %+v, %v; want %+v", rule, pts, err, want)
		}
	}
	got, err := e.s.Violations(e.ctx, control.ViolationFilter{User: "u7"})
	if want := []control.ViolationCount{{Minute: m0, Rule: "r", User: "u7", Denied: 1, Soft: 3, Limit: 20}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Violations(u7) = %+v, %v; want %+v", got, err, want)
	}
	all, err := e.s.Violations(e.ctx, control.ViolationFilter{Limit: control.MaxAuditLimit})
	if err != nil || len(all) != control.MaxAuditLimit {
		t.Errorf("Violations = %d rows, %v; want %d (the cap)", len(all), err, control.MaxAuditLimit)
	}
}

// testLeases: one holder at a time; renewal; takeover once expired; release.
func testLeases(t *testing.T, e *env) {
	other := e.open()
	acquire := func(s control.Store, holder string, want bool) {
		t.Helper()
		got, err := s.AcquireLease(e.ctx, "abuse-detector", holder, 10*time.Second)
		if err != nil || got != want {
			t.Fatalf("AcquireLease(%s) = %v, %v; want %v", holder, got, err, want)
		}
	}
	if _, _, err := e.s.Lease(e.ctx, "abuse-detector"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("Lease before anyone took it: %v", err)
	}
	acquire(e.s, "node-a", true)
	acquire(other, "node-b", false)
	e.clock.Advance(5 * time.Second)
	acquire(e.s, "node-a", true) // renewed until now+10s
	e.clock.Advance(9 * time.Second)
	acquire(other, "node-b", false)
	holder, until, err := e.s.Lease(e.ctx, "abuse-detector")
	if err != nil || holder != "node-a" || !until.Equal(e.now().Add(time.Second)) {
		t.Errorf("Lease = %s until %v, %v; want node-a until %v", holder, until, err, e.now().Add(time.Second))
	}
	e.clock.Advance(time.Second) // node-a's lease expires: node-b takes over
	acquire(other, "node-b", true)
	acquire(e.s, "node-a", false)
	if err := other.ReleaseLease(e.ctx, "abuse-detector", "node-a"); err != nil { // not node-a's
		t.Fatal(err)
	}
	acquire(e.s, "node-a", false)
	if err := other.ReleaseLease(e.ctx, "abuse-detector", "node-b"); err != nil {
		t.Fatal(err)
	}
	acquire(e.s, "node-a", true)

	// Racing for a free lease: exactly one wins.
	e.clock.Advance(time.Minute)
	var wg sync.WaitGroup
	wins := make([]bool, 8)
	for i := range wins {
		s := e.s
		if i%2 == 1 {
			s = other
		}
		wg.Go(func() {
			ok, err := s.AcquireLease(e.ctx, "race", "node-"+string(rune('a'+i)), time.Minute)
			if err != nil {
				t.Errorf("AcquireLease: %v", err)
			}
			wins[i] = ok
		})
	}
	wg.Wait()
	n := 0
	for _, w := range wins {
		if w {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d holders got a free lease at once, want 1", n)
	}
	if _, err := e.s.AcquireLease(e.ctx, "x", "", time.Second); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a lease without holder: %v", err)
	}
}

// testWindowTotals sums two nodes' counts over a window of minutes: usage per rule and tenant,
// and the violations of requests without a tenant per rule and identity.
func testWindowTotals(t *testing.T, e *env) {
	other := e.open()
	m0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	usage := []control.UsageCount{
		{Minute: m0.Add(-time.Minute), Rule: "r", Tenant: "acme", Allowed: 1000}, // before the window
		{Minute: m0, Rule: "r", Tenant: "acme", Allowed: 10, Denied: 80, Soft: 5},
		{Minute: m0.Add(4 * time.Minute), Rule: "r", Tenant: "acme", Allowed: 1, Denied: 1},
		{Minute: m0.Add(2 * time.Minute), Rule: "b", Tenant: "acme", Allowed: 7},
		{Minute: m0.Add(2 * time.Minute), Rule: "r", Tenant: "", Allowed: 3, Denied: 9},
		{Minute: m0.Add(5 * time.Minute), Rule: "r", Tenant: "globex", Denied: 1000}, // at the end: out
	}
	violations := []control.ViolationCount{
		{Minute: m0, Rule: "r", User: "john", IP: "192.0.2.1", Endpoint: "/a", Denied: 4, Limit: 10},
		{Minute: m0.Add(time.Minute), Rule: "r", User: "john", IP: "192.0.2.1", Endpoint: "/b", Denied: 1, Soft: 2, Limit: 10},
		{Minute: m0, Rule: "r", APIKey: "#1a2b", Soft: 3, Limit: 10},
		{Minute: m0, Rule: "r", Tenant: "acme", User: "jane", Denied: 80, Limit: 10},         // has a tenant: out
		{Minute: m0.Add(-time.Minute), Rule: "r", User: "john", IP: "192.0.2.1", Denied: 50}, // before: out
	}
	// Each node flushes every count once: the totals are twice the counts.
	for _, s := range []control.Store{e.s, other} {
		if err := s.AddCounts(e.ctx, usage, violations); err != nil {
			t.Fatalf("AddCounts: %v", err)
		}
	}
	gotU, gotV, err := other.WindowTotals(e.ctx, m0, m0.Add(5*time.Minute))
	if err != nil {
		t.Fatalf("WindowTotals: %v", err)
	}
	wantU := []control.UsageCount{
		{Minute: m0, Rule: "b", Tenant: "acme", Allowed: 14},
		{Minute: m0, Rule: "r", Tenant: "", Allowed: 6, Denied: 18},
		{Minute: m0, Rule: "r", Tenant: "acme", Allowed: 22, Denied: 162, Soft: 10},
	}
	wantV := []control.ViolationCount{
		{Minute: m0, Rule: "r", APIKey: "#1a2b", Soft: 6},
		{Minute: m0, Rule: "r", User: "john", IP: "192.0.2.1", Denied: 10, Soft: 4},
	}
	if !reflect.DeepEqual(gotU, wantU) {
		t.Errorf("usage totals = %+v\nwant %+v", gotU, wantU)
	}
	if !reflect.DeepEqual(gotV, wantV) {
		t.Errorf("violation totals = %+v\nwant %+v", gotV, wantV)
	}
	u, v, err := e.s.WindowTotals(e.ctx, m0.Add(time.Hour), m0.Add(2*time.Hour))
	if err != nil || len(u) != 0 || len(v) != 0 {
		t.Errorf("an empty window: %+v, %+v, %v", u, v, err)
	}
}
