package adminapi_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
)

// A bootstrap token deleted through the API stays revoked across restarts that give the same
// secret (the log says so); a new secret brings a bootstrap token back.
func TestBootstrapRevokedStaysRevoked(t *testing.T) {
	dir := t.TempDir()
	const secret = "sluice_revoked-bootstrap-secret-0123456789"
	s := openStore(t, dir)
	if _, err := adminapi.Bootstrap(t.Context(), s, adminapi.BootstrapOptions{Secret: secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateToken(t.Context(), control.Change{Actor: "bootstrap"}, control.Token{Name: "ops", Role: control.RoleAdmin, Hash: control.HashToken("sluice_ops-secret-0123456789")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteToken(t.Context(), control.Change{Actor: "ops", Reason: "leaked"}, adminapi.BootstrapTokenName); err != nil {
		t.Fatal(err)
	}
	s.Close()

	for restart := range 2 {
		s := openStore(t, dir)
		var logs bytes.Buffer
		if _, err := adminapi.Bootstrap(t.Context(), s, adminapi.BootstrapOptions{Secret: secret, Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatal(err)
		}
		if authorizes(t, s, secret) {
			t.Fatalf("restart %d: the revoked bootstrap secret authorizes again", restart)
		}
		if !strings.Contains(logs.String(), "revoked") || !strings.Contains(logs.String(), "new secret") || strings.Contains(logs.String(), secret) {
			t.Errorf("restart %d: log %q, want it to say the token stays revoked until a new secret", restart, logs.String())
		}
		s.Close()
	}
	s = openStore(t, dir)
	const fresh = "sluice_fresh-bootstrap-secret-0123456789"
	if _, err := adminapi.Bootstrap(t.Context(), s, adminapi.BootstrapOptions{Secret: fresh}); err != nil {
		t.Fatal(err)
	}
	if !authorizes(t, s, fresh) || authorizes(t, s, secret) {
		t.Error("a new bootstrap secret: want it to authorize, and the revoked one not")
	}
}
