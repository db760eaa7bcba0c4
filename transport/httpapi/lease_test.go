package httpapi

import (
	"strings"
	"testing"
)

// TestReserveCommitRelease: a reservation over HTTP takes its estimate, a commit gives back
// what was not used, a repeat answers as the first, a release gives all back, and a denial is
// the check's 429.
func TestReserveCommitRelease(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	q := func() float64 {
		return decode(t, post(s, "/v1/quota", `{"tenant":"t","user":"r"}`))["remaining"].(float64)
	}
	w := post(s, "/v1/reserve", `{"tenant":"t","user":"r","cost":3,"ttl":"90s"}`)
	body := decode(t, w)
	lease, _ := body["lease"].(string)
	if w.Code != 200 || !strings.HasPrefix(lease, "ls_") || body["reserved"] != 3.0 || body["allowed"] != true || body["expires_at"] == nil || body["tenant"] != "t" || body["rule"] != "per-user" {
		t.Fatalf("reserve: %d %s", w.Code, w.Body)
	}
	if got := q(); got != 0 {
		t.Fatalf("after reserving 3 of 3: remaining %v", got)
	}
	if w := post(s, "/v1/reserve", `{"tenant":"t","user":"r"}`); w.Code != 429 || decode(t, w)["allowed"] != false {
		t.Fatalf("reserve past the limit: %d %s", w.Code, w.Body)
	}
	w = post(s, "/v1/commit", `{"tenant":"t","lease":"`+lease+`","used":1}`)
	if w.Code != 200 || w.Body.String() != `{"lease":"`+lease+`","reserved":3,"used":1,"repeated":false}`+"\n" {
		t.Fatalf("commit: %d %s", w.Code, w.Body)
	}
	if got := q(); got != 2 {
		t.Fatalf("reserved 3, used 1: remaining %v, want 2", got)
	}
	w = post(s, "/v1/commit", `{"tenant":"t","lease":"`+lease+`","used":3}`)
	if b := decode(t, w); w.Code != 200 || b["repeated"] != true || b["used"] != 1.0 || q() != 2 {
		t.Fatalf("second commit: %d %s", w.Code, w.Body)
	}
	lease = decode(t, post(s, "/v1/reserve", `{"tenant":"t","user":"r","cost":2}`))["lease"].(string)
	if w := post(s, "/v1/release", `{"tenant":"t","lease":"`+lease+`"}`); w.Code != 200 || decode(t, w)["used"] != 0.0 || q() != 2 {
		t.Fatalf("release: %d %s, remaining %v", w.Code, w.Body, q())
	}
}

// TestLeaseBadInput: bad reservations and settlements answer 400 naming the field, or 404 for
// a lease the caller does not hold, and change nothing.
func TestLeaseBadInput(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	lease := decode(t, post(s, "/v1/reserve", `{"tenant":"t","user":"h","cost":2}`))["lease"].(string)
	for _, c := range []struct {
		path, body string
		code       int
		field      string
	}{
		{"/v1/reserve", `{"tenant":"t","user":"h","ttl":"2h"}`, 400, "ttl"},
		{"/v1/reserve", `{"tenant":"t","user":"h","ttl":"soon"}`, 400, "ttl"},
		{"/v1/reserve", `{"tenant":"t","user":"h","ttl":"-1s"}`, 400, "ttl"},
		{"/v1/reserve", `{"tenant":"t","user":"h","cost":0}`, 400, "cost"},
		{"/v1/reserve", `{"tenant":"t","user":"h","cost":-2}`, 400, "cost"},
		{"/v1/check", `{"tenant":"t","user":"h","ttl":"1m"}`, 400, "ttl"},
		{"/v1/commit", `{"tenant":"t","lease":"` + lease + `","used":-1}`, 400, "used"},
		{"/v1/commit", `{"tenant":"t","lease":"` + lease + `","used":1.5}`, 400, "used"},
		{"/v1/commit", `{"tenant":"t","lease":"` + lease + `"}`, 400, "used"},
		{"/v1/commit", `{"tenant":"t","used":1}`, 400, "lease"},
		{"/v1/commit", `{"tenant":"t","lease":"nope","used":1}`, 400, "lease"},
		{"/v1/commit", `{"tenant":"t","lease":"` + lease + `","used":1,"extra":1}`, 400, "extra"},
		{"/v1/release", `{"tenant":"t","lease":"` + lease + `","used":1}`, 400, "used"},
		{"/v1/commit", `{"tenant":"t","lease":"ls_00000000000000000000000000000000","used":1}`, 404, "lease"},
		{"/v1/commit", `{"tenant":"other","lease":"` + lease + `","used":0}`, 404, "lease"},
		{"/v1/release", `{"lease":"` + lease + `"}`, 404, "lease"},
	} {
		w := post(s, c.path, c.body)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.field) {
			t.Errorf("%s %s: %d %s; want %d naming %s", c.path, c.body, w.Code, w.Body, c.code, c.field)
		}
	}
	if got := decode(t, post(s, "/v1/quota", `{"tenant":"t","user":"h"}`))["remaining"]; got != 1.0 {
		t.Fatalf("after bad settlements: remaining %v, want 1", got)
	}
	for _, c := range []struct {
		body  string
		code  int
		field string
	}{
		{`{"tenant":"t","lease":"` + lease + `","ttl":"5m"}`, 200, "expires_at"},
		{`{"tenant":"t","lease":"` + lease + `","ttl":"2h"}`, 400, "ttl"},
		{`{"tenant":"t","lease":"` + lease + `","ttl":"x"}`, 400, "ttl"},
		{`{"tenant":"u","lease":"` + lease + `","ttl":"5m"}`, 404, "lease"},
		{`{"tenant":"t","ttl":"5m"}`, 400, "lease"},
	} {
		if w := post(s, "/v1/renew", c.body); w.Code != c.code || !strings.Contains(w.Body.String(), c.field) {
			t.Errorf("renew %s: %d %s; want %d naming %s", c.body, w.Code, w.Body, c.code, c.field)
		}
	}
	if w := post(s, "/v1/release", `{"tenant":"t","lease":"`+lease+`"}`); w.Code != 200 {
		t.Fatalf("the owner's release: %d %s", w.Code, w.Body)
	}
	if w := post(s, "/v1/renew", `{"tenant":"t","lease":"`+lease+`"}`); w.Code != 409 || !strings.Contains(w.Body.String(), "settled") {
		t.Fatalf("renew a settled lease: %d %s, want 409", w.Code, w.Body)
	}
}
