package controltest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// pagedList is one list of control.Pager, seen through string keys in the list's order.
type pagedList struct {
	name string
	// create stores the item numbered n; its key sorts by n among the items create makes.
	create func(e *env, n int) error
	// page lists the keys of the page after key ("" for the first), at most limit (0: all).
	page func(e *env, after string, limit int) ([]string, error)
}

// pagedLists are the lists of control.Pager.
var pagedLists = []pagedList{
	{"exemptions", func(e *env, n int) error {
		_, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: fmt.Sprintf("u%03d", n), Reason: "r"})
		return err
	}, func(e *env, after string, limit int) ([]string, error) {
		id, _ := strconv.ParseInt(after, 10, 64)
		items, err := e.s.PageExemptions(e.ctx, control.Page{AfterID: id, Limit: limit})
		return keysOf(items, err, func(x control.Exemption) string { return strconv.FormatInt(x.ID, 10) })
	}},
	{"identities", func(e *env, n int) error {
		// Every kind, so that pages cross from one kind to the next.
		kind := []control.IdentityKind{control.IdentityAPIKey, control.IdentityTenant, control.IdentityUser}[n%3]
		_, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: kind, Value: fmt.Sprintf("v%03d", n), Tier: "gold"})
		return err
	}, func(e *env, after string, limit int) ([]string, error) {
		kind, value, _ := strings.Cut(after, ":")
		items, err := e.s.PageIdentities(e.ctx, "", control.Page{AfterKind: control.IdentityKind(kind), AfterName: value, Limit: limit})
		return keysOf(items, err, func(x control.Identity) string { return string(x.Kind) + ":" + x.Value })
	}},
	{"rules", func(e *env, n int) error {
		_, err := e.s.CreateRule(e.ctx, ch(""), fmt.Sprintf("r%03d", n), json.RawMessage(`{}`))
		return err
	}, func(e *env, after string, limit int) ([]string, error) {
		items, err := e.s.PageRules(e.ctx, control.Page{AfterName: after, Limit: limit})
		return keysOf(items, err, func(x control.Rule) string { return x.Name })
	}},
	{"tokens", func(e *env, n int) error {
		name := fmt.Sprintf("t%03d", n)
		_, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: name, Role: control.RoleRead, Hash: control.HashToken("paging-secret-" + name)})
		return err
	}, func(e *env, after string, limit int) ([]string, error) {
		items, err := e.s.PageTokens(e.ctx, control.Page{AfterName: after, Limit: limit})
		return keysOf(items, err, func(x control.Token) string { return x.Name })
	}},
	{"domains", func(e *env, n int) error {
		_, _, err := e.s.PutDomain(e.ctx, ch(""), fmt.Sprintf("d%03d", n), json.RawMessage(`{}`))
		return err
	}, func(e *env, after string, limit int) ([]string, error) {
		items, err := e.s.PageDomains(e.ctx, control.Page{AfterName: after, Limit: limit})
		return keysOf(items, err, func(x control.Domain) string { return x.Name })
	}},
}

func keysOf[T any](items []T, err error, key func(T) string) ([]string, error) {
	var out []string
	for _, x := range items {
		out = append(out, key(x))
	}
	return out, err
}

// testPaging: each paged list, walked a page at a time with items created between pages (one
// sorting before the cursor, one after), lists every item present at the start exactly once
// and in the list's order, the item created after the cursor too, and nothing twice; a page
// with no limit is the whole list, a page past the end empty.
func testPaging(t *testing.T, e *env) {
	for _, l := range pagedLists {
		t.Run(l.name, func(t *testing.T) {
			for n := 10; n <= 90; n += 10 {
				if err := l.create(e, n); err != nil {
					t.Fatal(err)
				}
			}
			for _, limit := range []int{1, 2, 4} {
				whole, err := l.page(e, "", 0)
				if err != nil || len(whole) < 9 {
					t.Fatalf("whole list: %v, %v", whole, err)
				}
				var got []string
				after, mark := "", ""
				for pages := 0; pages <= 3*len(whole); pages++ {
					page, err := l.page(e, after, limit)
					if err != nil {
						t.Fatal(err)
					}
					if len(page) > limit {
						t.Fatalf("limit %d: page of %d", limit, len(page))
					}
					if len(page) == 0 {
						break
					}
					got = append(got, page...)
					after = page[len(page)-1]
					if pages == 1 { // between pages: one item sorting before the cursor, one after
						mark = after
						if err := l.create(e, 100*limit+1); err != nil {
							t.Fatal(err)
						}
						if err := l.create(e, 1000+limit); err != nil {
							t.Fatal(err)
						}
					}
				}
				now, err := l.page(e, "", 0)
				if err != nil {
					t.Fatal(err)
				}
				var seen []string
				for _, k := range got {
					if !slices.Contains(now, k) {
						t.Errorf("limit %d: listed %s, which is not in the list %v", limit, k, now)
					}
					if slices.Contains(whole, k) {
						seen = append(seen, k)
					}
				}
				if !slices.Equal(seen, whole) {
					t.Errorf("limit %d: listed %v, want each of %v once, in order", limit, got, whole)
				}
				if len(slices.Compact(slices.Sorted(slices.Values(got)))) != len(got) {
					t.Errorf("limit %d: listed %v: an item twice", limit, got)
				}
				for i, k := range now {
					if i > slices.Index(now, mark) && !slices.Contains(got, k) {
						t.Errorf("limit %d: %s, created after the cursor %s, is missing from %v", limit, k, mark, got)
					}
				}
				if last, err := l.page(e, now[len(now)-1], limit); err != nil || len(last) != 0 {
					t.Errorf("limit %d: page past the end = %v, %v", limit, last, err)
				}
			}
		})
	}

	// Only active exemptions are paged; identities filter by kind across pages.
	t.Run("filters", func(t *testing.T) {
		exp := e.clock.Now().Add(time.Minute)
		x, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "soon-gone", Reason: "r", ExpiresAt: &exp})
		if err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(2 * time.Minute)
		all, err := e.s.PageExemptions(e.ctx, control.Page{})
		if err != nil || slices.ContainsFunc(all, func(y control.Exemption) bool { return y.ID == x.ID }) {
			t.Errorf("expired exemption paged: %v, %v", all, err)
		}
		var users []string
		after := ""
		for range 20 {
			page, err := e.s.PageIdentities(e.ctx, control.IdentityUser, control.Page{AfterKind: control.IdentityUser, AfterName: after, Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, id := range page {
				if id.Kind != control.IdentityUser {
					t.Fatalf("kind user paged %+v", id)
				}
				users = append(users, id.Value)
			}
			after = page[len(page)-1].Value
		}
		want, err := e.s.ListIdentities(e.ctx, control.IdentityUser)
		if err != nil || len(users) != len(want) || len(want) == 0 {
			t.Errorf("users paged %v, listed %d, %v", users, len(want), err)
		}
	})
}

