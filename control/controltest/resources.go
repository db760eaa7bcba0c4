package controltest

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// ch is a change by actor "alice".
func ch(ifMatch string) control.Change {
	return control.Change{Actor: "alice", Reason: "testing", IfMatch: ifMatch}
}

// now is the clock in the form the stores keep: UTC, microseconds.
func (e *env) now() time.Time { return e.clock.Now().UTC().Truncate(time.Microsecond) }

// audit returns every audit event, newest first.
func (e *env) audit() []control.AuditEvent {
	e.t.Helper()
	evs, err := e.s.Audit(e.ctx, control.AuditFilter{Limit: control.MaxAuditLimit})
	if err != nil {
		e.t.Fatalf("Audit: %v", err)
	}
	return evs
}

// version returns the control version.
func (e *env) version() int64 {
	e.t.Helper()
	v, err := e.s.Version(e.ctx)
	if err != nil {
		e.t.Fatalf("Version: %v", err)
	}
	return v
}

// unchanged runs a change that must fail with want and checks that it wrote nothing: no audit
// event and no new version.
func (e *env) unchanged(what string, want error, fn func() error) {
	e.t.Helper()
	events, v := len(e.audit()), e.version()
	err := fn()
	if !errors.Is(err, want) {
		e.t.Errorf("%s: err = %v, want %v", what, err, want)
	}
	if n := len(e.audit()); n != events {
		e.t.Errorf("%s: a failed change wrote %d audit events", what, n-events)
	}
	if got := e.version(); got != v {
		e.t.Errorf("%s: a failed change moved the version from %d to %d", what, v, got)
	}
}

// invalid checks that err is an *InvalidError naming field.
func invalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ie *control.InvalidError
	if !errors.As(err, &ie) || !errors.Is(err, control.ErrInvalid) {
		t.Errorf("%s: err = %v, want an InvalidError for %s", what, err, field)
		return
	}
	if ie.Field != field {
		t.Errorf("%s: InvalidError names %q (%v), want %q", what, ie.Field, ie, field)
	}
}

// lastEvent checks the newest audit event.
func (e *env) lastEvent(action control.Action, kind control.Kind, target string, version int64) control.AuditEvent {
	e.t.Helper()
	evs := e.audit()
	if len(evs) == 0 {
		e.t.Fatalf("no audit event, want %s %s %s", action, kind, target)
	}
	ev := evs[0]
	if ev.Action != action || ev.Kind != kind || ev.Target != target || ev.Version != version {
		e.t.Errorf("last audit event = %s %s %q v%d, want %s %s %q v%d", ev.Action, ev.Kind, ev.Target, ev.Version, action, kind, target, version)
	}
	if !ev.At.Equal(e.now()) || ev.At.Location() != time.UTC {
		e.t.Errorf("audit event at %v, want %v in UTC", ev.At, e.now())
	}
	return ev
}

