package usage_test

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/telemetry/usage"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clock is the recorders' clock: the minute events are stamped with.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.set(t)
	return c
}

func (c *clock) set(t time.Time)     { c.ns.Store(t.UnixNano()) }
func (c *clock) Now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// backends open two Stores on one database: two nodes of a fleet.
var backends = []struct {
	name string
	open func(t testing.TB, opts control.Options) (a, b control.Store)
}{
	{"sqlite", func(t testing.TB, opts control.Options) (control.Store, control.Store) {
		path := filepath.Join(t.TempDir(), "control.db")
		return openStore(t, func() (control.Store, error) { return sqlite.Open(t.Context(), path, opts) }),
			openStore(t, func() (control.Store, error) { return sqlite.Open(t.Context(), path, opts) })
	}},
	{"postgres", func(t testing.TB, opts control.Options) (control.Store, control.Store) {
		url := pgtest.DB(t)
		return openStore(t, func() (control.Store, error) { return postgres.Open(t.Context(), url, opts) }),
			openStore(t, func() (control.Store, error) { return postgres.Open(t.Context(), url, opts) })
	}},
}

func openStore(t testing.TB, open func() (control.Store, error)) control.Store {
	t.Helper()
	s, err := open()
	if err != nil {
		t.Fatalf("open control store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRecorder(t testing.TB, o usage.Options) *usage.Recorder {
	t.Helper()
	if o.Flush == 0 {
		o.Flush = time.Hour // the tests flush by hand
	}
	r, err := usage.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.Close(ctx)
	})
	return r
}

func flush(t testing.TB, r *usage.Recorder) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// policy: per-user warns from 60% of 5 (the 3rd request) and denies the 6th; per-tenant has
// room for everything; the shadow rule "would deny" from the 2nd request and is not counted;
// the exempt API key is not counted.
const policyYAML = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 5, period: 1h, soft: 60}
  - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: shadow-all, key: [], algorithm: fixed_window, limit: 1, period: 1h, shadow: true}
exemptions:
  - {api_key: internal-health}
