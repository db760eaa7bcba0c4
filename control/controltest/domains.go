package controltest

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testDomains: an Envoy domain is created, replaced (with and without If-Match), listed by
// name, loaded, and deleted, each change audited with the body before and after.
func testDomains(t *testing.T, e *env) {
	body := json.RawMessage(`{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`)
	d, created, err := e.s.PutDomain(e.ctx, ch(""), "edge", body)
	if err != nil || !created {
		t.Fatalf("PutDomain = %v, %v; want created", created, err)
	}
	if d.Version != 1 || d.ETag() != "1" || !d.CreatedAt.Equal(e.now()) || !d.UpdatedAt.Equal(e.now()) || d.UpdatedBy != "alice" || string(d.Body) != string(body) {
		t.Errorf("created domain = %+v", d)
	}
	ev := e.lastEvent(control.ActionCreate, control.KindDomain, "edge", 1)
	if ev.Actor != "alice" || ev.Reason != "testing" || ev.Before != nil || !sameJSON(t, ev.After, body) {
		t.Errorf("create event = %+v", ev)
	}
	got, err := e.s.GetDomain(e.ctx, "edge")
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("GetDomain = %+v, %v; want %+v", got, err, d)
	}

	e.unchanged("stale etag", control.ErrPreconditionFailed, func() error {
		_, _, err := e.s.PutDomain(e.ctx, ch("999"), "edge", body)
		return err
	})
	e.unchanged("If-Match on a new domain", control.ErrPreconditionFailed, func() error {
		_, _, err := e.s.PutDomain(e.ctx, ch("*"), "new", body)
		return err
	})
	e.clock.Advance(time.Second)
	body2 := json.RawMessage(`{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"minute","requests_per_unit":100}}]}`)
	up, created, err := e.s.PutDomain(e.ctx, ch(d.ETag()), "edge", body2)
	if err != nil || created || up.Version != 2 || !up.CreatedAt.Equal(d.CreatedAt) || !up.UpdatedAt.Equal(e.now()) || string(up.Body) != string(body2) {
		t.Fatalf("PutDomain (replace) = %+v, %v, %v", up, created, err)
	}
	ev = e.lastEvent(control.ActionUpdate, control.KindDomain, "edge", 2)
	if !sameJSON(t, ev.Before, body) || !sameJSON(t, ev.After, body2) {
		t.Errorf("update event before %s after %s", ev.Before, ev.After)
	}
	other, _, err := e.s.PutDomain(e.ctx, ch(""), "api", json.RawMessage(`{"domain":"api"}`))
	if err != nil {
		t.Fatal(err)
	}
	list, err := e.s.ListDomains(e.ctx)
	if err != nil || len(list) != 2 || list[0].Name != "api" || list[1].Name != "edge" {
		t.Errorf("ListDomains = %+v, %v; want api, edge", list, err)
	}
	st, err := e.s.Load(e.ctx)
	if err != nil || !reflect.DeepEqual(st.Domains, []control.Domain{other, up}) {
		t.Errorf("Load().Domains = %+v, %v; want %+v", st.Domains, err, []control.Domain{other, up})
	}

	for _, tc := range []struct {
		name, domain string
		body         string
		field        string
	}{
		{"no name", "", `{"domain":""}`, "domain"},
		{"a name too long", strings.Repeat("d", control.MaxNameLen+1), `{}`, "domain"},
		{"a NUL in the name", "a\x00b", `{}`, "domain"},
		{"not JSON", "x", `domain: x`, "body"},
		{"not an object", "x", `["x"]`, "body"},
		{"too large", "x", `{"domain":"` + strings.Repeat("x", control.MaxDomainBodyLen) + `"}`, "body"},
	} {
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, _, err := e.s.PutDomain(e.ctx, ch(""), tc.domain, json.RawMessage(tc.body))
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}

	v, err := e.s.DeleteDomain(e.ctx, ch(""), "edge")
	if err != nil {
		t.Fatal(err)
	}
	ev = e.lastEvent(control.ActionDelete, control.KindDomain, "edge", v)
	if !sameJSON(t, ev.Before, body2) || ev.After != nil {
		t.Errorf("delete event before %s after %s", ev.Before, ev.After)
	}
	if _, err := e.s.GetDomain(e.ctx, "edge"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("GetDomain after delete: %v, want ErrNotFound", err)
	}
	e.unchanged("delete a missing domain", control.ErrNotFound, func() error {
		_, err := e.s.DeleteDomain(e.ctx, ch(""), "edge")
		return err
	})
	e.unchanged("delete a missing domain with If-Match", control.ErrPreconditionFailed, func() error {
		_, err := e.s.DeleteDomain(e.ctx, ch("*"), "edge")
		return err
	})
	e.unchanged("delete with a stale etag", control.ErrPreconditionFailed, func() error {
		_, err := e.s.DeleteDomain(e.ctx, ch("999"), "api")
		return err
	})
}
