package adminapi_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// A token created with a ttl shows its expiry and answers 401 once it has passed; its
// last-used time is recorded off the request path, at most once a minute.
func TestTokenExpiryAndLastUse(t *testing.T) {
	e := newEnv(t)
	created := e.clock.Now()
	r := e.do(call{method: "POST", path: "/admin/v1/tokens", role: control.RoleAdmin, body: `{"name":"ci","role":"read","ttl":"2h"}`}).want(t, 201)
	secret := r.str("token")
	if want := created.Add(2 * time.Hour).UTC().Format(time.RFC3339Nano); r.str("expires_at") != want {
		t.Errorf("expires_at %q, want %q", r.str("expires_at"), want)
	}
	for _, body := range []string{`{"name":"x","role":"read","ttl":"soon"}`, `{"name":"x","role":"read","ttl":"0s"}`, `{"name":"x","role":"read","ttl":5}`} {
		if b := e.do(call{method: "POST", path: "/admin/v1/tokens", role: control.RoleAdmin, body: body}); b.status != 400 || b.str("field") != "ttl" {
			t.Errorf("%s: %d %s, want 400 naming ttl", body, b.status, b.raw)
		}
	}

	// lastUsed waits (wide bound) until the store records want as the token's last use.
	lastUsed := func(want time.Time) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			tok, err := e.store.GetToken(e.ctx, "ci")
			if err == nil && tok.LastUsedAt != nil && tok.LastUsedAt.Equal(want.UTC().Truncate(time.Microsecond)) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("last_used_at %v (%v), want %v", tok.LastUsedAt, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	first := e.clock.Now()
	for range 20 {
		e.do(call{method: "GET", path: "/admin/v1/rules", token: secret}).want(t, 200)
	}
	lastUsed(first)
	// Within the minute, more calls write nothing: after a flush interval it is still first.
	e.clock.Add(30 * time.Second)
	e.do(call{method: "GET", path: "/admin/v1/rules", token: secret}).want(t, 200)
	time.Sleep(6 * time.Second)
	lastUsed(first)
	// A minute later, the next call is recorded.
	e.clock.Add(31 * time.Second)
	e.do(call{method: "GET", path: "/admin/v1/rules", token: secret}).want(t, 200)
	lastUsed(e.clock.Now())
	list := e.do(call{method: "GET", path: "/admin/v1/tokens", role: control.RoleAdmin}).want(t, 200)
	var ci map[string]any
	for _, it := range list.json["tokens"].([]any) {
		if m := it.(map[string]any); m["name"] == "ci" {
			ci = m
		}
	}
	if ci["expires_at"] == nil || ci["last_used_at"] != e.clock.Now().UTC().Format(time.RFC3339Nano) {
		t.Errorf("listed token: %v", ci)
	}

	// Past its expiry it is refused as an unknown token would be.
	e.clock.Add(2 * time.Hour)
	if r := e.do(call{method: "GET", path: "/admin/v1/rules", token: secret}); r.status != 401 {
		t.Errorf("expired token: %d %s, want 401", r.status, r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/rules", role: control.RoleRead}).want(t, 200)
}