`

// check decides req n times on l and records each decision on rec, like a server does.
func check(t *testing.T, l *sluice.Limiter, rec *usage.Recorder, req sluice.Request, n int) {
	t.Helper()
	var d sluice.Decision
	for range n {
		r := req
		if err := l.Check(t.Context(), &r, &d); err != nil {
			t.Fatal(err)
		}
		rec.Check(&r, &d)
	}
}

// TestCountsAddUpAcrossNodes: two nodes on one control store decide known requests; once
// flushed, the usage history (per minute, hour and day) and the violations log hold exactly
// their sums. Each user sends 8 checks: per-user allows 2, warns (soft) 3 and denies 3;
// per-tenant allows all 8.
func TestCountsAddUpAcrossNodes(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			sa, sb := be.open(t, control.Options{})
			m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
			ca, cb := newClock(m0.Add(5*time.Second)), newClock(m0.Add(50*time.Second))
			ra := newRecorder(t, usage.Options{Writer: node.UsageWriter(sa), Now: ca.Now})
			rb := newRecorder(t, usage.Options{Writer: node.UsageWriter(sb), Now: cb.Now})
			// One Limiter: the fleet's shared store.
			l := testutil.Limiter(t, policyYAML, testutil.NewClock())

			u1 := sluice.Request{Tenant: "acme", User: "u1", APIKey: "sk-live-1", IP: "192.0.2.1", Endpoint: "/api/items"}
			u2 := sluice.Request{Tenant: "acme", User: "u2", IP: "192.0.2.2", Endpoint: "/api/items"}
			u3 := sluice.Request{Tenant: "globex", User: "u3", Endpoint: "/api/other"}
			// Node A: u1's 8 checks in minute 0, in two flushes; node B: u2's in minute 0.
			check(t, l, ra, u1, 4)
			flush(t, ra)
			check(t, l, ra, u1, 4)
			check(t, l, rb, u2, 8)
			// Exempt: counted nowhere.
			check(t, l, ra, sluice.Request{Tenant: "acme", User: "u1", APIKey: "internal-health"}, 3)
			flush(t, ra)
			flush(t, rb)
			// Node B, 61 minutes later: globex's u3, 8 checks; node A, the next day: 1 for acme.
			cb.add(61 * time.Minute)
			check(t, l, rb, u3, 8)
			flush(t, rb)
			ca.add(24 * time.Hour)
			check(t, l, ra, sluice.Request{Tenant: "acme", User: "u4"}, 1)
			flush(t, ra)

			day := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
			for _, tc := range []struct {
				name string
				f    control.UsageFilter
				want []control.UsagePoint
			}{
				{"per-user acme per minute", control.UsageFilter{Rule: "per-user", Tenant: "acme", Step: time.Minute}, []control.UsagePoint{
					{At: m0, Allowed: 4, Soft: 6, Denied: 6},
					{At: m0.Add(24 * time.Hour), Allowed: 1},
				}},
				{"per-tenant acme per minute", control.UsageFilter{Rule: "per-tenant", Tenant: "acme", Step: time.Minute}, []control.UsagePoint{
					{At: m0, Allowed: 16},
					{At: m0.Add(24 * time.Hour), Allowed: 1},
				}},
				// Without a rule: each request once, by its final state (per-user's, since
				// per-tenant allows all), not the two rules' counts added up (issue 29).
				{"decisions per hour", control.UsageFilter{Step: time.Hour}, []control.UsagePoint{
					{At: m0, Allowed: 4, Soft: 6, Denied: 6},
					{At: m0.Add(time.Hour), Allowed: 2, Soft: 3, Denied: 3},
					{At: m0.Add(24 * time.Hour), Allowed: 1},
				}},
				{"decisions per day", control.UsageFilter{Step: 24 * time.Hour}, []control.UsagePoint{
					{At: day, Allowed: 6, Soft: 9, Denied: 9},
					{At: day.Add(24 * time.Hour), Allowed: 1},
				}},
				{"decisions of acme per hour", control.UsageFilter{Tenant: "acme", Step: time.Hour}, []control.UsagePoint{
					{At: m0, Allowed: 4, Soft: 6, Denied: 6},
					{At: m0.Add(24 * time.Hour), Allowed: 1},
				}},
				{"the shadow rule is not counted", control.UsageFilter{Rule: "shadow-all", Step: time.Minute}, nil},
			} {
				got, err := sa.UsageHistory(t.Context(), tc.f)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: UsageHistory = %+v, want %+v", tc.name, got, tc.want)
				}
			}

			got, err := sb.Violations(t.Context(), control.ViolationFilter{})
			if err != nil {
				t.Fatal(err)
			}
			key := key.HashedAPIKey("sk-live-1")
			want := []control.ViolationCount{
				{Minute: m0.Add(61 * time.Minute), Rule: "per-user", Tenant: "globex", User: "u3", Endpoint: "/api/other", Denied: 3, Soft: 3, Limit: 5},
				{Minute: m0, Rule: "per-user", Tenant: "acme", User: "u1", APIKey: key, IP: "192.0.2.1", Endpoint: "/api/items", Denied: 3, Soft: 3, Limit: 5},
				{Minute: m0, Rule: "per-user", Tenant: "acme", User: "u2", IP: "192.0.2.2", Endpoint: "/api/items", Denied: 3, Soft: 3, Limit: 5},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Violations =\n%+v\nwant\n%+v", got, want)
			}
			if !strings.HasPrefix(key, "#") || len(key) != 33 || strings.Contains(key, "sk-live") {
				t.Errorf("HashAPIKey = %q, want # and 32 hex digits", key)
			}
			for _, r := range []*usage.Recorder{ra, rb} {
				if s := r.Stats(); s.Dropped != 0 || s.Lost != 0 || s.WriteErrors != 0 {
					t.Errorf("Stats = %+v, want nothing dropped, lost or failed", s)
				}
			}
		})
	}
}

// TestFullQueueDropsWithoutBlocking: while the recorder's gatherer is stalled (its clock
// blocks), a queue of 2 takes 2 events and drops the rest at once, counting them; what was
// queued is still written.
func TestFullQueueDropsWithoutBlocking(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	now := func() time.Time {
		once.Do(func() { close(stalled); <-release })
		return m0
	}
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Queue: 2, Now: now})
	l := testutil.Limiter(t, `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 1000, period: 1h}
