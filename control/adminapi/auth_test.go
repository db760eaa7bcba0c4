package adminapi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"
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

func TestTokens(t *testing.T) {
	e := newEnv(t)
	r := e.do(call{method: "POST", path: "/admin/v1/tokens", role: control.RoleAdmin, body: `{"name":"ci","role":"write"}`}).want(t, 201)
	secret := r.str("token")
	if !strings.HasPrefix(secret, "sluice_") || len(secret) < 40 || r.str("role") != "write" || r.str("name") != "ci" {
		t.Fatalf("answer %s", r.raw)
	}
	h := control.HashToken(secret)
	// The secret works, as the role it was given.
	e.do(call{method: "POST", path: "/admin/v1/rules", token: secret, body: `{"name":"by-ci","limit":1,"period":"1s"}`}).want(t, 201)
	e.do(call{method: "GET", path: "/admin/v1/tokens", token: secret}).want(t, 403)
	// It is never shown again: not in the list, not in the audit log, not as its hash.
	list := e.do(call{method: "GET", path: "/admin/v1/tokens", role: control.RoleAdmin}).want(t, 200)
	audit := e.do(call{method: "GET", path: "/admin/v1/audit?kind=token", role: control.RoleRead}).want(t, 200)
	for name, raw := range map[string][]byte{"list": list.raw, "audit": audit.raw} {
		for _, leak := range []string{secret, fmt.Sprintf("%x", h[:]), fmt.Sprintf("%X", h[:8]), "hash"} {
			if strings.Contains(string(raw), leak) {
				t.Errorf("%s shows %q: %s", name, leak, raw)
			}
		}
	}
	var names []string
	for _, it := range list.json["tokens"].([]any) {
		m := it.(map[string]any)
		names = append(names, m["name"].(string)+":"+m["role"].(string))
		if _, ok := m["token"]; ok {
			t.Errorf("list shows a secret: %v", m)
		}
	}
	slices.Sort(names)
	if want := []string{"ci:write", "reader:read", "root:admin", "writer:write"}; !slices.Equal(names, want) {
		t.Errorf("tokens %v, want %v", names, want)
	}
	if !strings.Contains(string(audit.raw), `"target":"ci"`) {
		t.Errorf("token creation not audited: %s", audit.raw)
	}
	// Deleted, it stops working at once.
	e.do(call{method: "DELETE", path: "/admin/v1/tokens/ci", role: control.RoleAdmin}).want(t, 204)
	e.do(call{method: "GET", path: "/admin/v1/rules", token: secret}).want(t, 401)
	if strings.Contains(e.logs.String(), secret) {
		t.Error("the secret reached the log")
	}
}

func TestFailedAuthenticationsAreLimited(t *testing.T) {
	e := newEnv(t)
	guesser, operator := "198.51.100.7:5555", "198.51.100.8:5555"
	for i := range adminapi.DefaultAuthFailures.Max {
		r := e.do(call{method: "GET", path: "/admin/v1/rules", token: fmt.Sprintf("guess-%d", i), remote: guesser})
		if r.status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, r.status)
		}
	}
	// The next wrong token is refused at once; a valid one is not refused for the guesser's
	// failures (an operator behind the same NAT or proxy keeps working), and a missing one is
	// no guess.
	r := e.do(call{method: "GET", path: "/admin/v1/rules", token: "guess-again", remote: guesser})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("%d %v, want 429 with Retry-After", r.status, r.header)
	}
	e.do(call{method: "GET", path: "/admin/v1/rules", role: control.RoleRead, remote: guesser}).want(t, 200)
	e.do(call{method: "GET", path: "/admin/v1/rules", remote: guesser}).want(t, 401)
	e.do(call{method: "GET", path: "/admin/v1/rules", token: "guess-once-more", remote: guesser}).want(t, 429)
	// Another address is not affected, and an IPv6 client is counted by its /64.
	e.do(call{method: "GET", path: "/admin/v1/rules", role: control.RoleRead, remote: operator}).want(t, 200)
	for i := range adminapi.DefaultAuthFailures.Max {
		e.do(call{method: "GET", path: "/admin/v1/rules", token: "x", remote: fmt.Sprintf("[2001:db8::%x]:1", i+1)}).want(t, 401)
	}
	e.do(call{method: "GET", path: "/admin/v1/rules", token: "y", remote: "[2001:db8::ffff]:1"}).want(t, 429)
	// Missing tokens and weak roles are not guesses.
	for range 2 * adminapi.DefaultAuthFailures.Max {
		e.do(call{method: "GET", path: "/admin/v1/rules", remote: operator}).want(t, 401)
		e.do(call{method: "GET", path: "/admin/v1/tokens", role: control.RoleRead, remote: operator}).want(t, 403)
	}
	// The limit refills with time.
	e.clock.Add(time.Minute)
	e.do(call{method: "GET", path: "/admin/v1/rules", token: "guess-after", remote: guesser}).want(t, 401)
}

