package adminapi_test

import (
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