`, testutil.NewClock())

	check(t, l, rec, sluice.Request{User: "u"}, 1)
	<-stalled // the gatherer holds the first event and waits on the clock
	check(t, l, rec, sluice.Request{User: "u"}, 2+5)
	if got := rec.Stats(); got.Dropped != 5 || got.Queued != 2 {
		t.Errorf("Stats = %+v, want 5 dropped and 2 queued", got)
	}
	close(release)
	flush(t, rec)
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if want := []control.UsagePoint{{At: m0, Allowed: 3}}; !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory = %+v, want %+v", pts, want)
	}
}

// TestViolationLimitOfABucket: a bucket's violation row keeps the rule's limit per period, as
// it did before a decision's limit became the bucket's burst (issue 30): the admin API's
// violations did not change with the check's answer.
func TestViolationLimitOfABucket(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now})
	l := testutil.Limiter(t, `
rules:
  - {name: tb, key: [user], algorithm: token_bucket, limit: 10, period: 1s, burst: 20}
`, testutil.NewClock())
	req := sluice.Request{User: "u"}
	var d sluice.Decision
	if err := l.Check(t.Context(), &req, &d); err != nil || d.Limit != 20 {
		t.Fatalf("the answer's limit %d (err %v), want the burst, 20", d.Limit, err)
	}
	check(t, l, rec, req, 20) // the clock stands still: 19 allowed, the last denied
	flush(t, rec)
	got, err := st.Violations(t.Context(), control.ViolationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []control.ViolationCount{{Minute: m0, Rule: "tb", User: "u", Denied: 1, Limit: 10}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Violations = %+v, want %+v", got, want)
	}
}

// desc is a descriptor of one entry.
func desc(k, v string) sluice.Descriptor {
	return sluice.Descriptor{Entries: []envoyconf.Entry{{Key: k, Value: v}}}
}

// TestEnvoyDescriptors: each descriptor with a limit counts under the limit's name, or
// "domain/id" when it has none, with its remote_address as the violation's ip; looks
// (hits_addend 0) and shadow_mode limits are not counted.
func TestEnvoyDescriptors(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now})
	l := testutil.Limiter(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2, name: per-ip}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: probe
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
`, testutil.NewClock())
	var d sluice.DescriptorDecision
	send := func(n int, descs ...sluice.Descriptor) {
		t.Helper()
		for range n {
			req := sluice.DescriptorRequest{Domain: "edge", Descriptors: descs}
			if err := l.CheckDescriptors(t.Context(), &req, &d); err != nil {
				t.Fatal(err)
			}
			rec.Descriptors(&req, &d)
		}
	}
	look := desc("remote_address", "203.0.113.9")
	look.HasHitsAddend = true
	send(3, desc("remote_address", "203.0.113.9"), desc("probe", "x"))
	send(2, desc("path", "/login"))
	send(4, look)
	flush(t, rec)

	for _, tc := range []struct {
		rule string
		want []control.UsagePoint
	}{
		{"per-ip", []control.UsagePoint{{At: m0, Allowed: 2, Denied: 1}}},
		{"edge/path=%2Flogin", []control.UsagePoint{{At: m0, Allowed: 1, Denied: 1}}},
		{"edge/probe", nil},
		// Decisions, each request once: looks and the shadow limit are not decisions.
		{control.DecisionRule, []control.UsagePoint{{At: m0, Allowed: 3, Denied: 2}}},
	} {
		got, err := st.UsageHistory(t.Context(), control.UsageFilter{Rule: tc.rule, Step: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("UsageHistory(%s) = %+v, want %+v", tc.rule, got, tc.want)
		}
	}
	got, err := st.Violations(t.Context(), control.ViolationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []control.ViolationCount{
		{Minute: m0, Rule: "edge/path=%2Flogin", Denied: 1, Limit: 1},
		{Minute: m0, Rule: "per-ip", IP: "203.0.113.9", Denied: 1, Limit: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Violations = %+v, want %+v", got, want)
	}
}

// TestEnvoyDescriptorsOfOneRequest: a request's descriptors share events (at most MaxResults
// results each): every limit is counted once, and every violation names the caller the
// request's entries name (tenant, user, and remote_address as ip), whichever descriptor
// carried each.
func TestEnvoyDescriptorsOfOneRequest(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now})
	l := testutil.Limiter(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1, name: per-ip}
  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1, name: a}}
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 1, name: b}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 1, name: c}}
  - {key: d, rate_limit: {unit: hour, requests_per_unit: 1, name: d}}
  - {key: e, rate_limit: {unit: hour, requests_per_unit: 1, name: e}}
