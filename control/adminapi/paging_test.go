package adminapi_test

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// TestOverridesPaged: GET /admin/v1/overrides pages by ?limit= and ?after=; following next
// lists every override once, in order, and the last page has no next. Without ?limit= a short
// list answers whole, as before paging. A bad limit or cursor is a 400 naming the field.
func TestOverridesPaged(t *testing.T) {
	e := newEnv(t)
	var want []string
	for i := range 7 {
		o, err := e.store.CreateOverride(e.ctx, control.Change{Actor: "test"}, control.Override{
			Tenant: fmt.Sprintf("t%d", i), Type: control.OverrideBan, ExpiresAt: e.clock.Now().Add(time.Hour), Source: control.SourceAPI})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprint(o.ID))
	}
	ids := func(r *reply) []string {
		var out []string
		for _, o := range r.json["overrides"].([]any) {
			out = append(out, fmt.Sprint(o.(map[string]any)["id"]))
		}
		return out
	}
	// The policy files' overrides come first (admintest has one).
	files := ids(e.do(call{method: "GET", path: "/admin/v1/overrides?source=file", role: control.RoleRead}).want(t, 200))
	if len(files) == 0 {
		t.Fatal("no file override: the test would not cross from the files to the store")
	}
	want = append(files, want...)
	n := len(want)
	for _, tc := range []struct {
		limit     string
		wantPages int
	}{{"1", n}, {"3", (n + 2) / 3}, {fmt.Sprint(n), 1}, {fmt.Sprint(n - 1), 2}, {"100", 1}, {"", 1}} {
		var got []string
		pages, after := 0, ""
		for {
			q := url.Values{}
			if tc.limit != "" {
				q.Set("limit", tc.limit)
			}
			if after != "" {
				q.Set("after", after)
			}
			r := e.do(call{method: "GET", path: "/admin/v1/overrides?" + q.Encode(), role: control.RoleRead}).want(t, 200)
			pages++
			got = append(got, ids(r)...)
			after = r.str("next")
			if after == "" || pages > 10 {
				break
			}
		}
		if !slices.Equal(got, want) || pages != tc.wantPages {
			t.Errorf("limit %q: %d pages of %v, want %d pages of %v", tc.limit, pages, got, tc.wantPages, want)
		}
	}
	// A filter pages too.
	r := e.do(call{method: "GET", path: "/admin/v1/overrides?tenant=t3&limit=1", role: control.RoleRead}).want(t, 200)
	if got := ids(r); !slices.Equal(got, want[len(files)+3:len(files)+4]) || r.str("next") != "" {
		t.Errorf("tenant t3: %v next %q", got, r.str("next"))
	}
	for _, tc := range []struct{ query, field string }{
		{"limit=0", "limit"},
		{"limit=10001", "limit"},
		{"limit=x", "limit"},
		{"after=!!", "after"},
		{"after=" + "eDox", "after"},   // "x:1": a part this list has not
		{"after=" + "czotMQ", "after"}, // "s:-1"
		{"after=" + "c2Y", "after"},    // "sf": no key
	} {
		r := e.do(call{method: "GET", path: "/admin/v1/overrides?" + tc.query, role: control.RoleRead}).want(t, 400)
		if got := r.str("field"); got != tc.field {
			t.Errorf("%s: 400 field %q, want %q: %s", tc.query, got, tc.field, r.raw)
		}
	}
}

