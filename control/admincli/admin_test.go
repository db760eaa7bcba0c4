package admincli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/internal/sketch"
	"github.com/sluicehq/sluice/internal/testkit/admintest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
)

// adminSecrets are the secrets of the tokens every adminEnv starts with, one per role.
var adminSecrets = admintest.Secrets

// adminEnv is a real admin API (adminapi over a SQLite control store in a temporary folder
// and a limiter on the memory store) behind a real HTTP listener on loopback, all on one
// settable clock that the CLI's relative times use too.
type adminEnv struct {
	t      *testing.T
	url    string
	store  control.Store
	clock  *testutil.Clock
	tokens map[control.Role]string // token files, by role

	mu   sync.Mutex
	hits []string // "METHOD /path" of every call the server received
}

func newAdminEnv(t *testing.T) *adminEnv {
	t.Helper()
	a := admintest.New(t, func(o *adminapi.Options) {
		// The auth tests fail on purpose; the guard is adminapi's to test.
		o.AuthFailures = adminapi.AuthFailureLimit{Max: 100000, Period: time.Minute}
		o.WaitTimeout = 500 * time.Millisecond
	})
	e := &adminEnv{t: t, store: a.Store, clock: a.Clock, tokens: map[control.Role]string{}}
	mux := http.NewServeMux()
	mux.Handle(adminapi.Prefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.hits = append(e.hits, r.Method+" "+r.URL.EscapedPath())
		e.mu.Unlock()
		a.Server.ServeHTTP(w, r)
	}))
	ts := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(ts.Close)
	e.url = ts.URL
	dir := t.TempDir()
	for role, secret := range adminSecrets {
		path := filepath.Join(dir, string(role)+".token")
		if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		e.tokens[role] = path
	}
	return e
}

// result is what one run printed and its exit code.
type result struct {
	stdout, stderr string
	code           int
}