// TestAuthFailuresCountedAndLogBounded: every failure is counted by reason, the log holds a
// bounded number of lines whatever a guesser sends, and never the token.
func TestAuthFailuresCountedAndLogBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(o *adminapi.Options) { o.Registerer = reg })
	const guesses = 50
	for i := range guesses {
		e.do(call{method: "GET", path: "/admin/v1/rules", token: fmt.Sprintf("secret-guess-%d", i), remote: "198.51.100.9:1"})
	}
	counts := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_admin_auth_failures_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["invalid"] != float64(adminapi.DefaultAuthFailures.Max) || counts["limited"] != guesses-float64(adminapi.DefaultAuthFailures.Max) {
		t.Errorf("sluice_admin_auth_failures_total %v, want invalid %d and limited %d", counts, adminapi.DefaultAuthFailures.Max, guesses-adminapi.DefaultAuthFailures.Max)
	}
	logged := strings.Count(e.logs.String(), "admin authentication failed")
	if logged < 1 || logged > 2 {
		t.Errorf("%d log lines for %d failures within a second of the clock, want 1 (the rest counted in unlogged_before)", logged, guesses)
	}
	if strings.Contains(e.logs.String(), "secret-guess") {
		t.Error("a token reached the log")
	}
}

func TestHostileStringsVerbatim(t *testing.T) {
	e := newEnv(t)
	hostile := []string{
		"'; DROP TABLE rules; --",
		`Robert"); DELETE FROM tokens; --`,
		"租户-😀-\u202eevil\u202c",
		"../../etc/passwd",
		"a/b?c#d%2F",
		"<script>alert(1)</script>",
	}
	for i, s := range hostile {
		t.Run(s, func(t *testing.T) {
			name := fmt.Sprintf("%s-%d", s, i)
			body := fmt.Sprintf(`{"name":%q,"limit":1,"period":"1s","match":{"tenant":%q}}`, name, s)
			r := e.do(call{method: "POST", path: "/admin/v1/rules", role: control.RoleWrite, body: body}).want(t, 201)
			if r.str("name") != name {
				t.Errorf("name %q, want %q", r.str("name"), name)
			}
			g := e.do(call{method: "GET", path: "/admin/v1/rules/" + url.PathEscape(name), role: control.RoleRead}).want(t, 200)
			if g.str("name") != name || g.json["match"].(map[string]any)["tenant"] != s {
				t.Errorf("read back %s", g.raw)
			}
			id := e.do(call{method: "PUT", path: "/admin/v1/identities/api_key/" + url.PathEscape(s), role: control.RoleWrite, body: fmt.Sprintf(`{"tier":%q}`, s)}).want(t, 200)
			if id.str("value") != s || id.str("tier") != s {
				t.Errorf("identity %s", id.raw)
			}
			g = e.do(call{method: "GET", path: "/admin/v1/identities/api_key/" + url.PathEscape(s), role: control.RoleRead}).want(t, 200)
			if g.str("value") != s {
				t.Errorf("identity read back %s", g.raw)
			}
			o := e.do(call{method: "POST", path: "/admin/v1/overrides", role: control.RoleWrite, body: fmt.Sprintf(`{"user":%q,"type":"ban","ttl":"1m","reason":%q}`, s, s)}).want(t, 201)
			if o.str("user") != s || o.str("reason") != s {
				t.Errorf("override %s", o.raw)
			}
		})
	}
	// The tables are all there.
	r := e.do(call{method: "GET", path: "/admin/v1/rules", role: control.RoleRead}).want(t, 200)
	if n := len(r.json["rules"].([]any)); n != len(hostile)+1 {
		t.Errorf("%d rules, want %d", n, len(hostile)+1)
	}
	e.do(call{method: "GET", path: "/admin/v1/tokens", role: control.RoleAdmin}).want(t, 200)
}

// TestTrustedProxies: behind a trusted proxy, failures count under the client the proxy
// names (the rightmost untrusted X-Forwarded-For hop), so a guesser neither locks out an
// operator behind the same proxy nor escapes its limit by forging the header's left part;
// without trusted proxies no forwarded header is read at all.
func TestTrustedProxies(t *testing.T) {
	const lb = "10.0.0.5:443"
	guess := func(e *env, xff string, i int64) int {
		return e.do(call{method: "GET", path: "/admin/v1/rules", token: fmt.Sprintf("guess-%d", i), remote: lb,
			header: map[string]string{"X-Forwarded-For": xff}}).status
	}
	t.Run("trusted", func(t *testing.T) {
		e := newEnv(t, func(o *adminapi.Options) { o.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} })
		for i := range adminapi.DefaultAuthFailures.Max {
			// The guesser forges a fresh left part each time; the proxy appends the real peer.
			if got := guess(e, fmt.Sprintf("192.0.2.%d, 198.51.100.7", i), i); got != 401 {
				t.Fatalf("guess %d: %d, want 401", i, got)
			}
		}
		if got := guess(e, "203.0.113.99, 198.51.100.7", 99); got != 429 {
			t.Errorf("the guesser forging X-Forwarded-For: %d, want 429", got)
		}
		// Another client behind the same proxy is not limited by the guesser's failures.
		if got := guess(e, "198.51.100.8", 100); got != 401 {
			t.Errorf("another client behind the proxy: %d, want 401 (not limited)", got)
		}
		// Hops that are proxies themselves are skipped.
		if got := guess(e, "198.51.100.7, 10.1.2.3", 101); got != 429 {
			t.Errorf("the guesser behind two proxies: %d, want 429", got)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		e := newEnv(t)
		for i := range adminapi.DefaultAuthFailures.Max {
			guess(e, fmt.Sprintf("198.51.100.%d", i), i)
		}
		// The header is not read: every guess counted under the proxy's address.
		if got := guess(e, "198.51.100.200", 200); got != 429 {
			t.Errorf("a fresh forwarded address without trusted proxies: %d, want 429", got)
		}
		e.do(call{method: "GET", path: "/admin/v1/rules", role: control.RoleRead, remote: lb}).want(t, 200)
	})
}