// sameJSON reports whether two JSON texts hold the same value.
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("bad JSON %s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("bad JSON %s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

func testRules(t *testing.T, e *env) {
	body := json.RawMessage(`{"name":"per-user","key":["tenant","user"],"algorithm":"gcra","limit":100,"period":"1m"}`)
	r, err := e.s.CreateRule(e.ctx, ch(""), "per-user", body)
	if err != nil {
		t.Fatalf("CreateRule: %v", err)
	}
	if r.Version != 1 || r.ETag() != "1" || !r.CreatedAt.Equal(e.now()) || r.UpdatedBy != "alice" || string(r.Body) != string(body) {
		t.Errorf("created rule = %+v", r)
	}
	ev := e.lastEvent(control.ActionCreate, control.KindRule, "per-user", 1)
	if ev.Actor != "alice" || ev.Reason != "testing" || ev.Before != nil || !sameJSON(t, ev.After, body) {
		t.Errorf("create event = %+v", ev)
	}

	got, err := e.s.GetRule(e.ctx, "per-user")
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("GetRule = %+v, %v; want %+v", got, err, r)
	}
	e.unchanged("create a taken name", control.ErrConflict, func() error {
		_, err := e.s.CreateRule(e.ctx, ch(""), "per-user", body)
		return err
	})

	e.clock.Advance(time.Second)
	body2 := json.RawMessage(`{"name":"per-user","key":["tenant"],"algorithm":"gcra","limit":50,"period":"1m"}`)
	up, err := e.s.UpdateRule(e.ctx, ch(""), "per-user", body2)
	if err != nil {
		t.Fatalf("UpdateRule: %v", err)
	}
	if up.Version != 2 || !up.CreatedAt.Equal(r.CreatedAt) || !up.UpdatedAt.Equal(e.now()) || string(up.Body) != string(body2) {
		t.Errorf("updated rule = %+v", up)
	}
	ev = e.lastEvent(control.ActionUpdate, control.KindRule, "per-user", 2)
	if !sameJSON(t, ev.Before, body) || !sameJSON(t, ev.After, body2) {
		t.Errorf("update event before %s after %s", ev.Before, ev.After)
	}
	if _, err := e.s.CreateRule(e.ctx, ch(""), "a-second", body); err != nil {
		t.Fatal(err)
	}
	rules, err := e.s.ListRules(e.ctx)
	if err != nil || len(rules) != 2 || rules[0].Name != "a-second" || rules[1].Name != "per-user" {
		t.Errorf("ListRules = %+v, %v; want a-second, per-user", rules, err)
	}

	v, err := e.s.DeleteRule(e.ctx, ch(""), "per-user")
	if err != nil || v != 4 {
		t.Fatalf("DeleteRule = %d, %v; want version 4", v, err)
	}
	ev = e.lastEvent(control.ActionDelete, control.KindRule, "per-user", 4)
	if !sameJSON(t, ev.Before, body2) || ev.After != nil {
		t.Errorf("delete event before %s after %s", ev.Before, ev.After)
	}
	if _, err := e.s.GetRule(e.ctx, "per-user"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("GetRule after delete: %v, want ErrNotFound", err)
	}
	e.unchanged("delete a missing rule", control.ErrNotFound, func() error {
		_, err := e.s.DeleteRule(e.ctx, ch(""), "per-user")
		return err
	})
	e.unchanged("update a missing rule", control.ErrNotFound, func() error {
		_, err := e.s.UpdateRule(e.ctx, ch(""), "per-user", body)
		return err
	})
}

func testRuleIfMatch(t *testing.T, e *env) {
	body := json.RawMessage(`{"limit":1}`)
	r, err := e.s.CreateRule(e.ctx, ch(""), "r", body)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		ifMatch string
		want    error
	}{
		{"stale etag", "999", control.ErrPreconditionFailed},
		{"quoted etag is the caller's to strip", `"` + r.ETag() + `"`, control.ErrPreconditionFailed},
		{"current etag", r.ETag(), nil},
		{"the old etag after an update", r.ETag(), control.ErrPreconditionFailed},
		{"any", "*", nil},
	}
	for _, tc := range cases {
		if tc.want != nil {
			e.unchanged("update, "+tc.name, tc.want, func() error {
				_, err := e.s.UpdateRule(e.ctx, ch(tc.ifMatch), "r", body)
				return err
			})
			continue
		}
		if _, err := e.s.UpdateRule(e.ctx, ch(tc.ifMatch), "r", body); err != nil {
			t.Errorf("update, %s: %v", tc.name, err)
		}
	}
	cur, _ := e.s.GetRule(e.ctx, "r")
	e.unchanged("delete with a stale etag", control.ErrPreconditionFailed, func() error {
		_, err := e.s.DeleteRule(e.ctx, ch(r.ETag()), "r")
		return err
	})
	e.unchanged("If-Match on a missing rule", control.ErrPreconditionFailed, func() error {
		_, err := e.s.UpdateRule(e.ctx, ch("*"), "missing", body)
		return err
	})
	e.unchanged("delete with If-Match of a missing rule", control.ErrPreconditionFailed, func() error {
		_, err := e.s.DeleteRule(e.ctx, ch("1"), "missing")
		return err
	})
	if _, err := e.s.DeleteRule(e.ctx, ch(cur.ETag()), "r"); err != nil {
		t.Errorf("delete with the current etag: %v", err)
	}
}

