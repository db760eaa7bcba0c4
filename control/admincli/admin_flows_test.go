package admincli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// A token created through the CLI is printed once, alone on stdout, works, and is never
// listed; deleting it stops it.
func TestAdminTokenShownOnce(t *testing.T) {
	e := newAdminEnv(t)
	r := e.admin(control.RoleAdmin, "", "tokens", "create", "ci", "--role", "read")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	secret := strings.TrimSpace(r.stdout)
	if secret == "" || strings.ContainsAny(secret, " \n") {
		t.Fatalf("stdout %q, want the secret alone", r.stdout)
	}
	if !strings.Contains(r.stderr, `created token "ci" (role read, policy version `) || !strings.Contains(r.stderr, "shown this once") {
		t.Errorf("stderr %q lacks the notice", r.stderr)
	}
	if strings.Contains(r.stderr, secret) {
		t.Errorf("the secret is on stderr too")
	}
	tokFile := filepath.Join(t.TempDir(), "ci.token")
	if err := os.WriteFile(tokFile, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	ci := func(args ...string) result {
		return runCLI(t, e.clock.Now, "", append([]string{"admin", "--server", e.url, "--token-file", tokFile}, args...)...)
	}
	if r := ci("rules", "list"); r.code != 0 {
		t.Fatalf("the new token does not work: exit %d: %s", r.code, r.stderr)
	}
	if r := ci("overrides", "create", "--tenant", "a", "--type", "ban", "--ttl", "1h", "--reason", "x"); r.code != exitAuth {
		t.Errorf("a read token wrote: exit %d", r.code)
	}
	for _, format := range []string{"table", "json"} {
		r := e.admin(control.RoleAdmin, "", "tokens", "list", "-o", format)
		if r.code != 0 || !strings.Contains(r.stdout, "ci") {
			t.Fatalf("tokens list -o %s: exit %d, %s %s", format, r.code, r.stdout, r.stderr)
		}
		if strings.Contains(r.stdout, secret) {
			t.Errorf("tokens list -o %s shows the secret", format)
		}
	}
	if r := e.admin(control.RoleAdmin, "", "tokens", "delete", "ci"); r.code != 0 {
		t.Fatalf("delete: exit %d: %s", r.code, r.stderr)
	}
	if r := ci("rules", "list"); r.code != exitAuth || strings.Contains(r.stderr, secret) {
		t.Errorf("a deleted token: exit %d, stderr %q", r.code, r.stderr)
	}
}

// An override created through the CLI is listed, enforced as the store holds it, and gone
// from the list once deleted.
func TestAdminOverrideLifecycle(t *testing.T) {
	e := newAdminEnv(t)
	r := e.admin(control.RoleWrite, "", "overrides", "create", "--tenant", "noisy", "--type", "multiplier", "--value", "0.1", "--ttl", "5m", "--reason", "hammering", "-o", "json")
	if r.code != 0 {
		t.Fatalf("create: exit %d: %s", r.code, r.stderr)
	}
	var created struct {
		ID            int64  `json:"id"`
		PolicyVersion string `json:"policy_version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &created); err != nil || created.ID == 0 || created.PolicyVersion == "" {
		t.Fatalf("create printed %q (%v)", r.stdout, err)
	}
	id := fmt.Sprint(created.ID)
	stored, err := e.store.ListOverrides(t.Context(), control.OverrideFilter{Tenant: "noisy"})
	if err != nil || len(stored) != 1 || stored[0].Value != 0.1 || stored[0].CreatedBy != "writer" ||
		!stored[0].ExpiresAt.Equal(e.clock.Now().Add(5*time.Minute)) {
		t.Fatalf("the store holds %+v (%v)", stored, err)
	}
	r = e.admin(control.RoleRead, "", "overrides", "list", "--tenant", "noisy")
	_, rows := parseTable(t, r.stdout)
	if !hasRow(rows, map[string]string{"ID": id, "TYPE": "multiplier", "VALUE": "0.1", "EXPIRES_AT": "2026-11-23T12:05:00Z", "REASON": "hammering"}) {
		t.Fatalf("not listed:\n%s", r.stdout)
	}
	r = e.admin(control.RoleWrite, "", "overrides", "delete", id, "--reason", "calmed down")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted override "+id+" (policy version ") {
		t.Fatalf("delete: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	r = e.admin(control.RoleRead, "", "overrides", "list", "--tenant", "noisy")
	if _, rows := parseTable(t, r.stdout); len(rows) != 0 {
		t.Fatalf("still listed:\n%s", r.stdout)
	}
	evs, err := e.store.Audit(t.Context(), control.AuditFilter{Kind: control.KindOverride, Action: control.ActionDelete})
	if err != nil || len(evs) != 1 || evs[0].Reason != "calmed down" || evs[0].Actor != "writer" {
		t.Fatalf("audit of the deletion: %+v (%v)", evs, err)
	}
	if r := e.admin(control.RoleWrite, "", "overrides", "delete", id); r.code != exitNotFound {
		t.Errorf("deleting again: exit %d, want %d", r.code, exitNotFound)
	}
}

// The server and the token come from the environment when no flag gives them, in the
// documented order; flags win.
func TestAdminEnvironment(t *testing.T) {
	e := newAdminEnv(t)
	read, admin := adminSecrets[control.RoleRead], adminSecrets[control.RoleAdmin]
	cases := []struct {
		name                   string
		server, token, adminTk string   // SLUICE_SERVER, SLUICE_TOKEN, SLUICE_ADMIN_TOKEN
		args                   []string // after "admin"
		code                   int
	}{
		{"server and token from the environment", e.url, read, "", []string{"rules", "list"}, 0},
		{"SLUICE_ADMIN_TOKEN as the last resort", e.url, "", admin, []string{"tokens", "list"}, 0},
		{"SLUICE_TOKEN before SLUICE_ADMIN_TOKEN", e.url, read, admin, []string{"tokens", "list"}, exitAuth},
		{"--token-file before the environment", e.url, "bogus-token", "", []string{"--token-file", e.tokens[control.RoleRead], "rules", "list"}, 0},
		{"--token before the environment", e.url, "bogus-token", "", []string{"--token", read, "rules", "list"}, 0},
		{"--server before SLUICE_SERVER", "http://127.0.0.1:1", read, "", []string{"--server", e.url, "rules", "list"}, 0},
		{"a bare host:port", strings.TrimPrefix(e.url, "http://"), read, "", []string{"nodes"}, 0},
		{"SLUICE_SERVER that is not a URL", "ftp://example.com", read, "", []string{"nodes"}, exitGeneral},
		{"both --token and --token-file", e.url, "", "", []string{"--token", read, "--token-file", e.tokens[control.RoleRead], "nodes"}, exitGeneral},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envServer, tc.server)
			t.Setenv(envToken, tc.token)
			t.Setenv(envAdminToken, tc.adminTk)
			r := runCLI(t, e.clock.Now, "", append([]string{"admin"}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d: %s", r.code, tc.code, r.stderr)
			}
			for _, s := range []string{read, admin, "bogus-token"} {
				if strings.Contains(r.stderr, s) {
					t.Errorf("stderr shows a token: %s", r.stderr)
				}
			}
		})
	}
}

// Cells keep tables intact whatever the values hold, and times print in UTC to the second.
func TestAdminCells(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		kind cellKind
		want string
	}{
		{"absent", ``, cellPlain, "-"},
		{"null", `null`, cellPlain, "-"},
		{"empty string", `""`, cellPlain, "-"},
		{"string", `"abuse ticket 42"`, cellPlain, "abuse ticket 42"},
		{"newline and tab", `"a\nb\tc"`, cellPlain, `a\nb\tc`},
		{"terminal escape", `"\u001b[2Jx"`, cellPlain, `\x1b[2Jx`},
		{"number", `0.75`, cellPlain, "0.75"},
		{"array", `["tenant","user"]`, cellPlain, "tenant,user"},
		{"object by key", `{"method":"POST","endpoint":"/a"}`, cellPlain, "endpoint=/a,method=POST"},
		{"nested object", `{"free":{"limit":2}}`, cellPlain, `free={"limit":2}`},
		{"time in another zone", `"2026-11-23T13:00:00.123456+01:00"`, cellTime, "2026-11-23T12:00:00Z"},
		{"not a time", `"soon"`, cellTime, "soon"},
		{"milliseconds", `1500`, cellMillis, "1.5s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := cell(json.RawMessage(tc.raw), tc.kind); got != tc.want {
				t.Errorf("cell(%s) = %q, want %q", tc.raw, got, tc.want)
			}
		})
	}
}

// YAML rule files become JSON with their members in order and their types kept; what YAML
// allows and JSON does not is refused with its place.
func TestAdminYAMLToJSON(t *testing.T) {
	cases := []struct {
		name, yaml, want, err string
	}{
		{"order and types", "name: r\nlimit: 10\nperiod: 1m\nshadow: true\nburst: ~\nkey: [tenant, user]\n",
			`{"name":"r","limit":10,"period":"1m","shadow":true,"burst":null,"key":["tenant","user"]}`, ""},
		{"JSON is YAML", `{"name": "r", "match": {"endpoint": "/a/*"}, "limit": 1.5}`, `{"name":"r","match":{"endpoint":"/a/*"},"limit":1.5}`, ""},
		{"quoted numbers stay strings", "name: \"10\"\n", `{"name":"10"}`, ""},
		{"hex integers", "limit: 0x10\n", `{"limit":16}`, ""},
		{"aliases", "a: &x {limit: 1}\nb: *x\n", `{"a":{"limit":1},"b":{"limit":1}}`, ""},
		{"names given twice reach the server", "limit: 1\nlimit: 2\n", `{"limit":1,"limit":2}`, ""},
		{"infinity", "limit: .inf\n", "", "limit: line 1: .inf is not a finite number"},
		{"a key that is a list", "[a]: 1\n", "", "line 1: a key must be a string"},
		{"a list", "- a\n", "", "line 1: want one object"},
		{"empty", "", "", "empty"},
		{"alias bomb", "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n", "", "too many values"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := readObjectFile("-", strings.NewReader(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(o)
			if string(b) != tc.want {
				t.Errorf("got %s, want %s", b, tc.want)
			}
		})
	}
}

// What stands between the CLI and the admin API can fail in ways the API never does: a proxy
// answering HTML, a server that never answers. The CLI says so and exits 1, within --timeout.
func TestAdminBrokenServers(t *testing.T) {
	t.Setenv(envToken, "")
	t.Setenv(envAdminToken, "")
	cases := []struct {
		name    string
		handler http.HandlerFunc
		stderr  string
	}{
		{"a proxy answering HTML", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "<html>bad gateway</html>")
		}, "sluice: the server answered 502 Bad Gateway: <html>bad gateway</html> (HTTP 502)"},
		{"a server that hangs", func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // the client's timeout closes the connection
		}, "sluice: ask http://"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.handler)
			defer ts.Close()
			const secret = "sluice_broken-0123456789abcdef"
			r := runCLI(t, time.Now, "", "admin", "--server", ts.URL, "--token", secret, "--timeout", "200ms", "nodes")
			if r.code != exitGeneral {
				t.Errorf("exit %d, want %d", r.code, exitGeneral)
			}
			if !strings.HasPrefix(r.stderr, tc.stderr) || strings.Contains(r.stderr, secret) {
				t.Errorf("stderr %q, want it to start with %q and hold no token", r.stderr, tc.stderr)
			}
		})
	}
}

// With no flag or variable naming a token, sluice admin reads the bootstrap token that serve
// wrote in ./data/admin.token (or $SLUICE_DATA_DIR/admin.token), and says so on stderr; a
// variable still wins over the file, and a missing file is a "no token" naming it.
func TestAdminBootstrapTokenFile(t *testing.T) {
	e := newAdminEnv(t)
	admin := adminSecrets[control.RoleAdmin]
	t.Setenv(envServer, e.url)
	t.Setenv(envToken, "")
	t.Setenv(envAdminToken, "")
	t.Setenv(envDataDir, "")
	t.Chdir(t.TempDir())
	if err := os.Mkdir("data", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("data", "admin.token"), []byte(admin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "admin.token"), []byte(adminSecrets[control.RoleRead]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dataDir, adminTk string
		code                   int
		stderr                 string // a prefix
	}{
		{"./data/admin.token", "", "", 0, "sluice admin: using the bootstrap token in data/admin.token"},
		{"$SLUICE_DATA_DIR/admin.token (a read token: tokens need admin)", other, "", exitAuth, "sluice admin: using the bootstrap token in " + filepath.Join(other, "admin.token")},
		{"SLUICE_ADMIN_TOKEN before the file", other, admin, 0, ""},
		{"no file", filepath.Join(other, "none"), "", exitAuth, "sluice: no token: give --token-file FILE, --token, or set SLUICE_TOKEN (" + filepath.Join(other, "none", "admin.token") + ": no such file or directory)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envDataDir, tc.dataDir)
			t.Setenv(envAdminToken, tc.adminTk)
			r := runCLI(t, e.clock.Now, "", "admin", "tokens", "list")
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d: %s", r.code, tc.code, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, tc.stderr) || tc.stderr == "" && r.stderr != "" {
				t.Errorf("stderr %q, want it to start with %q", r.stderr, tc.stderr)
			}
			for _, s := range adminSecrets {
				if strings.Contains(r.stdout+r.stderr, s) {
					t.Errorf("a token is printed: %s%s", r.stdout, r.stderr)
				}
			}
		})
	}
}

// --wait sends every change with Sluice-Wait: fleet: with a node that never reports the
// change the command fails naming it (the change is stored); once every node reports it, it
// succeeds.
func TestAdminWaitForFleet(t *testing.T) {
	e := newAdminEnv(t)
	ctx := t.Context()
	if err := e.store.Heartbeat(ctx, control.Node{ID: "node-slow", Addr: "10.0.0.9:8080", PolicyVersion: e.version()}); err != nil {
		t.Fatal(err)
	}
	v := e.version()
	r := e.admin(control.RoleWrite, "", "--wait", "overrides", "create", "--tenant", "acme", "--type", "ban", "--ttl", "1h", "--reason", "x")
	if r.code != exitGeneral || !strings.Contains(r.stderr, "node-slow") || !strings.Contains(r.stderr, "HTTP 504") {
		t.Errorf("lagging node: exit %d, stderr %q", r.code, r.stderr)
	}
	if e.version() != v+1 {
		t.Errorf("version %d, want %d: the change is stored even when the wait runs out", e.version(), v+1)
	}
	if err := e.store.Heartbeat(ctx, control.Node{ID: "node-slow", Addr: "10.0.0.9:8080", PolicyVersion: v + 2}); err != nil {
		t.Fatal(err)
	}
	r = e.admin(control.RoleWrite, "", "--wait", "-v", "overrides", "create", "--tenant", "beta", "--type", "ban", "--ttl", "1h", "--reason", "x")
	if r.code != 0 || !strings.Contains(r.stderr, "Sluice-Wait: fleet") {
		t.Errorf("every node current: exit %d, stderr %q", r.code, r.stderr)
	}
}
