package adminapi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/transport/grpcapi"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// POST /v1/reset and gRPC Reset need a write token when wired to the admin API's authorizer.
func TestResetNeedsWriteToken(t *testing.T) {
	e := newEnv(t)
	api := httpapi.New(e.lim, nil, httpapi.Options{
		ResetAuth: func(h http.Handler) http.Handler { return e.srv.RequireRole(control.RoleWrite, h) },
	})
	for _, tc := range []struct {
		name   string
		auth   string
		ct     string
		status int
	}{
		{"no token", "", "application/json", 401},
		{"unknown token", "Bearer sluice_nope", "application/json", 401},
		{"not bearer", "Basic " + secrets[control.RoleWrite], "application/json", 401},
		{"read token", "Bearer " + secrets[control.RoleRead], "application/json", 403},
		{"no token, not JSON", "", "text/plain", 401},
		{"write token", "Bearer " + secrets[control.RoleWrite], "application/json", 200},
		{"admin token, lower-case scheme", "bearer " + secrets[control.RoleAdmin], "application/json", 200},
	} {
		t.Run("http "+tc.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "/v1/reset", strings.NewReader(`{"user":"alice"}`))
			req.Header.Set("Content-Type", tc.ct)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.status)
			}
			if tc.status >= 400 && !strings.Contains(rec.Body.String(), `"error"`) {
				t.Errorf("body %s", rec.Body)
			}
		})
	}
	// Checks are not affected.
	req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"user":"alice"}`))
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("check without a token: %d", rec.Code)
	}

	conn := grpctest.Serve(t, grpcapi.New(e.lim, nil, grpcapi.WithResetAuth(e.srv.GRPCAuth(control.RoleWrite))).Register)
	client := sluicev1.NewRateLimiterClient(conn)
	for _, tc := range []struct {
		name string
		md   []string
		code codes.Code
	}{
		{"no metadata", nil, codes.Unauthenticated},
		{"unknown token", []string{"authorization", "Bearer sluice_nope"}, codes.Unauthenticated},
		{"read token", []string{"authorization", "Bearer " + secrets[control.RoleRead]}, codes.PermissionDenied},
		{"write token", []string{"authorization", "Bearer " + secrets[control.RoleWrite]}, codes.OK},
	} {
		t.Run("grpc "+tc.name, func(t *testing.T) {
			ctx := e.ctx
			if tc.md != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
			}
			res, err := client.Reset(ctx, &sluicev1.ResetRequest{User: "alice"})
			if status.Code(err) != tc.code {
				t.Fatalf("%v, want %s", err, tc.code)
			}
			if tc.code == codes.OK && res.GetKeysReset() != 1 {
				t.Errorf("keys reset %d", res.GetKeysReset())
			}
		})
	}
	if _, err := client.Check(e.ctx, &sluicev1.CheckRequest{User: "alice"}); err != nil {
		t.Errorf("check without a token: %v", err)
	}
}

func openStore(t *testing.T, dir string) control.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), sqlite.Path(dir), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// authorizes reports whether secret is an admin token of store.
func authorizes(t *testing.T, store control.Store, secret string) bool {
	t.Helper()
	srv, err := adminapi.New(adminapi.Options{Control: store})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tok, err := srv.Authorize(t.Context(), "127.0.0.1", "Bearer "+secret, control.RoleAdmin)
	if err != nil && !errors.Is(err, adminapi.ErrUnauthenticated) {
		t.Fatal(err)
	}
	return err == nil && tok.Name == adminapi.BootstrapTokenName
}

func TestBootstrap(t *testing.T) {
	t.Run("from the environment", func(t *testing.T) {
		dir := t.TempDir()
		store := openStore(t, dir)
		var logs syncBuffer
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		const first, second = "env-secret-0123456789abcdef", "rotated-secret-0123456789abcdef"
		for i, secret := range []string{first, first + "\n", second} {
			path, err := adminapi.Bootstrap(t.Context(), store, adminapi.BootstrapOptions{Secret: secret, DataDir: dir, Log: log})
			if err != nil || path != "" {
				t.Fatalf("run %d: %q %v", i, path, err)
			}
		}
		if authorizes(t, store, first) || !authorizes(t, store, second) {
			t.Error("the rotated secret does not replace the old one")
		}
		if _, err := os.Stat(filepath.Join(dir, adminapi.TokenFileName)); !os.IsNotExist(err) {
			t.Errorf("a token file was written with a secret given: %v", err)
		}
		evs, _ := store.Audit(t.Context(), control.AuditFilter{Kind: control.KindToken})
		// create, then one update on rotation (never a moment without the token); the rerun
		// changes nothing
		if len(evs) != 2 || evs[0].Action != control.ActionUpdate || evs[1].Action != control.ActionCreate {
			t.Errorf("token audit events %+v, want an update after a create", evs)
		}
		h1, h2 := control.HashToken(first), control.HashToken(second)
		for _, ev := range evs {
			text := string(ev.Before) + string(ev.After) + ev.Reason
			for _, leak := range []string{first, second, fmt.Sprintf("%x", h1[:]), fmt.Sprintf("%x", h2[:])} {
				if strings.Contains(text, leak) {
					t.Errorf("audit event shows a secret or its hash: %s", text)
				}
			}
		}
		if strings.Contains(logs.String(), first) || strings.Contains(logs.String(), second) {
			t.Errorf("the log shows the secret: %s", logs.String())
		}
	})
	t.Run("generated at first start", func(t *testing.T) {
		dir := t.TempDir()
		store := openStore(t, dir)
		var logs syncBuffer
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		path, err := adminapi.Bootstrap(t.Context(), store, adminapi.BootstrapOptions{DataDir: dir, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(dir, adminapi.TokenFileName) {
			t.Fatalf("path %q", path)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", info.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		secret := strings.TrimSpace(string(data))
		if !authorizes(t, store, secret) {
			t.Error("the written token does not authorize")
		}
		if !strings.Contains(logs.String(), path) {
			t.Errorf("the log does not give the path: %s", logs.String())
		}
		if strings.Contains(logs.String(), secret) || strings.Contains(logs.String(), secret[len("sluice_"):len("sluice_")+8]) {
			t.Errorf("the log shows the secret: %s", logs.String())
		}
		// Not a first start any more: nothing changes, the file is not rewritten.
		again, err := adminapi.Bootstrap(t.Context(), store, adminapi.BootstrapOptions{DataDir: dir, Log: log})
		if err != nil || again != "" {
			t.Fatalf("second start: %q %v", again, err)
		}
		if data2, _ := os.ReadFile(path); string(data2) != string(data) {
			t.Error("the second start rewrote the token file")
		}
		// Reopened, the store still holds it.
		store.Close()
		if !authorizes(t, openStore(t, dir), secret) {
			t.Error("the token did not survive a restart")
		}
	})
	t.Run("no data dir", func(t *testing.T) {
		store := openStore(t, t.TempDir())
		if _, err := adminapi.Bootstrap(t.Context(), store, adminapi.BootstrapOptions{}); err == nil {
			t.Error("no error without a data dir or a secret")
		}
	})
}

// failingIdentities is the real store with GetIdentity failing the way a broken database
// fails, quoting the key in its message: the admin API must not log it.
type failingIdentities struct{ control.Store }

func (f failingIdentities) GetIdentity(_ context.Context, kind control.IdentityKind, value string) (control.Identity, error) {
	return control.Identity{}, fmt.Errorf("get identity %s/%q: connection reset by peer", kind, value)
}

func TestAPIKeysNeverLogged(t *testing.T) {
	e := newEnv(t, func(o *adminapi.Options) { o.Control = failingIdentities{o.Control} })
	const key = "sk_live_do-not-log-me"
	r := e.do(call{method: "GET", path: "/admin/v1/identities/api_key/" + key, role: control.RoleRead})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", r.status, r.raw)
	}
	if strings.Contains(string(r.raw), "connection reset") {
		t.Errorf("the store's error reached the client: %s", r.raw)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "connection reset") {
		t.Errorf("the failure was not logged: %s", logs)
	}
	if strings.Contains(logs, key) {
		t.Errorf("the log shows the API key: %s", logs)
	}
}