func testRuleInvalid(t *testing.T, e *env) {
	cases := []struct {
		name, rule, body, field string
		change                  control.Change
	}{
		{"empty name", "", `{}`, "name", ch("")},
		{"long name", strings.Repeat("n", control.MaxNameLen+1), `{}`, "name", ch("")},
		{"not JSON", "r", `{"limit":`, "rule", ch("")},
		{"an array", "r", `[1,2]`, "rule", ch("")},
		{"a string", "r", `"x"`, "rule", ch("")},
		{"too large", "r", `{"x":"` + strings.Repeat("x", control.MaxRuleBodyLen) + `"}`, "rule", ch("")},
		{"no actor", "r", `{}`, "actor", control.Change{}},
		{"long reason", "r", `{}`, "reason", control.Change{Actor: "a", Reason: strings.Repeat("r", control.MaxReasonLen+1)}},
	}
	for _, tc := range cases {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateRule(e.ctx, tc.change, tc.rule, json.RawMessage(tc.body))
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}
	rules, _ := e.s.ListRules(e.ctx)
	if len(rules) != 0 {
		t.Errorf("invalid rules were stored: %+v", rules)
	}
}

// testConcurrentIfMatch races writers holding the same ETag: exactly one wins, as If-Match
// promises; the others get ErrPreconditionFailed and write nothing.
func testConcurrentIfMatch(t *testing.T, e *env) {
	r, err := e.s.CreateRule(e.ctx, ch(""), "r", json.RawMessage(`{"limit":1}`))
	if err != nil {
		t.Fatal(err)
	}
	other := e.open() // two Stores: two nodes racing, for PostgreSQL
	const writers = 8
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		s := e.s
		if i%2 == 1 {
			s = other
		}
		wg.Go(func() {
			_, errs[i] = s.UpdateRule(e.ctx, ch(r.ETag()), "r", json.RawMessage(`{"limit":`+strconv.Itoa(i+2)+`}`))
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, control.ErrPreconditionFailed):
			t.Errorf("writer %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Errorf("%d writers won with the same If-Match, want exactly 1", won)
	}
	if v := e.version(); v != 2 {
		t.Errorf("version = %d, want 2 (one create, one update)", v)
	}
	if n := len(e.audit()); n != 2 {
		t.Errorf("%d audit events, want 2", n)
	}
}

// override returns a valid override expiring in d.
func (e *env) override(tenant, user string, d time.Duration) control.Override {
	return control.Override{
		Tenant: tenant, User: user, Type: control.OverrideMultiplier, Value: 0.5,
		ExpiresAt: e.clock.Now().Add(d), Reason: "noisy", Source: control.SourceAPI,
	}
}

func testOverrides(t *testing.T, e *env) {
	in := e.override("acme", "john", time.Hour)
	in.Endpoint, in.Rule, in.APIKey = "/api/search", "per-user", "k1"
	o, err := e.s.CreateOverride(e.ctx, control.Change{Actor: "alice"}, in)
	if err != nil {
		t.Fatalf("CreateOverride: %v", err)
	}
	want := in
	want.ID, want.CreatedBy, want.CreatedAt, want.Version = o.ID, "alice", e.now(), 1
	want.ExpiresAt = in.ExpiresAt.UTC().Truncate(time.Microsecond)
	if o.ID <= 0 || !reflect.DeepEqual(o, want) {
		t.Errorf("created override = %+v\nwant %+v", o, want)
	}
	id := strconv.FormatInt(o.ID, 10)
	ev := e.lastEvent(control.ActionCreate, control.KindOverride, id, 1)
	if ev.Reason != "noisy" {
		t.Errorf("create event reason = %q, want the override's own when the change has none", ev.Reason)
	}
	var after control.Override
	if err := json.Unmarshal(ev.After, &after); err != nil || after.ID != o.ID || after.Tenant != "acme" || after.Type != control.OverrideMultiplier {
		t.Errorf("create event after = %s (%v)", ev.After, err)
	}
	if got, err := e.s.GetOverride(e.ctx, o.ID); err != nil || !reflect.DeepEqual(got, o) {
		t.Errorf("GetOverride = %+v, %v; want %+v", got, err, o)
	}

	ban := control.Override{Tenant: "globex", Type: control.OverrideBan, ExpiresAt: e.clock.Now().Add(time.Minute), Reason: "abuse", Source: control.SourceAutomatic}
	b, err := e.s.CreateOverride(e.ctx, control.Change{Actor: control.ActorAbuseDetector}, ban)
	if err != nil {
		t.Fatal(err)
	}
	custom := control.Override{Tenant: "acme", Type: control.OverrideCustom, Limit: 10, Burst: 20, ExpiresAt: e.clock.Now().Add(time.Hour), Source: control.SourceAPI}
	c, err := e.s.CreateOverride(e.ctx, ch(""), custom)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(os []control.Override) []int64 {
		var out []int64
		for _, o := range os {
			out = append(out, o.ID)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    control.OverrideFilter
		want []int64
	}{
		{"all", control.OverrideFilter{}, []int64{o.ID, b.ID, c.ID}},
		{"tenant", control.OverrideFilter{Tenant: "acme"}, []int64{o.ID, c.ID}},
		{"user", control.OverrideFilter{User: "john"}, []int64{o.ID}},
		{"api key", control.OverrideFilter{APIKey: "k1"}, []int64{o.ID}},
		{"source", control.OverrideFilter{Source: control.SourceAutomatic}, []int64{b.ID}},
		{"nothing", control.OverrideFilter{Tenant: "nobody"}, nil},
		{"first page", control.OverrideFilter{Limit: 2}, []int64{o.ID, b.ID}},
		{"next page", control.OverrideFilter{AfterID: b.ID, Limit: 2}, []int64{c.ID}},
		{"page past the end", control.OverrideFilter{AfterID: c.ID, Limit: 2}, nil},
		{"page and filter", control.OverrideFilter{Tenant: "acme", AfterID: o.ID, Limit: 1}, []int64{c.ID}},
	} {
		got, err := e.s.ListOverrides(e.ctx, tc.f)
		if err != nil || !slices.Equal(ids(got), tc.want) {
			t.Errorf("ListOverrides(%s) = %v, %v; want %v", tc.name, ids(got), err, tc.want)
		}
	}

	// Past its expiry an override is no longer listed, but still readable until Expire.
	e.clock.Advance(2 * time.Minute)
	if got, _ := e.s.ListOverrides(e.ctx, control.OverrideFilter{}); !slices.Equal(ids(got), []int64{o.ID, c.ID}) {
		t.Errorf("ListOverrides after the ban expired = %v, want %v", ids(got), []int64{o.ID, c.ID})
	}
	if _, err := e.s.GetOverride(e.ctx, b.ID); err != nil {
		t.Errorf("GetOverride of an expired override: %v", err)
	}

	e.unchanged("delete with a stale etag", control.ErrPreconditionFailed, func() error {
		_, err := e.s.DeleteOverride(e.ctx, ch("999"), o.ID)
		return err
	})
	v, err := e.s.DeleteOverride(e.ctx, ch(o.ETag()), o.ID)
	if err != nil {
		t.Fatalf("DeleteOverride: %v", err)
	}
	ev = e.lastEvent(control.ActionDelete, control.KindOverride, id, v)
	if ev.Before == nil || ev.After != nil || ev.Reason != "testing" {
		t.Errorf("delete event = %+v", ev)
	}
	if _, err := e.s.GetOverride(e.ctx, o.ID); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("GetOverride after delete: %v", err)
	}
	e.unchanged("delete a missing override", control.ErrNotFound, func() error {
		_, err := e.s.DeleteOverride(e.ctx, ch(""), o.ID)
		return err
	})
	// Ids are never reused: a deleted override's id does not come back.
	n, err := e.s.CreateOverride(e.ctx, ch(""), in)
	if err != nil || n.ID <= c.ID {
		t.Errorf("a new override got id %d (%v), want one above %d", n.ID, err, c.ID)
	}
}

func testOverrideConflict(t *testing.T, e *env) {
	first, err := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.unchanged("same target", control.ErrConflict, func() error {
		o := e.override("acme", "", time.Hour)
		o.Type = control.OverrideBan
		_, err := e.s.CreateOverride(e.ctx, ch(""), o)
		return err
	})
	// Other targets are free: the tuple (tenant, user, api_key, endpoint, rule) is the key,
	// with no ambiguity between "a:b"+"c" and "a"+"b:c".
	for _, o := range []control.Override{
		e.override("acme", "john", time.Hour),
		e.override("acme:john", "", time.Hour),
		func() control.Override { o := e.override("acme", "", time.Hour); o.Rule = "r"; return o }(),
	} {
		if _, err := e.s.CreateOverride(e.ctx, ch(""), o); err != nil {
			t.Errorf("CreateOverride(%+v): %v", o, err)
		}
	}
	e.unchanged("If-Match on a create", control.ErrPreconditionFailed, func() error {
		_, err := e.s.CreateOverride(e.ctx, ch("*"), e.override("other", "", time.Hour))
		return err
	})

	// Once the first has expired, its target is free: the old one is expired in the same
	// transaction, audited as such.
	e.clock.Advance(time.Minute)
	second, err := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Hour))
	if err != nil {
		t.Fatalf("CreateOverride over an expired one: %v", err)
	}
	evs := e.audit()
	if evs[0].Action != control.ActionCreate || evs[0].Target != strconv.FormatInt(second.ID, 10) ||
		evs[1].Action != control.ActionExpire || evs[1].Actor != control.ActorSystem || evs[1].Target != strconv.FormatInt(first.ID, 10) ||
		evs[0].Version != evs[1].Version {
		t.Errorf("events = %+v, %+v; want the expiry of %d and the create of %d in one version", evs[1], evs[0], first.ID, second.ID)
	}
	if _, err := e.s.GetOverride(e.ctx, first.ID); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("the expired override is still there: %v", err)
	}
}