// testPagingViolations: violation counts walked a page at a time, newest minute first, while
// counts of a newer minute (before the cursor) and of an older one (after it) are added
// between pages: every count present at the start listed once, in order, the older one too,
// nothing twice; filters page as well.
func testPagingViolations(t *testing.T, e *env) {
	m0 := e.clock.Now().UTC().Truncate(time.Minute).Add(-time.Hour)
	var viols []control.ViolationCount
	for i := range 12 {
		viols = append(viols, control.ViolationCount{Minute: m0.Add(time.Duration(i%4) * time.Minute), Rule: []string{"a", "b"}[i%2],
			Tenant: "acme", User: fmt.Sprintf("u%02d", i), Denied: int64(i + 1), Limit: 10})
	}
	if err := e.s.AddCounts(e.ctx, nil, viols); err != nil {
		t.Fatal(err)
	}
	key := func(v control.PagedViolation) string {
		return fmt.Sprintf("%s|%s|%s", v.Minute.UTC().Format(time.RFC3339), v.Rule, v.User)
	}
	whole, err := e.s.PageViolations(e.ctx, control.ViolationFilter{}, nil, 1000)
	if err != nil || len(whole) != 12 {
		t.Fatalf("whole list: %d, %v", len(whole), err)
	}
	for i := 1; i < len(whole); i++ {
		a, b := whole[i-1].Key, whole[i].Key
		if a.Minute.Before(b.Minute) || (a.Minute.Equal(b.Minute) && (a.Rule > b.Rule || (a.Rule == b.Rule && a.Identity >= b.Identity))) {
			t.Fatalf("out of order at %d: %+v then %+v", i, a, b)
		}
	}
	var got []string
	var after *control.ViolationKey
	for pages := 0; pages < 20; pages++ {
		page, err := e.s.PageViolations(e.ctx, control.ViolationFilter{}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 2 {
			t.Fatalf("page of %d", len(page))
		}
		if len(page) == 0 {
			break
		}
		for _, v := range page {
			got = append(got, key(v))
		}
		k := page[len(page)-1].Key
		after = &k
		if pages == 1 { // a newer minute (before the cursor) and an older one (after it)
			if err := e.s.AddCounts(e.ctx, nil, []control.ViolationCount{
				{Minute: m0.Add(30 * time.Minute), Rule: "a", User: "newer", Denied: 1, Limit: 10},
				{Minute: m0.Add(-30 * time.Minute), Rule: "a", User: "older", Denied: 1, Limit: 10},
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want []string
	for _, v := range whole {
		want = append(want, key(v))
	}
	older := m0.Add(-30*time.Minute).Format(time.RFC3339) + "|a|older"
	if !slices.Equal(got, append(slices.Clone(want), older)) {
		t.Errorf("paged %v, want %v and then the older count", got, want)
	}
	// A filter pages too: rule b's six, three pages of two.
	var bs []string
	after = nil
	for range 10 {
		page, err := e.s.PageViolations(e.ctx, control.ViolationFilter{Rule: "b", Tenant: "acme"}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, v := range page {
			if v.Rule != "b" {
				t.Fatalf("rule b paged %+v", v)
			}
			bs = append(bs, key(v))
		}
		k := page[len(page)-1].Key
		after = &k
	}
	if len(bs) != 6 || len(slices.Compact(slices.Sorted(slices.Values(bs)))) != 6 {
		t.Errorf("rule b paged %v, want six", bs)
	}
}