`, testutil.NewClock())
	descs := []sluice.Descriptor{desc("a", "1"), desc("remote_address", "203.0.113.9"),
		desc("b", "1"), desc("c", "1"), desc("d", "1"), desc("e", "1"), desc("a", "2"),
		{Entries: []envoyconf.Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "ann"}}}}
	var d sluice.DescriptorDecision
	for range 2 {
		req := sluice.DescriptorRequest{Domain: "edge", Descriptors: descs}
		if err := l.CheckDescriptors(t.Context(), &req, &d); err != nil {
			t.Fatal(err)
		}
		rec.Descriptors(&req, &d)
	}
	flush(t, rec)
	for rule, want := range map[string][]control.UsagePoint{
		"per-ip": {{At: m0, Allowed: 1, Denied: 1}},
		"a":      {{At: m0, Allowed: 2, Denied: 2}},
		"e":      {{At: m0, Allowed: 1, Denied: 1}},
		// Two requests of seven limits (two events each): two decisions, not fourteen.
		control.DecisionRule: {{At: m0, Allowed: 1, Denied: 1}},
	} {
		got, err := st.UsageHistory(t.Context(), control.UsageFilter{Rule: rule, Step: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("UsageHistory(%s) = %+v, want %+v", rule, got, want)
		}
	}
	got, err := st.Violations(t.Context(), control.ViolationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	const tenant, user, ip = "acme", "ann", "203.0.113.9"
	want := []control.ViolationCount{
		{Minute: m0, Rule: "a", Tenant: tenant, User: user, IP: ip, Denied: 2, Limit: 1},
		{Minute: m0, Rule: "b", Tenant: tenant, User: user, IP: ip, Denied: 1, Limit: 1},
		{Minute: m0, Rule: "c", Tenant: tenant, User: user, IP: ip, Denied: 1, Limit: 1},
		{Minute: m0, Rule: "d", Tenant: tenant, User: user, IP: ip, Denied: 1, Limit: 1},
		{Minute: m0, Rule: "e", Tenant: tenant, User: user, IP: ip, Denied: 1, Limit: 1},
		{Minute: m0, Rule: "per-ip", Tenant: tenant, User: user, IP: ip, Denied: 1, Limit: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Violations = %+v, want %+v", got, want)
	}
}

// TestUnstorableValues: request attributes the control store cannot keep as they are (over
// 512 characters, NUL) are kept readable and distinct rather than failing the write.
func TestUnstorableValues(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now})
	l := testutil.Limiter(t, `
rules:
  - {name: r, key: [tenant], algorithm: fixed_window, limit: 1, period: 1h}
`, testutil.NewClock())
	long := strings.Repeat("é", 300) + strings.Repeat("x", 300) // 600 characters, 900 bytes
	tenants := []string{long + "a", long + "b", "nul\x00tenant"}
	for _, tn := range tenants {
		check(t, l, rec, sluice.Request{Tenant: tn}, 2)
	}
	flush(t, rec)
	got, err := st.Violations(t.Context(), control.ViolationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(tenants) {
		t.Fatalf("Violations = %d rows, want %d: %+v", len(got), len(tenants), got)
	}
	seen := map[string]bool{}
	for _, v := range got {
		if n := len([]rune(v.Tenant)); n > control.MaxValueLen || strings.ContainsRune(v.Tenant, 0) || seen[v.Tenant] || v.Denied != 1 {
			t.Errorf("violation %q (%d characters, denied %d): want a distinct, storable tenant denied once", v.Tenant, n, v.Denied)
		}
		seen[v.Tenant] = true
	}
	if s := rec.Stats(); s.Lost != 0 || s.WriteErrors != 0 {
		t.Errorf("Stats = %+v, want nothing lost", s)
	}
}

// TestMaxRows: past MaxRows unwritten rows, new rows are not created and what they would have
// held is counted as lost; rows that exist still count.
func TestMaxRows(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now, MaxRows: 5})
	l := testutil.Limiter(t, `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