func testOverrideInvalid(t *testing.T, e *env) {
	ok := e.override("acme", "", time.Hour)
	cases := []struct {
		name  string
		edit  func(*control.Override)
		field string
	}{
		{"no target", func(o *control.Override) { o.Tenant = "" }, "tenant"},
		{"bad type", func(o *control.Override) { o.Type = "throttle" }, "type"},
		{"multiplier without value", func(o *control.Override) { o.Value = 0 }, "value"},
		{"negative value", func(o *control.Override) { o.Type, o.Value = control.OverrideCustom, -1 }, "value"},
		{"negative limit", func(o *control.Override) { o.Limit = -1 }, "limit"},
		{"negative burst", func(o *control.Override) { o.Burst = -1 }, "burst"},
		{"no expiry", func(o *control.Override) { o.ExpiresAt = time.Time{} }, "expires_at"},
		{"expired", func(o *control.Override) { o.ExpiresAt = e.clock.Now().Add(-time.Second) }, "expires_at"},
		{"expires now", func(o *control.Override) { o.ExpiresAt = e.clock.Now() }, "expires_at"},
		{"year 10000", func(o *control.Override) { o.ExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "expires_at"},
		{"bad source", func(o *control.Override) { o.Source = "file" }, "source"},
		{"long tenant", func(o *control.Override) { o.Tenant = strings.Repeat("t", control.MaxValueLen+1) }, "tenant"},
		{"long rule", func(o *control.Override) { o.Rule = strings.Repeat("r", control.MaxNameLen+1) }, "rule"},
	}
	for _, tc := range cases {
		o := ok
		tc.edit(&o)
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateOverride(e.ctx, ch(""), o)
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}
}

func testExemptions(t *testing.T, e *env) {
	exp := e.clock.Now().Add(time.Hour)
	forever, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{APIKey: "internal-health", Reason: "probes"})
	if err != nil {
		t.Fatalf("CreateExemption: %v", err)
	}
	if forever.ID <= 0 || forever.ExpiresAt != nil || forever.CreatedBy != "alice" || !forever.CreatedAt.Equal(e.now()) || forever.Version != 1 {
		t.Errorf("created exemption = %+v", forever)
	}
	e.lastEvent(control.ActionCreate, control.KindExemption, strconv.FormatInt(forever.ID, 10), 1)
	cidr, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{IP: "10.0.0.0/8", ExpiresAt: &exp})
	if err != nil {
		t.Fatal(err)
	}
	if cidr.ExpiresAt == nil || !cidr.ExpiresAt.Equal(exp.Truncate(time.Microsecond)) || cidr.ExpiresAt.Location() != time.UTC {
		t.Errorf("expires_at = %v, want %v in UTC", cidr.ExpiresAt, exp)
	}
	got, err := e.s.GetExemption(e.ctx, cidr.ID)
	if err != nil || !reflect.DeepEqual(got, cidr) {
		t.Errorf("GetExemption = %+v, %v; want %+v", got, err, cidr)
	}
	e.unchanged("same caller", control.ErrConflict, func() error {
		_, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{APIKey: "internal-health"})
		return err
	})
	for _, tc := range []struct {
		name string
		x    control.Exemption
	}{
		{"none", control.Exemption{Reason: "x"}},
		{"two", control.Exemption{User: "u", Tenant: "t"}},
	} {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateExemption(e.ctx, ch(""), tc.x)
			invalid(t, tc.name, err, "api_key")
			return err
		})
	}
	past := e.clock.Now().Add(-time.Second)
	e.unchanged("already expired", control.ErrInvalid, func() error {
		_, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "u", ExpiresAt: &past})
		invalid(t, "already expired", err, "expires_at")
		return err
	})
	list, err := e.s.ListExemptions(e.ctx)
	if err != nil || len(list) != 2 {
		t.Errorf("ListExemptions = %+v, %v; want 2", list, err)
	}
	e.clock.Advance(time.Hour)
	if list, _ := e.s.ListExemptions(e.ctx); len(list) != 1 || list[0].ID != forever.ID {
		t.Errorf("ListExemptions after the CIDR's expiry = %+v, want only %d", list, forever.ID)
	}
	// Its caller is free again: the expired one goes in the same transaction.
	if _, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{IP: "10.0.0.0/8"}); err != nil {
		t.Errorf("CreateExemption over an expired one: %v", err)
	}
	v, err := e.s.DeleteExemption(e.ctx, ch(forever.ETag()), forever.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.lastEvent(control.ActionDelete, control.KindExemption, strconv.FormatInt(forever.ID, 10), v)
	e.unchanged("delete a missing exemption", control.ErrNotFound, func() error {
		_, err := e.s.DeleteExemption(e.ctx, ch(""), forever.ID)
		return err
	})
}

