package controltest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testTokenExpiryAndUse: a token keeps its expiry; TokenUsed moves the last-used time only
// forward and is no change (no version, no audit event).
func testTokenExpiryAndUse(t *testing.T, e *env) {
	exp := e.clock.Now().Add(time.Hour)
	tok, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ci", Role: control.RoleRead, Hash: control.HashToken("s1"), ExpiresAt: &exp})
	if err != nil {
		t.Fatal(err)
	}
	if tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(exp.UTC().Truncate(time.Microsecond)) || tok.LastUsedAt != nil {
		t.Errorf("created token = %+v", tok)
	}
	forever, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ops", Role: control.RoleAdmin, Hash: control.HashToken("s2")})
	if err != nil || forever.ExpiresAt != nil {
		t.Fatalf("token without expiry = %+v, %v", forever, err)
	}
	if tok.Expired(e.clock.Now()) || !tok.Expired(exp) || forever.Expired(exp.Add(1000*time.Hour)) {
		t.Error("Expired disagrees with ExpiresAt")
	}
	v, n := e.version(), len(e.audit())
	used := e.clock.Now().Add(time.Minute)
	if err := e.s.TokenUsed(e.ctx, "ci", used); err != nil {
		t.Fatalf("TokenUsed: %v", err)
	}
	if err := e.s.TokenUsed(e.ctx, "ci", used.Add(-30*time.Second)); err != nil { // older: ignored
		t.Fatalf("TokenUsed: %v", err)
	}
	if err := e.s.TokenUsed(e.ctx, "nobody", used); err != nil {
		t.Errorf("TokenUsed of a deleted token: %v, want nothing done", err)
	}
	got, err := e.s.TokenByHash(e.ctx, control.HashToken("s1"))
	if err != nil || got.LastUsedAt == nil || !got.LastUsedAt.Equal(used.UTC().Truncate(time.Microsecond)) || got.ExpiresAt == nil {
		t.Errorf("token after use = %+v, %v; want last used %v", got, err, used)
	}
	if e.version() != v || len(e.audit()) != n {
		t.Error("TokenUsed changed the version or wrote an audit event")
	}
	// A deleted token's secret is remembered as revoked; a live one's is not.
	if r, err := e.s.TokenRevoked(e.ctx, control.HashToken("s1")); err != nil || r {
		t.Errorf("TokenRevoked of a live token = %v, %v", r, err)
	}
	if _, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "gone", Role: control.RoleRead, Hash: control.HashToken("s3")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.DeleteToken(e.ctx, ch(""), "gone"); err != nil {
		t.Fatal(err)
	}
	if r, err := e.s.TokenRevoked(e.ctx, control.HashToken("s3")); err != nil || !r {
		t.Errorf("TokenRevoked of a deleted token = %v, %v; want true", r, err)
	}
	list, err := e.s.ListTokens(e.ctx)
	if err != nil || len(list) != 2 || list[0].LastUsedAt == nil || list[1].LastUsedAt != nil {
		t.Errorf("ListTokens = %+v, %v", list, err)
	}
}