`, testutil.NewClock())
	// u1: a decision row, a usage row, a violation row (3 checks: 1 allowed, 2 denied); t2: a
	// decision row and a usage row (the 5th row) and no room for its violation; t3: no room
	// at all (its 2 decisions, its usage 2, its violation 1).
	check(t, l, rec, sluice.Request{Tenant: "t1", User: "u1"}, 3)
	check(t, l, rec, sluice.Request{Tenant: "t2", User: "u2"}, 2)
	check(t, l, rec, sluice.Request{Tenant: "t3", User: "u3"}, 2)
	flush(t, rec)
	if got, want := rec.Stats().Lost, int64(1+2+2+1); got != want {
		t.Errorf("Lost = %d, want %d", got, want)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if want := []control.UsagePoint{{At: m0, Allowed: 2, Denied: 3}}; !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory = %+v, want %+v", pts, want)
	}
	pts, err = st.UsageHistory(t.Context(), control.UsageFilter{Rule: "r", Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if want := []control.UsagePoint{{At: m0, Allowed: 2, Denied: 3}}; !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory(rule r) = %+v, want %+v", pts, want)
	}
}

// TestCloseWritesWhatIsQueued: Close drains the queue and writes before it returns.
func TestCloseWritesWhatIsQueued(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec, err := usage.New(usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now, Flush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l := testutil.Limiter(t, `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 100, period: 1h}
`, testutil.NewClock())
	check(t, l, rec, sluice.Request{User: "u"}, 7)
	if err := rec.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if want := []control.UsagePoint{{At: m0, Allowed: 7}}; !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory = %+v, want %+v", pts, want)
	}
	check(t, l, rec, sluice.Request{User: "u"}, 1) // after Close: dropped, no panic
}

// TestStoreDownKeepsCounts: counts the control store did not take (PostgreSQL stopped) are
// kept and written once it is back, each exactly once.
func TestStoreDownKeepsCounts(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	st := openStore(t, func() (control.Store, error) { return postgres.Open(t.Context(), url, control.Options{}) })
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clk := newClock(m0)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: clk.Now, WriteTimeout: 5 * time.Second})
	l := testutil.Limiter(t, `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 2, period: 1h}
`, testutil.NewClock())
	check(t, l, rec, sluice.Request{Tenant: "acme", User: "u"}, 3)
	flush(t, rec)
	c.Stop()
	check(t, l, rec, sluice.Request{Tenant: "acme", User: "u"}, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.Flush(ctx); err == nil {
		t.Fatal("Flush with PostgreSQL stopped: no error")
	}
	c.Restart(t)
	clk.add(time.Minute)
	check(t, l, rec, sluice.Request{Tenant: "acme", User: "u"}, 1)
	flush(t, rec)
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := []control.UsagePoint{{At: m0, Allowed: 2, Denied: 3}, {At: m0.Add(time.Minute), Denied: 1}}
	if !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory = %+v, want %+v", pts, want)
	}
	if s := rec.Stats(); s.WriteErrors != 1 || s.Lost != 0 {
		t.Errorf("Stats = %+v, want 1 write error and nothing lost", s)
	}
}

// TestRetention: the control-plane runtime prunes the counts older than --violations-retention
// and keeps the rest, on both databases.
func TestRetention(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
			st, _ := be.open(t, control.Options{Now: func() time.Time { return now }})
			clk := newClock(now.Add(-31 * 24 * time.Hour))
			rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: clk.Now})
			yml := `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