// TestListsPaged: every list of the admin API pages as overrides do. Walking a list a page at a
// time, with an item created between pages (one sorting before the cursor, one after), lists
// each item present at the start exactly once and in the order of the whole list, the item
// created after the cursor once, and nothing twice. A cursor of another list, or a bad limit, is
// a 400 naming the field.
func TestListsPaged(t *testing.T) {
	type list struct {
		name, path string
		key        func(map[string]any) string
		// create makes the item numbered n, whose key sorts by n (and after the files').
		create func(e *env, n int)
		// foreign is a cursor of another list, which this list refuses.
		foreign string
	}
	field := func(f string) func(map[string]any) string {
		return func(m map[string]any) string { return fmt.Sprint(m[f]) }
	}
	s := cursorOf("s:1")
	n := cursorOf("n:zz")
	lists := []list{
		{"overrides", "/admin/v1/overrides", field("id"), func(e *env, i int) {
			e.mustCreate("POST", "/admin/v1/overrides", fmt.Sprintf(`{"tenant":"t%03d","type":"ban","ttl":"1h","reason":"r"}`, i))
		}, n},
		{"exemptions", "/admin/v1/exemptions", field("id"), func(e *env, i int) {
			e.mustCreate("POST", "/admin/v1/exemptions", fmt.Sprintf(`{"api_key":"k%03d","reason":"r"}`, i))
		}, n},
		{"identities", "/admin/v1/identities", func(m map[string]any) string { return fmt.Sprint(m["kind"], "/", m["value"]) }, func(e *env, i int) {
			e.mustCreate("PUT", fmt.Sprintf("/admin/v1/identities/user/u%03d", i), `{"tier":"gold"}`)
		}, s},
		{"rules", "/admin/v1/rules", field("name"), func(e *env, i int) {
			e.mustCreate("POST", "/admin/v1/rules", fmt.Sprintf(`{"name":"r%03d","limit":1,"period":"1s"}`, i))
		}, s},
		{"tokens", "/admin/v1/tokens", field("name"), func(e *env, i int) {
			r := e.do(call{method: "POST", path: "/admin/v1/tokens", role: control.RoleAdmin, body: fmt.Sprintf(`{"name":"t%03d","role":"read"}`, i)})
			r.want(e.t, 201)
		}, s},
		{"domains", "/admin/v1/domains", field("domain"), func(e *env, i int) {
			e.mustCreate("PUT", fmt.Sprintf("/admin/v1/domains/d%03d", i),
				`{"descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`)
		}, s},
	}
	for _, l := range lists {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t)
			for i := 100; i < 114; i += 2 {
				l.create(e, i)
			}
			get := func(q url.Values) *reply {
				return e.do(call{method: "GET", path: l.path + "?" + q.Encode(), role: control.RoleAdmin}).want(t, 200)
			}
			keys := func(r *reply) []string {
				var out []string
				for _, it := range r.json[l.name].([]any) {
					out = append(out, l.key(it.(map[string]any)))
				}
				return out
			}
			whole := get(url.Values{"limit": {"10000"}})
			want := keys(whole)
			if whole.str("next") != "" || len(want) < 5 {
				t.Fatalf("whole list: %v next %q", want, whole.str("next"))
			}
			for _, limit := range []int{1, 2, 3} {
				var got []string
				after, pages, mark := "", 0, ""
				for ; pages <= 3*len(want); pages++ {
					q := url.Values{"limit": {fmt.Sprint(limit)}}
					if after != "" {
						q.Set("after", after)
					}
					r := get(q)
					page := keys(r)
					if len(page) > limit {
						t.Fatalf("limit %d: page of %d", limit, len(page))
					}
					got = append(got, page...)
					if after = r.str("next"); after == "" {
						break
					}
					if pages == 2 { // between pages: one item sorting before the cursor, one after
						mark = got[len(got)-1]
						l.create(e, 10*limit+1)
						l.create(e, 200+limit)
					}
				}
				var before []string
				for _, k := range got {
					if slices.Contains(want, k) {
						before = append(before, k)
					}
				}
				slices.Sort(before)
				sorted := slices.Clone(want)
				slices.Sort(sorted)
				if !slices.Equal(before, sorted) || len(got) != len(slices.Compact(slices.Sorted(slices.Values(got)))) {
					t.Errorf("limit %d: %d pages listed %v, want each of %v once", limit, pages, got, want)
				}
				now := keys(get(url.Values{"limit": {"10000"}}))
				for i, k := range now {
					if mark != "" && !slices.Contains(got, k) && i > slices.Index(now, mark) {
						t.Errorf("limit %d: listed %v: %s, created after the cursor %s, is missing", limit, got, k, mark)
					}
				}
				if mark == "" {
					t.Errorf("limit %d: %d pages: nothing was created between pages", limit, pages)
				}
				want = now
			}
			for _, tc := range []struct{ query, field string }{
				{"limit=0", "limit"}, {"limit=10001", "limit"}, {"after=!!", "after"}, {"after=" + l.foreign, "after"},
			} {
				r := e.do(call{method: "GET", path: l.path + "?" + tc.query, role: control.RoleAdmin}).want(t, 400)
				if got := r.str("field"); got != tc.field {
					t.Errorf("%s: 400 field %q, want %q: %s", tc.query, got, tc.field, r.raw)
				}
			}
		})
	}
}