func testIdentities(t *testing.T, e *env) {
	trust := 0.75
	in := control.Identity{Kind: control.IdentityAPIKey, Value: "key-1", Tier: "premium", Tenant: "acme", User: "john", Trust: &trust}
	id, created, err := e.s.PutIdentity(e.ctx, ch(""), in)
	if err != nil || !created {
		t.Fatalf("PutIdentity = %v, %v; want created", created, err)
	}
	if id.UpdatedBy != "alice" || !id.UpdatedAt.Equal(e.now()) || id.Version != 1 || *id.Trust != 0.75 {
		t.Errorf("created identity = %+v", id)
	}
	e.lastEvent(control.ActionCreate, control.KindIdentity, "api_key/key-1", 1)
	got, err := e.s.GetIdentity(e.ctx, control.IdentityAPIKey, "key-1")
	if err != nil || !reflect.DeepEqual(got, id) {
		t.Errorf("GetIdentity = %+v, %v; want %+v", got, err, id)
	}

	e.unchanged("stale etag", control.ErrPreconditionFailed, func() error {
		_, _, err := e.s.PutIdentity(e.ctx, ch("999"), in)
		return err
	})
	in.Tier, in.Trust = "free", nil
	up, created, err := e.s.PutIdentity(e.ctx, ch(id.ETag()), in)
	if err != nil || created || up.Tier != "free" || up.Trust != nil || up.Version != 2 {
		t.Fatalf("PutIdentity (replace) = %+v, %v, %v", up, created, err)
	}
	ev := e.lastEvent(control.ActionUpdate, control.KindIdentity, "api_key/key-1", 2)
	var before, after control.Identity
	if json.Unmarshal(ev.Before, &before) != nil || json.Unmarshal(ev.After, &after) != nil || before.Tier != "premium" || after.Tier != "free" {
		t.Errorf("update event before %s after %s", ev.Before, ev.After)
	}
	e.unchanged("If-Match on a new assignment", control.ErrPreconditionFailed, func() error {
		_, _, err := e.s.PutIdentity(e.ctx, ch("*"), control.Identity{Kind: control.IdentityUser, Value: "new"})
		return err
	})

	for _, x := range []control.Identity{
		{Kind: control.IdentityUser, Value: "john", Tier: "gold"},
		{Kind: control.IdentityTenant, Value: "acme", Tier: "enterprise"},
		{Kind: control.IdentityTenant, Value: "globex"},
	} {
		if _, _, err := e.s.PutIdentity(e.ctx, ch(""), x); err != nil {
			t.Fatal(err)
		}
	}
	all, err := e.s.ListIdentities(e.ctx, "")
	if err != nil || len(all) != 4 || all[0].Kind != control.IdentityAPIKey || all[1].Value != "acme" || all[3].Kind != control.IdentityUser {
		t.Errorf("ListIdentities(all) = %+v, %v; want by kind then value", all, err)
	}
	tenants, err := e.s.ListIdentities(e.ctx, control.IdentityTenant)
	if err != nil || len(tenants) != 2 {
		t.Errorf("ListIdentities(tenant) = %+v, %v", tenants, err)
	}

	bad := []struct {
		name  string
		x     control.Identity
		field string
	}{
		{"bad kind", control.Identity{Kind: "ip", Value: "1.2.3.4"}, "kind"},
		{"no value", control.Identity{Kind: control.IdentityUser}, "value"},
		{"user with a tenant", control.Identity{Kind: control.IdentityUser, Value: "u", Tenant: "t"}, "tenant"},
		{"tenant with a user", control.Identity{Kind: control.IdentityTenant, Value: "t", User: "u"}, "user"},
		{"trust above 1", control.Identity{Kind: control.IdentityUser, Value: "u", Trust: ptr(1.5)}, "trust"},
		{"trust below 0", control.Identity{Kind: control.IdentityUser, Value: "u", Trust: ptr(-0.1)}, "trust"},
	}
	for _, tc := range bad {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, _, err := e.s.PutIdentity(e.ctx, ch(""), tc.x)
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}

	v, err := e.s.DeleteIdentity(e.ctx, ch(""), control.IdentityAPIKey, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	e.lastEvent(control.ActionDelete, control.KindIdentity, "api_key/key-1", v)
	e.unchanged("delete a missing assignment", control.ErrNotFound, func() error {
		_, err := e.s.DeleteIdentity(e.ctx, ch(""), control.IdentityAPIKey, "key-1")
		return err
	})
	// The key is (kind, value): the user "acme" is not the tenant "acme".
	if _, err := e.s.GetIdentity(e.ctx, control.IdentityUser, "acme"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("GetIdentity(user acme) = %v, want ErrNotFound", err)
	}
}

func ptr[T any](v T) *T { return &v }

func testTokens(t *testing.T, e *env) {
	const secret = "s3cr3t-token-value"
	tok, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ci", Role: control.RoleWrite, Hash: control.HashToken(secret)})
	if err != nil {
		t.Fatalf("CreateToken: %v", err)
	}
	if tok.CreatedBy != "alice" || !tok.CreatedAt.Equal(e.now()) || tok.Version != 1 {
		t.Errorf("created token = %+v", tok)
	}
	ev := e.lastEvent(control.ActionCreate, control.KindToken, "ci", 1)
	hash := control.HashToken(secret)
	for _, leak := range []string{secret, "hash", string(hash[:])} {
		if strings.Contains(string(ev.After), leak) {
			t.Errorf("the audit event shows %q: %s", leak, ev.After)
		}
	}
	got, err := e.s.TokenByHash(e.ctx, control.HashToken(secret))
	if err != nil || !reflect.DeepEqual(got, tok) {
		t.Errorf("TokenByHash = %+v, %v; want %+v", got, err, tok)
	}
	if _, err := e.s.TokenByHash(e.ctx, control.HashToken(secret+"x")); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("TokenByHash of a wrong secret = %v, want ErrNotFound", err)
	}
	if got, err := e.s.GetToken(e.ctx, "ci"); err != nil || got.Role != control.RoleWrite {
		t.Errorf("GetToken = %+v, %v", got, err)
	}
	e.unchanged("a taken name", control.ErrConflict, func() error {
		_, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ci", Role: control.RoleRead, Hash: control.HashToken("other")})
		return err
	})
	e.unchanged("a taken secret", control.ErrConflict, func() error {
		_, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ci2", Role: control.RoleRead, Hash: control.HashToken(secret)})
		return err
	})
	for _, tc := range []struct {
		name  string
		tok   control.Token
		field string
	}{
		{"bad role", control.Token{Name: "x", Role: "root", Hash: control.HashToken("a")}, "role"},
		{"no name", control.Token{Role: control.RoleRead, Hash: control.HashToken("a")}, "name"},
		{"no hash", control.Token{Name: "x", Role: control.RoleRead}, "token"},
	} {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateToken(e.ctx, ch(""), tc.tok)
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}
	if _, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "admin", Role: control.RoleAdmin, Hash: control.HashToken("root")}); err != nil {
		t.Fatal(err)
	}
	list, err := e.s.ListTokens(e.ctx)
	if err != nil || len(list) != 2 || list[0].Name != "admin" || list[1].Name != "ci" {
		t.Errorf("ListTokens = %+v, %v", list, err)
	}
	v, err := e.s.DeleteToken(e.ctx, ch(""), "ci")
	if err != nil {
		t.Fatal(err)
	}
	e.lastEvent(control.ActionDelete, control.KindToken, "ci", v)
	if _, err := e.s.TokenByHash(e.ctx, control.HashToken(secret)); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("TokenByHash after delete = %v", err)
	}
	// The schema has no column a secret could be written to.
	if e.h.Columns != nil {
		cols := e.h.Columns(t, e.addr, "tokens")
		slices.Sort(cols)
		want := []string{"created_at", "created_by", "expires_at", "hash", "last_used_at", "name", "role", "version"}
		if !slices.Equal(cols, want) {
			t.Errorf("tokens columns = %v, want %v", cols, want)
		}
	}
	// Roles include the weaker ones.
	for _, tc := range []struct {
		have, need control.Role
		ok         bool
	}{
		{control.RoleRead, control.RoleRead, true}, {control.RoleRead, control.RoleWrite, false},
		{control.RoleWrite, control.RoleRead, true}, {control.RoleWrite, control.RoleAdmin, false},
		{control.RoleAdmin, control.RoleWrite, true}, {"", control.RoleRead, false}, {"root", control.RoleRead, false},
	} {
		if got := tc.have.Allows(tc.need); got != tc.ok {
			t.Errorf("%q.Allows(%q) = %v, want %v", tc.have, tc.need, got, tc.ok)
		}
	}
}