`
			l := testutil.Limiter(t, yml, testutil.NewClock())
			check(t, l, rec, sluice.Request{Tenant: "acme", User: "old"}, 2) // 31 days ago
			flush(t, rec)                                                    // stamped before the clock moves
			clk.set(now.Add(-29 * 24 * time.Hour))
			check(t, l, rec, sluice.Request{Tenant: "acme", User: "kept"}, 2) // 29 days ago
			flush(t, rec)

			f, err := policy.ParseFiles(map[string][]byte{"policy.yaml": []byte(yml)})
			if err != nil {
				t.Fatal(err)
			}
			rt, err := follower.New(follower.Options{
				Store: st, Limiter: l, Files: f, NodeID: "node-a", Now: func() time.Time { return now },
				MaintenanceInterval: 20 * time.Millisecond, CountsRetention: 30 * 24 * time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			rt.Start(t.Context())
			t.Cleanup(rt.Close)
			kept := now.Add(-29 * 24 * time.Hour).Truncate(time.Minute)
			deadline := time.Now().Add(10 * time.Second)
			for {
				pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				vs, err := st.Violations(t.Context(), control.ViolationFilter{})
				if err != nil {
					t.Fatal(err)
				}
				if reflect.DeepEqual(pts, []control.UsagePoint{{At: kept, Allowed: 1, Denied: 1}}) && len(vs) == 1 && vs[0].User == "kept" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 10 s: usage %+v, violations %+v; want only the counts of 29 days ago", pts, vs)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestAssignedIdentity: a request counts under the tenant and user the control plane assigned
// to its API key, not under what it claims.
func TestAssignedIdentity(t *testing.T) {
	st, _ := backends[0].open(t, control.Options{})
	m0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: newClock(m0).Now})
	yml := `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 1, period: 1h}
`
	l := testutil.Limiter(t, yml, testutil.NewClock())
	f, err := policy.ParseFiles(map[string][]byte{"policy.yaml": []byte(yml)})
	if err != nil {
		t.Fatal(err)
	}
	snap, skipped := policy.CompileWith(f, &policy.State{Identities: []policy.Identity{
		{Kind: policy.IdentityAPIKey, Value: "sk-acme", Tenant: "acme", User: "alice"},
	}}, m0)
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	if err := l.SetPolicy(snap); err != nil {
		t.Fatal(err)
	}
	check(t, l, rec, sluice.Request{Tenant: "claimed", User: "mallory", APIKey: "sk-acme"}, 2)
	flush(t, rec)
	got, err := st.Violations(t.Context(), control.ViolationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []control.ViolationCount{{Minute: m0, Rule: "per-user", Tenant: "acme", User: "alice", APIKey: key.HashedAPIKey("sk-acme"), Denied: 1, Limit: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Violations = %+v, want %+v", got, want)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Tenant: "acme", Step: time.Minute})
	if want := []control.UsagePoint{{At: m0, Allowed: 1, Denied: 1}}; err != nil || !reflect.DeepEqual(pts, want) {
		t.Errorf("UsageHistory(acme) = %+v, %v; want %+v", pts, err, want)
	}
}

// TestObserve: the observer sees each counted limit's outcome, with the API key hashed and the
// recorder's time, and nothing that is not counted (exempt requests, shadow limits).
func TestObserve(t *testing.T) {
	t.Parallel()
	st, _ := backends[0].open(t, control.Options{})
	var (
		mu  sync.Mutex
		got = map[string]int{}
	)
	at := time.Date(2026, 11, 23, 22, 50, 0, 0, time.UTC)
	rec := newRecorder(t, usage.Options{Writer: node.UsageWriter(st), Now: func() time.Time { return at }, Observe: func(o usage.Observation) {
		mu.Lock()
		defer mu.Unlock()
		got[fmt.Sprintf("%s %s %s %s %d %s", o.Rule, o.Tenant, o.User, o.APIKey, o.Outcome, o.At.Format(time.TimeOnly))]++
	}})
	l := testutil.Limiter(t, policyYAML, testutil.NewClock())
	check(t, l, rec, sluice.Request{Tenant: "acme", User: "u1", APIKey: "sk-1"}, 8)
	check(t, l, rec, sluice.Request{Tenant: "acme", User: "u1", APIKey: "internal-health"}, 2)
	flush(t, rec)
	k := key.HashedAPIKey("sk-1")
	want := map[string]int{
		"per-user acme u1 " + k + " 0 22:50:00":   2,
		"per-user acme u1 " + k + " 1 22:50:00":   3,
		"per-user acme u1 " + k + " 2 22:50:00":   3,
		"per-tenant acme u1 " + k + " 0 22:50:00": 8,
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed %v\nwant %v", got, want)
	}
}