// cursorOf encodes a raw cursor as the server does.
func cursorOf(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }

// TestCursorsRefused: a cursor that this server could not have given for the list is a 400
// naming after, whatever part of it is wrong.
func TestCursorsRefused(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ path, raw string }{
		{"/admin/v1/identities", "i:robot:x"}, // no such kind
		{"/admin/v1/identities", "i:user"},    // no value
		{"/admin/v1/identities", "s:1"},       // another list's
		{"/admin/v1/domains", "n:"},           // no name
		{"/admin/v1/domains", "f:1"},          // the files' domains go by name
		{"/admin/v1/rules", "fn:x"},           // the files' rules go by index
		{"/admin/v1/rules", "f:-1"},
		{"/admin/v1/tokens", "n"},
		{"/admin/v1/exemptions", "s:x"},
		{"/admin/v1/exemptions", "i:user:x"},
	} {
		r := e.do(call{method: "GET", path: tc.path + "?after=" + cursorOf(tc.raw), role: control.RoleAdmin}).want(t, 400)
		if got := r.str("field"); got != "after" {
			t.Errorf("%s after %q: 400 field %q, want after: %s", tc.path, tc.raw, got, r.raw)
		}
	}
	// A name cursor may hold any name, colons included.
	e.do(call{method: "GET", path: "/admin/v1/identities?after=" + cursorOf("i:api_key:a:b"), role: control.RoleAdmin}).want(t, 200)
}

// TestViolationsPaged: GET /admin/v1/violations pages by ?limit= (minute counts) and ?after=;
// following next lists every count once, newest minute first, and the last page has no next.
func TestViolationsPaged(t *testing.T) {
	e := newEnv(t)
	m0 := e.clock.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	var viols []control.ViolationCount
	for i := range 5 {
		viols = append(viols, control.ViolationCount{Minute: m0.Add(time.Duration(i) * time.Minute), Rule: "r", User: fmt.Sprintf("u%d", i), Denied: 1, Soft: int64(i % 2), Limit: 10})
	}
	if err := e.store.AddCounts(e.ctx, nil, viols); err != nil {
		t.Fatal(err)
	}
	var users []string
	after, pages := "", 0
	for ; pages < 10; pages++ {
		q := url.Values{"limit": {"2"}}
		if after != "" {
			q.Set("after", after)
		}
		r := e.do(call{method: "GET", path: "/admin/v1/violations?" + q.Encode(), role: control.RoleRead}).want(t, 200)
		for _, v := range r.json["violations"].([]any) {
			if m := v.(map[string]any); m["state"] == "hard" {
				users = append(users, m["user"].(string))
			}
		}
		if after = r.str("next"); after == "" {
			break
		}
	}
	if want := []string{"u4", "u3", "u2", "u1", "u0"}; !slices.Equal(users, want) || pages != 2 {
		t.Errorf("%d pages of %v, want 3 pages of %v", pages+1, users, want)
	}
	for _, raw := range []string{"v:[1,2,3]", "v:x", "s:1", "v:[1,\"r\"]"} {
		r := e.do(call{method: "GET", path: "/admin/v1/violations?after=" + cursorOf(raw), role: control.RoleRead}).want(t, 400)
		if r.str("field") != "after" {
			t.Errorf("after %q: %s", raw, r.raw)
		}
	}
}
