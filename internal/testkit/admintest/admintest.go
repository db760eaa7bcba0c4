// Package admintest stands up a real admin API for tests: control/adminapi over a SQLite
// control store in a temporary folder and a limiter on the memory store, all on one settable
// clock, with a token of each role. The admin API's own tests and the CLI's use it.
package admintest

import (
	"io"
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
)

// EnginePolicy is what the limiter behind usage and reset enforces.
const EnginePolicy = `
rules:
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 3, period: 1m}
`

// FilePolicy is the policy files' part, which the API shows read-only ("source": "file").
const FilePolicy = `
rules:
  - {name: file-rule, match: {endpoint: "/api/*"}, key: [tenant], algorithm: gcra, limit: 100, period: 1m}
overrides:
  - {tenant: file-tenant, type: ban, expires_at: "2027-06-01T00:00:00Z", reason: "from the file"}
exemptions:
  - {ip: "10.0.0.0/8"}
`

// FileDomain is an Envoy-format domain of the policy files, read-only through the API.
const FileDomain = `domain: file-edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
`

// Secrets are the secrets of the tokens every Env starts with, one per role.
var Secrets = map[control.Role]string{
	control.RoleRead:  "sluice_read-secret-0123456789abcdef",
	control.RoleWrite: "sluice_write-secret-0123456789abcdef",
	control.RoleAdmin: "sluice_admin-secret-0123456789abcdef",
}

// TokenNames are those tokens' names, the actors of their changes.
var TokenNames = map[control.Role]string{control.RoleRead: "reader", control.RoleWrite: "writer", control.RoleAdmin: "root"}

// Env is one admin API and what it stands on.
type Env struct {
	Store   control.Store
	Server  *adminapi.Server
	Clock   *testutil.Clock
	Limiter *sluice.Limiter
}

// New opens the control store, creates the tokens of Secrets in it, and makes the server;
// all are closed when the test ends. Logs are discarded unless an option sets a Logger; opts
// adjust the server's options before it is made.
func New(t testing.TB, opts ...func(*adminapi.Options)) *Env {
	t.Helper()
	ctx := t.Context()
	clock := testutil.NewClock()
	store, err := sqlite.Open(ctx, sqlite.Path(t.TempDir()), control.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg, err := policy.ParseConfig("files.yaml", []byte(FilePolicy))
	if err != nil {
		t.Fatal(err)
	}
	files := adminapi.FilesFromConfigs(cfg)
	files.Domains = map[string][]byte{"file-edge": []byte(FileDomain)}
	lim := testutil.Limiter(t, EnginePolicy, clock)
	o := adminapi.Options{
		Control: store,
		Limiter: lim,
		Files:   func() adminapi.FilePolicy { return files },
		Now:     clock.Now,
		Fleet:   fleetstats.View{},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range opts {
		f(&o)
	}
	srv, err := adminapi.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for _, role := range []control.Role{control.RoleRead, control.RoleWrite, control.RoleAdmin} {
		if _, err := store.CreateToken(ctx, control.Change{Actor: "test-setup"},
			control.Token{Name: TokenNames[role], Role: role, Hash: control.HashToken(Secrets[role])}); err != nil {
			t.Fatal(err)
		}
	}
	return &Env{Store: store, Server: srv, Clock: clock, Limiter: lim}
}