// runCLI runs `sluice ARGS...` in-process and reports what main would: the error on stderr as
// "sluice: ...", and the exit code main gives it.
func runCLI(t *testing.T, now func() time.Time, stdin string, args ...string) result {
	t.Helper()
	root := &cobra.Command{Use: "sluice", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newAdminCommand("dev", now))
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	code := 0
	if err != nil {
		fmt.Fprintln(&stderr, "sluice:", err)
		code = ExitCode(err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// admin runs `sluice admin --server URL --token-file FILE ARGS...` with role's token.
func (e *adminEnv) admin(role control.Role, stdin string, args ...string) result {
	e.t.Helper()
	return runCLI(e.t, e.clock.Now, stdin, append([]string{"admin", "--server", e.url, "--token-file", e.tokens[role]}, args...)...)
}

// version is the control store's version now.
func (e *adminEnv) version() int64 {
	e.t.Helper()
	v, err := e.store.Version(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// parseTable reads a tabwriter table: the header's words start the columns, and each row is
// cut at those offsets (cells may hold spaces).
func parseTable(t *testing.T, s string) (header []string, rows []map[string]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("no table in %q", s)
	}
	head := []rune(lines[0])
	var starts []int
	for i, r := range head {
		if r != ' ' && (i == 0 || head[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	header = strings.Fields(lines[0])
	for _, line := range lines[1:] {
		if strings.TrimSpace(line) == "" {
			break
		}
		l := []rune(line)
		row := map[string]string{}
		for i, start := range starts {
			end := len(l)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if start < len(l) {
				row[header[i]] = strings.TrimSpace(string(l[start:end]))
			}
		}
		rows = append(rows, row)
	}
	return header, rows
}

// parseKV reads FIELD VALUE lines.
func parseKV(s string) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(line, " ")
		if k != "" {
			kv[k] = strings.TrimSpace(v)
		}
	}
	return kv
}

// hasRow reports whether a row holds every column=value of want.
func hasRow(rows []map[string]string, want map[string]string) bool {
	for _, r := range rows {
		ok := true
		for k, v := range want {
			ok = ok && r[k] == v
		}
		if ok {
			return true
		}
	}
	return false
}

// step is one CLI run of a scenario and what its output must show.
type step struct {
	name  string
	role  control.Role // default write
	args  []string     // "{var}" is replaced by a value captured earlier
	stdin string
	// Table output: the exact header, and a row holding these columns' values.
	header []string
	row    map[string]string
	// Object output (get, create, change): FIELD VALUE pairs; "*" only requires a value.
	kv map[string]string
	// absent are fields the object output must not have.
	absent []string
	// -o json: the top-level members and their values as JSON ("*": any); list members are arrays.
	json map[string]string
	// capture stores JSON members under names for later args.
	capture map[string]string
	// contains are substrings of stdout.
	contains []string
}

// The happy path of every subcommand, in table and in JSON output, over a real server.
func TestAdminCommands(t *testing.T) {
	e := newAdminEnv(t)
	ctx := t.Context()
	past := e.clock.Now().Add(-time.Minute) // history's default end is now, excluded
	if err := e.store.AddCounts(ctx,
		[]control.UsageCount{
			{Minute: past, Rule: "per-user", Tenant: "acme", Allowed: 5, Denied: 2, Soft: 1},
			{Minute: past, Rule: control.DecisionRule, Tenant: "acme", Allowed: 5, Denied: 2, Soft: 1}, // the requests, each once
		},
		[]control.ViolationCount{{Minute: past, Rule: "per-user", Tenant: "acme", User: "bob", Endpoint: "/api/items", Denied: 2, Soft: 1, Limit: 3}},
	); err != nil {
		t.Fatal(err)
	}
	stats, err := json.Marshal(fleetstats.NodeStats{NodeHealth: fleetstats.NodeHealth{Node: "node-a", At: e.clock.Now(), Store: "memory", StoreUp: true, P99Ms: 0.25, Decisions: 8,
		RateWindow: 10}, Rules: []fleetstats.RuleStats{{Rule: "per-user", Rate: fleetstats.Rates{Allowed: 0.5, Denied: 0.3},
		Total: fleetstats.Counts{Allowed: 5, Denied: 3}, Top: sketch.Summary{Counters: []sketch.Counter{{Key: fleetstats.Consumer("acme", "bob", "", ""), Count: 8}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Heartbeat(ctx, control.Node{ID: "node-a", Addr: "127.0.0.1:8080", PolicyVersion: 3, Stats: stats}); err != nil {
		t.Fatal(err)
	}
	ruleFile := filepath.Join(t.TempDir(), "rule.yaml")
	if err := os.WriteFile(ruleFile, []byte("name: r1\nmatch: {endpoint: \"/api/*\", method: POST}\nkey: [tenant]\nalgorithm: token_bucket\nlimit: 10\nperiod: 1m\nburst: 15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	domainFile := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(domainFile, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	domainHeader := []string{"DOMAIN", "SOURCE", "UPDATED_BY", "UPDATED_AT"}
	ruleHeader := []string{"NAME", "SOURCE", "ALGORITHM", "LIMIT", "PERIOD", "BURST", "KEY", "MATCH", "SHADOW", "UPDATED_AT"}
	overrideHeader := []string{"ID", "SOURCE", "TYPE", "TENANT", "USER", "API_KEY", "API_KEY_HASH", "IP", "ENDPOINT", "RULE", "VALUE", "LIMIT", "BURST", "EXPIRES_AT", "CREATED_BY", "REASON"}
	exemptionHeader := []string{"ID", "SOURCE", "API_KEY", "USER", "TENANT", "IP", "EXPIRES_AT", "CREATED_BY", "REASON"}
	identityHeader := []string{"KIND", "VALUE", "TIER", "TENANT", "USER", "TRUST", "UPDATED_BY", "UPDATED_AT"}
	tokenHeader := []string{"NAME", "ROLE", "CREATED_BY", "CREATED_AT", "EXPIRES_AT", "LAST_USED_AT"}
	auditHeader := []string{"ID", "AT", "ACTOR", "ACTION", "KIND", "TARGET", "REASON"}
	in1h := "2026-11-23T13:00:00Z" // testutil.Start + 1h
	steps := []step{
		// rules
		{name: "rules list", args: []string{"rules", "list"}, header: ruleHeader,
			row: map[string]string{"NAME": "file-rule", "SOURCE": "file", "ALGORITHM": "gcra", "KEY": "tenant", "MATCH": "endpoint=/api/*"}},
		{name: "rules create from a YAML file", args: []string{"rules", "create", "-f", ruleFile},
			kv: map[string]string{"name": "r1", "source": "api", "limit": "10", "burst": "15", "key": "tenant", "match": "endpoint=/api/*,method=POST",
				"created_at": "2026-11-23T12:00:00Z", "updated_by": "writer", "policy_version": "*", "etag": "*"}},
		{name: "rules create from JSON on stdin and flags", args: []string{"rules", "create", "r2", "-f", "-", "--limit", "5", "--match", "descriptors.plan=pro", "-o", "json"},
			stdin: `{"key": ["user"], "period": "1s", "limit": 1}`,
			json:  map[string]string{"name": `"r2"`, "limit": "5", "period": `"1s"`, "source": `"api"`, "match": `{"descriptors":{"plan":"pro"}}`, "policy_version": "*"}},
		{name: "rules create from flags", args: []string{"rules", "create", "r3", "--key", "tenant,user", "--algorithm", "gcra", "--limit", "100", "--period", "1m", "--match", "endpoint=/v2/*", "--shadow"},
			kv: map[string]string{"name": "r3", "algorithm": "gcra", "key": "tenant,user", "shadow": "true", "match": "endpoint=/v2/*"}},
		{name: "rules get", role: control.RoleRead, args: []string{"rules", "get", "r1"},
			kv: map[string]string{"name": "r1", "period": "1m", "source": "api", "etag": "*"}},
		{name: "rules get json", role: control.RoleRead, args: []string{"rules", "get", "r1", "-o", "json"},
			json: map[string]string{"name": `"r1"`, "limit": "10", "key": `["tenant"]`}},
		{name: "rules get a file rule", role: control.RoleRead, args: []string{"rules", "get", "file-rule"},
			kv: map[string]string{"name": "file-rule", "source": "file"}},
		{name: "rules list shows API rules", role: control.RoleRead, args: []string{"rules", "ls"}, header: ruleHeader,
			row: map[string]string{"NAME": "r1", "SOURCE": "api", "LIMIT": "10", "PERIOD": "1m", "BURST": "15", "MATCH": "endpoint=/api/*,method=POST", "UPDATED_AT": "2026-11-23T12:00:00Z"}},
		{name: "rules list json", role: control.RoleRead, args: []string{"rules", "list", "-o", "json"}, json: map[string]string{"rules": "[]"}},
		{name: "rules patch", args: []string{"rules", "patch", "r1", "--limit", "20", "--unset", "burst", "--unset", "match.method", "--reason", "more room"},
			kv: map[string]string{"limit": "20", "match": "endpoint=/api/*", "policy_version": "*"}, absent: []string{"burst"}},
		{name: "rules patch from a file, json", args: []string{"rules", "patch", "r1", "-f", "-", "-o", "json"}, stdin: "tiers:\n  free: {limit: 2}\n",
			json: map[string]string{"tiers": `{"free":{"limit":2}}`, "limit": "20"}},
		{name: "rules update", args: []string{"rules", "update", "r2", "--limit", "7", "--period", "1s"},
			kv: map[string]string{"name": "r2", "limit": "7", "period": "1s"}, absent: []string{"key", "match"}},
		{name: "rules put json", args: []string{"rules", "put", "r3", "--limit", "8", "--period", "1h", "-o", "json"},
			json: map[string]string{"name": `"r3"`, "limit": "8", "policy_version": "*"}},
		{name: "rules delete", args: []string{"rules", "delete", "r2"}, contains: []string{`deleted rule "r2" (policy version `}},
		{name: "rules delete json", args: []string{"rules", "rm", "r3", "-o", "json"}, json: map[string]string{"policy_version": "*"}},

		// overrides
		{name: "overrides create", args: []string{"overrides", "create", "--tenant", "acme", "--type", "ban", "--ttl", "1h", "--reason", "abuse ticket 42"},
			kv: map[string]string{"type": "ban", "tenant": "acme", "expires_at": in1h, "source": "api", "created_by": "writer", "reason": "abuse ticket 42", "policy_version": "*", "etag": "*"}},
		{name: "overrides create json", args: []string{"overrides", "create", "--user", "bob", "--rule", "r1", "--type", "multiplier", "--value", "0.5", "--expires-at", in1h, "--reason", "slow down", "-o", "json"},
			json: map[string]string{"type": `"multiplier"`, "value": "0.5", "rule": `"r1"`, "expires_at": `"` + in1h + `"`, "id": "*"}, capture: map[string]string{"ov": "id"}},
		{name: "overrides create custom", args: []string{"overrides", "create", "--api-key", "k9", "--type", "custom", "--limit", "50", "--burst", "60", "--ttl", "30m", "--reason", "launch"},
			kv: map[string]string{"type": "custom", "limit": "50", "burst": "60", "api_key": "k9"}},
		{name: "overrides list", role: control.RoleRead, args: []string{"overrides", "list"}, header: overrideHeader,
			row: map[string]string{"SOURCE": "api", "TYPE": "ban", "TENANT": "acme", "EXPIRES_AT": in1h, "CREATED_BY": "writer", "REASON": "abuse ticket 42", "USER": "-"}},
		{name: "overrides list filtered", role: control.RoleRead, args: []string{"overrides", "list", "--user", "bob"}, header: overrideHeader,
			row: map[string]string{"ID": "{ov}", "TYPE": "multiplier", "VALUE": "0.5", "RULE": "r1"}},
		{name: "overrides list from files", role: control.RoleRead, args: []string{"overrides", "list", "--source", "file"}, header: overrideHeader,
			row: map[string]string{"ID": "-1", "SOURCE": "file", "TENANT": "file-tenant", "EXPIRES_AT": "2027-06-01T00:00:00Z"}},
		{name: "overrides list json", role: control.RoleRead, args: []string{"overrides", "list", "--tenant", "acme", "-o", "json"}, json: map[string]string{"overrides": "[]"}},
		{name: "overrides get", role: control.RoleRead, args: []string{"overrides", "get", "{ov}"}, kv: map[string]string{"id": "{ov}", "user": "bob", "etag": "*"}},
		{name: "overrides get json", role: control.RoleRead, args: []string{"overrides", "get", "{ov}", "-o", "json"}, json: map[string]string{"id": "{ov}", "user": `"bob"`}},
		{name: "overrides patch", args: []string{"overrides", "patch", "{ov}", "--value", "0.25", "--reason", "slower"},
			kv: map[string]string{"id": "{ov}", "value": "0.25", "reason": "slower", "user": "bob", "policy_version": "*", "etag": "*"}},
		{name: "overrides extend json", args: []string{"overrides", "extend", "{ov}", "--by", "1h", "-o", "json"},
			json: map[string]string{"id": "{ov}", "expires_at": `"2026-11-23T14:00:00Z"`, "value": "0.25"}},
		{name: "overrides patch unset", args: []string{"overrides", "patch", "{ov}", "--ttl", "3h", "-o", "json"},
			json: map[string]string{"id": "{ov}", "expires_at": `"2026-11-23T15:00:00Z"`}},
		{name: "overrides delete", args: []string{"overrides", "delete", "{ov}"}, contains: []string{"deleted override {ov} (policy version "}},

		// exemptions
		{name: "exemptions create json", args: []string{"exemptions", "create", "--ip", "203.0.113.0/24", "--reason", "partner crawler", "-o", "json"},
			json: map[string]string{"ip": `"203.0.113.0/24"`, "source": `"api"`, "id": "*", "policy_version": "*"}, capture: map[string]string{"ex": "id"}},
		{name: "exemptions create", args: []string{"exemptions", "create", "--api-key", "k-monitor", "--reason", "uptime", "--expires-at", in1h},
			kv: map[string]string{"api_key": "k-monitor", "expires_at": in1h, "source": "api", "policy_version": "*"}},
		{name: "exemptions list", role: control.RoleRead, args: []string{"exemptions", "list"}, header: exemptionHeader,
			row: map[string]string{"ID": "{ex}", "SOURCE": "api", "IP": "203.0.113.0/24", "REASON": "partner crawler", "EXPIRES_AT": "-"}},
		{name: "exemptions list from files", role: control.RoleRead, args: []string{"exemptions", "list", "--source", "file"}, header: exemptionHeader,
			row: map[string]string{"ID": "-1", "SOURCE": "file", "IP": "10.0.0.0/8"}},
		{name: "exemptions list json", role: control.RoleRead, args: []string{"exemptions", "list", "-o", "json"}, json: map[string]string{"exemptions": "[]"}},
		{name: "exemptions get", role: control.RoleRead, args: []string{"exemptions", "get", "{ex}"}, kv: map[string]string{"ip": "203.0.113.0/24", "etag": "*"}},
		{name: "exemptions get json", role: control.RoleRead, args: []string{"exemptions", "get", "{ex}", "-o", "json"}, json: map[string]string{"id": "{ex}"}},
		{name: "exemptions patch", args: []string{"exemptions", "patch", "{ex}", "--ttl", "2h", "--reason", "until the crawl ends"},
			kv: map[string]string{"ip": "203.0.113.0/24", "expires_at": "2026-11-23T14:00:00Z", "reason": "until the crawl ends", "policy_version": "*"}},
		{name: "exemptions patch never", args: []string{"exemptions", "patch", "{ex}", "--never-expire", "-o", "json"},
			json: map[string]string{"id": "{ex}"}, absent: []string{"expires_at"}},
		{name: "exemptions delete", args: []string{"exemptions", "delete", "{ex}"}, contains: []string{"deleted exemption {ex} (policy version "}},

		// identities
		{name: "identities set", args: []string{"identities", "set", "api_key", "k1", "--tier", "premium", "--tenant", "acme", "--user", "bob"},
			kv: map[string]string{"kind": "api_key", "value": "k1", "tier": "premium", "tenant": "acme", "user": "bob", "updated_by": "writer", "policy_version": "*", "etag": "*"}},
		{name: "identities set json, a value with a slash", args: []string{"identities", "put", "user", "team/alice", "--tier", "gold", "--trust", "0.75", "-o", "json"},
			json: map[string]string{"kind": `"user"`, "value": `"team/alice"`, "trust": "0.75"}},
		{name: "identities list", role: control.RoleRead, args: []string{"identities", "list"}, header: identityHeader,
			row: map[string]string{"KIND": "user", "VALUE": "team/alice", "TIER": "gold", "TRUST": "0.75", "UPDATED_AT": "2026-11-23T12:00:00Z"}},
		{name: "identities list by kind json", role: control.RoleRead, args: []string{"identities", "list", "--kind", "api_key", "-o", "json"}, json: map[string]string{"identities": "[]"}},
		{name: "identities get", role: control.RoleRead, args: []string{"identities", "get", "user", "team/alice"}, kv: map[string]string{"value": "team/alice", "tier": "gold"}},
		{name: "identities get json", role: control.RoleRead, args: []string{"identities", "get", "api_key", "k1", "-o", "json"}, json: map[string]string{"tier": `"premium"`}},
		{name: "identities delete", args: []string{"identities", "delete", "user", "team/alice"}, contains: []string{`deleted identity user "team/alice" (policy version `}},

		// domains
		{name: "domains put from a YAML file", args: []string{"domains", "put", "edge", "-f", domainFile},
			kv: map[string]string{"domain": "edge", "source": "api", "updated_by": "writer", "policy_version": "*", "etag": "*"}},
		{name: "domains put JSON on stdin, json", args: []string{"domains", "set", "api", "-f", "-", "-o", "json"},
			stdin: `{"descriptors": [{"key": "tenant", "rate_limit": {"unit": "minute", "requests_per_unit": 7}}]}`,
			json:  map[string]string{"domain": `"api"`, "source": `"api"`, "descriptors": `[{"key":"tenant","rate_limit":{"unit":"minute","requests_per_unit":7}}]`, "policy_version": "*"}},
		{name: "domains put a YAML flow mapping", args: []string{"domains", "put", "flow", "-f", "-"},
			stdin: "{domain: flow, descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]}\n",
			kv:    map[string]string{"domain": "flow", "source": "api"}},
		{name: "domains list", role: control.RoleRead, args: []string{"domains", "list"}, header: domainHeader,
			row: map[string]string{"DOMAIN": "edge", "SOURCE": "api", "UPDATED_BY": "writer", "UPDATED_AT": "2026-11-23T12:00:00Z"}},
		{name: "domains list shows the files'", role: control.RoleRead, args: []string{"domains", "ls"}, header: domainHeader,
			row: map[string]string{"DOMAIN": "file-edge", "SOURCE": "file", "UPDATED_BY": "-"}},
		{name: "domains list json", role: control.RoleRead, args: []string{"domains", "list", "-o", "json"}, json: map[string]string{"domains": "[]"}},
		{name: "domains get", role: control.RoleRead, args: []string{"domains", "get", "edge"}, kv: map[string]string{"domain": "edge", "source": "api", "etag": "*"}},
		{name: "domains get json", role: control.RoleRead, args: []string{"domains", "get", "edge", "-o", "json"},
			json: map[string]string{"domain": `"edge"`, "descriptors": `[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]`}},
		{name: "domains delete", args: []string{"domains", "delete", "api"}, contains: []string{`deleted domain "api" (policy version `}},

		// tokens
		{name: "tokens list", role: control.RoleAdmin, args: []string{"tokens", "list"}, header: tokenHeader,
			row: map[string]string{"NAME": "writer", "ROLE": "write", "CREATED_BY": "test-setup", "CREATED_AT": "2026-11-23T12:00:00Z"}},
		{name: "tokens list json", role: control.RoleAdmin, args: []string{"tokens", "list", "-o", "json"}, json: map[string]string{"tokens": "[]"}},
		{name: "tokens create json", role: control.RoleAdmin, args: []string{"tokens", "create", "deploy", "--role", "write", "-o", "json"},
			json: map[string]string{"name": `"deploy"`, "role": `"write"`, "token": "*", "policy_version": "*"}},
		{name: "tokens create with a ttl", role: control.RoleAdmin, args: []string{"tokens", "create", "ephemeral", "--role", "read", "--ttl", "2h", "-o", "json"},
			json: map[string]string{"name": `"ephemeral"`, "expires_at": `"2026-11-23T14:00:00Z"`, "token": "*"}},
		{name: "tokens list shows the expiry", role: control.RoleAdmin, args: []string{"tokens", "list"}, header: tokenHeader,
			row: map[string]string{"NAME": "ephemeral", "ROLE": "read", "EXPIRES_AT": "2026-11-23T14:00:00Z", "LAST_USED_AT": "-"}},
		{name: "tokens delete", role: control.RoleAdmin, args: []string{"tokens", "delete", "deploy"}, contains: []string{`deleted token "deploy" (policy version `}},

		// audit, usage, violations, nodes, reset
		{name: "audit", role: control.RoleRead, args: []string{"audit", "--kind", "override", "--action", "create", "--limit", "10"}, header: auditHeader,
			row: map[string]string{"ACTOR": "writer", "ACTION": "create", "KIND": "override", "AT": "2026-11-23T12:00:00Z", "REASON": "abuse ticket 42"}},
		{name: "audit by reason header", role: control.RoleRead, args: []string{"audit", "--target", "r1", "--since", "1h"}, header: auditHeader,
			row: map[string]string{"ACTION": "update", "KIND": "rule", "TARGET": "r1", "REASON": "more room"}},
		{name: "audit json", role: control.RoleRead, args: []string{"audit", "--since", "2026-11-23T00:00:00Z", "--actor", "writer", "-o", "json"}, json: map[string]string{"events": "[]"}},
		{name: "usage", role: control.RoleRead, args: []string{"usage", "--user", "alice", "--endpoint", "/api/items"},
			header: []string{"allowed", "true"}, contains: []string{"RULE", "RESET_AFTER"}},
		{name: "usage json", role: control.RoleRead, args: []string{"usage", "--user", "alice", "-o", "json"},
			json: map[string]string{"allowed": "true", "remaining": "3", "results": "[]"}},
		{name: "usage history", role: control.RoleRead, args: []string{"usage", "history", "--tenant", "acme", "--from", "1h", "--step", "1m"},
			header: []string{"AT", "ALLOWED", "DENIED", "SOFT"}, row: map[string]string{"AT": "2026-11-23T11:59:00Z", "ALLOWED": "5", "DENIED": "2", "SOFT": "1"}},
		{name: "usage history json", role: control.RoleRead, args: []string{"usage", "history", "--rule", "per-user", "--step", "1h", "--from", "1d", "-o", "json"},
			json: map[string]string{"points": `[{"at":"2026-11-23T11:00:00Z","allowed":5,"denied":2,"soft":1}]`}},
		{name: "violations", role: control.RoleRead, args: []string{"violations", "--tenant", "acme", "--since", "1h"},
			header: []string{"AT", "RULE", "STATE", "COUNT", "LIMIT", "TENANT", "USER", "API_KEY", "IP", "ENDPOINT"},
			row:    map[string]string{"AT": "2026-11-23T11:59:00Z", "RULE": "per-user", "STATE": "hard", "COUNT": "2", "LIMIT": "3", "USER": "bob", "ENDPOINT": "/api/items", "IP": "-"}},
		{name: "violations json", role: control.RoleRead, args: []string{"violations", "--user", "bob", "--limit", "5", "-o", "json"}, json: map[string]string{"violations": "[]"}},
		{name: "nodes", role: control.RoleRead, args: []string{"nodes"}, header: []string{"ID", "ADDR", "POLICY_VERSION", "SEEN_AT"},
			row: map[string]string{"ID": "node-a", "ADDR": "127.0.0.1:8080", "POLICY_VERSION": "3", "SEEN_AT": "2026-11-23T12:00:00Z"}},
		{name: "nodes json", role: control.RoleRead, args: []string{"nodes", "-o", "json"}, json: map[string]string{"nodes": "[]"}},
		{name: "stats", role: control.RoleRead, args: []string{"stats"},
			contains: []string{"p99_ms  0.25", "RULE      ALLOWED/S  SOFT/S  DENIED/S  ALLOWED  SOFT  DENIED", "per-user  0.5        0       0.3       5        0     3", "node-a  memory  true"}},
		{name: "stats json", role: control.RoleRead, args: []string{"stats", "-o", "json"}, json: map[string]string{"rules": "[]", "nodes": "[]", "p99_ms": "0.25"}},
		{name: "top", role: control.RoleRead, args: []string{"top", "--rule", "per-user", "--limit", "5"}, header: []string{"RULE", "TENANT", "CONSUMER", "COUNT", "ERROR"},
			row: map[string]string{"RULE": "per-user", "TENANT": "acme", "CONSUMER": "user:bob", "COUNT": "8", "ERROR": "0"}},
		{name: "top json", role: control.RoleRead, args: []string{"top", "-o", "json"}, json: map[string]string{"rules": "[]"}},
		{name: "reset", args: []string{"reset", "--user", "alice", "--rule", "per-user"}, kv: map[string]string{"keys_reset": "*", "policy_version": "*"}},
		{name: "reset json", args: []string{"reset", "--user", "alice", "-o", "json"}, json: map[string]string{"keys_reset": "*"}},
		{name: "export", role: control.RoleRead, args: []string{"export", "-o", "json"}, json: map[string]string{"rules": "*", "overrides": "*", "identities": "*"}},
		{name: "import", stdin: "identities:\n  - {kind: user, value: imported, tier: gold}\n", args: []string{"import", "-", "--apply"}, contains: []string{"create identity user/imported", "imported: 1 created"}},
	}
	vars := map[string]string{}
	expand := func(s string) string {
		for k, v := range vars {
			s = strings.ReplaceAll(s, "{"+k+"}", v)
		}
		return s
	}
	t.Cleanup(func() { e.coversOpenAPI(t) })
	for _, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			role := st.role
			if role == "" {
				role = control.RoleWrite
			}
			args := make([]string, len(st.args))
			for i, a := range st.args {
				args[i] = expand(a)
			}
			r := e.admin(role, st.stdin, args...)
			if r.code != 0 {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
			}
			for _, s := range st.contains {
				if !strings.Contains(r.stdout, expand(s)) {
					t.Errorf("stdout lacks %q:\n%s", expand(s), r.stdout)
				}
			}
			if st.header != nil {
				header, rows := parseTable(t, r.stdout)
				if !slices.Equal(header, st.header) {
					t.Errorf("header %q, want %q", header, st.header)
				}
				if st.row != nil {
					want := map[string]string{}
					for k, v := range st.row {
						want[k] = expand(v)
					}
					if !hasRow(rows, want) {
						t.Errorf("no row with %v in:\n%s", want, r.stdout)
					}
				}
			}
			if st.kv != nil {
				got := parseKV(r.stdout)
				for k, v := range st.kv {
					if g, ok := got[k]; !ok || (v != "*" && g != expand(v)) || g == "" {
						t.Errorf("%s = %q, want %q:\n%s", k, g, expand(v), r.stdout)
					}
				}
			}
			for _, k := range st.absent {
				if v, ok := parseKV(r.stdout)[k]; ok {
					t.Errorf("%s = %q, want it absent:\n%s", k, v, r.stdout)
				}
			}
			if st.json != nil {
				var got map[string]json.RawMessage
				if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
					t.Fatalf("-o json printed no JSON object: %v\n%s", err, r.stdout)
				}
				for k, v := range st.json {
					g, ok := got[k]
					switch {
					case !ok:
						t.Errorf("no member %q:\n%s", k, r.stdout)
					case v == "*":
					case v == "[]":
						var items []json.RawMessage
						if json.Unmarshal(g, &items) != nil || len(items) == 0 {
							t.Errorf("%s = %s, want a non-empty array", k, g)
						}
					case string(g) != expand(v):
						t.Errorf("%s = %s, want %s", k, g, expand(v))
					}
				}
				for name, member := range st.capture {
					vars[name] = strings.Trim(string(got[member]), `"`)
				}
			}
		})
		if !ok {
			t.FailNow() // later steps build on this one
		}
	}
}

// coversOpenAPI fails the test unless the CLI called every operation of openapi.json but the
// document itself: sluice admin speaks the whole contract.
func (e *adminEnv) coversOpenAPI(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(adminapi.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for path, ops := range doc.Paths {
		if path == "/admin/v1/openapi.json" {
			continue
		}
		segs := strings.Split(path, "/")
		for i, seg := range segs {
			if strings.HasPrefix(seg, "{") {
				segs[i] = "[^/]+"
			} else {
				segs[i] = regexp.QuoteMeta(seg)
			}
		}
		pattern := regexp.MustCompile("^" + strings.Join(segs, "/") + "$")
		for method := range ops {
			method = strings.ToUpper(method)
			if method == "PARAMETERS" || method == "SUMMARY" || method == "DESCRIPTION" {
				continue
			}
			if !slices.ContainsFunc(e.hits, func(h string) bool {
				m, p, _ := strings.Cut(h, " ")
				return m == method && pattern.MatchString(p)
			}) {
				t.Errorf("no sluice admin command calls %s %s", method, path)
			}
		}
	}
}

// Bad input is refused by the server, whose error names the field: stderr says
// "sluice: FIELD: message (HTTP 400)", the exit code is 1, and nothing changed.
func TestAdminBadInput(t *testing.T) {
	e := newAdminEnv(t)
	if r := e.admin(control.RoleWrite, "", "rules", "create", "r1", "--limit", "5", "--period", "1s"); r.code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	badFile := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badFile, []byte("name: r9\nlimt: 5\nperiod: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		role   control.Role
		args   []string
		stdin  string
		stderr string // the start of stderr
	}{
		{"rule with an unknown field", control.RoleWrite, []string{"rules", "create", "-f", badFile}, "", "sluice: limt: unknown field (HTTP 400)"},
		{"rule with a bad period", control.RoleWrite, []string{"rules", "create", "r9", "--limit", "5", "--period", "soon"}, "", "sluice: period: "},
		{"rule with a bad algorithm", control.RoleWrite, []string{"rules", "create", "r9", "--limit", "5", "--period", "1s", "--algorithm", "magic"}, "", "sluice: algorithm: "},
		{"rule with a bad match field", control.RoleWrite, []string{"rules", "create", "r9", "--limit", "5", "--period", "1s", "--match", "colour=red"}, "", "sluice: match.colour: "},
		{"rule with a wrongly typed field", control.RoleWrite, []string{"rules", "create", "-f", "-"}, `{"name": "r9", "limit": "five", "period": "1s"}`, "sluice: limit: "},
		{"patch to a bad limit", control.RoleWrite, []string{"rules", "patch", "r1", "--limit", "-3"}, "", "sluice: limit: "},
		{"put renaming a rule", control.RoleWrite, []string{"rules", "update", "r1", "-f", "-"}, "name: other\nlimit: 1\nperiod: 1s\n", "sluice: name: "},
		{"override of an unknown type", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--type", "nuke", "--ttl", "1h", "--reason", "x"}, "", "sluice: type: "},
		{"override without expiry", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--type", "ban", "--reason", "x"}, "", "sluice: expires_at: "},
		{"override with a bad ttl", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--type", "ban", "--ttl", "forever", "--reason", "x"}, "", "sluice: ttl: "},
		{"override without a reason", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--type", "ban", "--ttl", "1h"}, "", "sluice: reason: "},
		{"override of an unknown rule", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--rule", "nope", "--type", "ban", "--ttl", "1h", "--reason", "x"}, "", "sluice: rule: "},
		{"override list by a bad source", control.RoleRead, []string{"overrides", "list", "--source", "magic"}, "", "sluice: source: "},
		{"exemption of a bad address", control.RoleWrite, []string{"exemptions", "create", "--ip", "300.1.2.3", "--reason", "x"}, "", "sluice: ip: "},
		{"identity of an unknown kind", control.RoleWrite, []string{"identities", "set", "planet", "mars", "--tier", "gold"}, "", "sluice: kind: "},
		{"identity with trust out of range", control.RoleWrite, []string{"identities", "set", "user", "bob", "--trust", "2"}, "", "sluice: trust: "},
		{"identity: a user given a tenant", control.RoleWrite, []string{"identities", "set", "user", "bob", "--tenant", "acme"}, "", "sluice: tenant: "},
		{"token of an unknown role", control.RoleAdmin, []string{"tokens", "create", "ci", "--role", "root"}, "", "sluice: role: "},
		{"audit of an unknown kind", control.RoleRead, []string{"audit", "--kind", "planet"}, "", "sluice: kind: "},
		{"audit with a bad limit", control.RoleRead, []string{"audit", "--limit", "5000"}, "", "sluice: limit: "},
		{"audit with a bad since", control.RoleRead, []string{"audit", "--since", "yesterday"}, "", "sluice: since: "},
		{"history with a bad step", control.RoleRead, []string{"usage", "history", "--step", "5m"}, "", "sluice: step: "},
		{"history from after to", control.RoleRead, []string{"usage", "history", "--from", "2026-11-23T12:00:00Z", "--to", "2026-11-23T11:00:00Z"}, "", "sluice: from: "},
		{"violations with a bad until", control.RoleRead, []string{"violations", "--until", "later"}, "", "sluice: until: "},
		{"a descriptor without a key", control.RoleWrite, []string{"reset", "--user", "bob", "--descriptor", "=x"}, "", "sluice: --descriptor"},
		// Refused by the CLI before any call.
		{"a match without =", control.RoleWrite, []string{"rules", "create", "r9", "--match", "endpoint"}, "", `sluice: --match "endpoint": want FIELD=VALUE`},
		{"no timeout", control.RoleRead, []string{"nodes", "--timeout", "0s"}, "", "sluice: --timeout 0s: must be > 0"},
		{"an unknown output", control.RoleRead, []string{"rules", "list", "-o", "yaml"}, "", `sluice: --output "yaml": want table or json`},
		{"a YAML file that is a list", control.RoleWrite, []string{"rules", "create", "-f", "-"}, "- name: r9\n", "sluice: -: line 1: want one object"},
		{"a YAML integer past 64 bits", control.RoleWrite, []string{"rules", "create", "-f", "-"}, "name: r9\nlimit: 99999999999999999999\n", "sluice: limit: must be an integer"},
		{"a multiplier that is not a number", control.RoleWrite, []string{"overrides", "create", "--tenant", "acme", "--type", "multiplier", "--value", "NaN", "--ttl", "1h", "--reason", "x"}, "", "sluice: --value NaN: want a finite number"},
		{"an infinite trust", control.RoleWrite, []string{"identities", "set", "user", "bob", "--trust", "+Inf"}, "", "sluice: --trust +Inf: want a finite number"},
		{"a patch without changes", control.RoleWrite, []string{"rules", "patch", "r1"}, "", "sluice: nothing to change"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.version()
			r := e.admin(tc.role, tc.stdin, tc.args...)
			if r.code != exitGeneral {
				t.Errorf("exit %d, want %d", r.code, exitGeneral)
			}
			if !strings.HasPrefix(r.stderr, tc.stderr) {
				t.Errorf("stderr %q, want it to start with %q", r.stderr, tc.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if v := e.version(); v != before {
				t.Errorf("control version %d -> %d: a refused call changed something", before, v)
			}
		})
	}
}

// 404 exits 3, 409 and 412 exit 4, 401, 403 (and no token at all) exit 5; the token shows
// nowhere, not even with --verbose.
func TestAdminExitCodes(t *testing.T) {
	e := newAdminEnv(t)
	if r := e.admin(control.RoleWrite, "", "rules", "create", "r1", "--limit", "5", "--period", "1s"); r.code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	r := e.admin(control.RoleRead, "", "rules", "get", "r1")
	etag := parseKV(r.stdout)["etag"]
	if etag == "" {
		t.Fatalf("rules get shows no etag:\n%s", r.stdout)
	}
	const badSecret = "sluice_not-a-real-token-0123456789"
	badFile := filepath.Join(t.TempDir(), "bad.token")
	if err := os.WriteFile(badFile, []byte(badSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	badDomain := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badDomain, []byte("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, "")
	t.Setenv(envAdminToken, "")
	t.Setenv(envDataDir, t.TempDir()) // no admin.token there
	cases := []struct {
		name   string
		args   []string // after "admin"
		code   int
		stderr string
	}{
		{"unknown rule", []string{"--token-file", e.tokens[control.RoleRead], "rules", "get", "nope"}, exitNotFound, "sluice: no rule with that name (HTTP 404)"},
		{"unknown override", []string{"--token-file", e.tokens[control.RoleWrite], "overrides", "delete", "999"}, exitNotFound, "sluice: no override with that id (HTTP 404)"},
		{"unknown identity", []string{"--token-file", e.tokens[control.RoleRead], "identities", "get", "user", "nobody"}, exitNotFound, "sluice: no assignment for that identity (HTTP 404)"},
		{"rule name taken", []string{"--token-file", e.tokens[control.RoleWrite], "rules", "create", "r1", "--limit", "1", "--period", "1s"}, exitConflict, "sluice: a rule with that name exists already (HTTP 409)"},
		{"file rule name", []string{"--token-file", e.tokens[control.RoleWrite], "rules", "create", "file-rule", "--limit", "1", "--period", "1s"}, exitConflict, "sluice: name: "},
		{"file rule is read-only", []string{"--token-file", e.tokens[control.RoleWrite], "rules", "delete", "file-rule"}, exitConflict, "sluice: rule: defined in a policy file"},
		{"stale If-Match", []string{"--token-file", e.tokens[control.RoleWrite], "rules", "patch", "r1", "--limit", "6", "--if-match", "999999"}, exitConflict, "sluice: If-Match does not match the resource's current ETag; read it again (HTTP 412)"},
		{"last admin token", []string{"--token-file", e.tokens[control.RoleAdmin], "tokens", "delete", "root"}, exitConflict, "sluice: this is the last admin token"},
		{"unknown domain", []string{"--token-file", e.tokens[control.RoleRead], "domains", "get", "nope"}, exitNotFound, "sluice: no domain with that name (HTTP 404)"},
		{"file domain is read-only", []string{"--token-file", e.tokens[control.RoleWrite], "domains", "put", "file-edge", "-f", badDomain}, exitConflict, "sluice: domain: defined in a policy file"},
		{"bad domain, its field and line named", []string{"--token-file", e.tokens[control.RoleWrite], "domains", "put", "edge", "-f", badDomain}, exitGeneral,
			`sluice: descriptors[0].rate_limit.unit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year) (line 4)`},
		{"no token", []string{"rules", "list"}, exitAuth, "sluice: no token: give --token-file"},
		{"empty token file", []string{"--token-file", os.DevNull, "rules", "list"}, exitAuth, "sluice: --token-file " + os.DevNull + ": empty token"},
		{"missing token file", []string{"--token-file", filepath.Join(t.TempDir(), "none"), "rules", "list"}, exitAuth, "sluice: --token-file: open "},
		{"unknown token", []string{"--token-file", badFile, "rules", "list"}, exitAuth,
			"sluice: authentication required: send Authorization: Bearer TOKEN with a valid admin token; the token from --token-file " + badFile + " was refused (HTTP 401)"},
		{"unknown token on the command line, verbose", []string{"--token", badSecret, "-v", "overrides", "list"}, exitAuth, "> GET "},
		{"read token writing", []string{"--token-file", e.tokens[control.RoleRead], "rules", "delete", "r1"}, exitAuth, "sluice: forbidden: this call needs a write token"},
		{"write token on tokens", []string{"--token", adminSecrets[control.RoleWrite], "-v", "tokens", "list"}, exitAuth, "> GET "},
		{"server down", []string{"--server", "http://127.0.0.1:1", "--token-file", e.tokens[control.RoleRead], "nodes"}, exitGeneral, "sluice: ask http://127.0.0.1:1: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"admin", "--server", e.url}, tc.args...)
			r := runCLI(t, e.clock.Now, "", args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", r.code, tc.code, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, tc.stderr) {
				t.Errorf("stderr %q, want it to start with %q", r.stderr, tc.stderr)
			}
			for _, secret := range append(slices.Collect(mapValues(adminSecrets)), badSecret) {
				if strings.Contains(r.stdout+r.stderr, secret) {
					t.Errorf("a token secret is printed:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
				}
			}
			if slices.Contains(tc.args, "-v") && !strings.Contains(r.stderr, "> Authorization: Bearer [redacted]") {
				t.Errorf("--verbose does not show the redacted header:\n%s", r.stderr)
			}
		})
	}
	t.Run("current If-Match", func(t *testing.T) {
		r := e.admin(control.RoleWrite, "", "rules", "patch", "r1", "--limit", "6", "--if-match", etag)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		// The rule changed, so the ETag read before is stale now.
		r = e.admin(control.RoleWrite, "", "rules", "delete", "r1", "--if-match", `"`+etag+`"`)
		if r.code != exitConflict {
			t.Fatalf("exit %d, want %d: %s", r.code, exitConflict, r.stderr)
		}
	})
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
