package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-race", "-o", binary, "../cmd/sluice")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build sluice:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running sluice process.
type server struct {
	t        *testing.T
	cmd      *exec.Cmd
	http     string
	grpc     string
	log      *syncBuffer
	exited   chan error
	dataDir  string
	config   string
	extraEnv []string
}

// syncBuffer is a bytes.Buffer the process's output goroutine and the test can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs sluice serve with config and dataDir and waits until /healthz answers.
func start(t *testing.T, config, dataDir string, env ...string) *server {
	t.Helper()
	return startBin(t, binary, config, dataDir, env...)
}

// startBin is start with another build of sluice (see staticBinary).
func startBin(t *testing.T, binary, config, dataDir string, env ...string) *server {
	t.Helper()
	return startWith(t, binary, config, dataDir, nil, http.DefaultClient, "http", env...)
}

// startWith is startBin with extra serve flags, waiting for /healthz through client at
// scheme://address (https and a client with certificates when the flags turn TLS on).
func startWith(t *testing.T, binary, config, dataDir string, extra []string, client *http.Client, scheme string, env ...string) *server {
	t.Helper()
	s := &server{t: t, http: freePort(t), grpc: freePort(t), log: &syncBuffer{}, exited: make(chan error, 1), dataDir: dataDir, config: config, extraEnv: env}
	args := []string{"serve", "--http", s.http, "--grpc", s.grpc, "--data-dir", dataDir, "--snapshot-interval", "100ms"}
	if config != "" {
		args = append(args, "--config", config)
	}
	args = append(args, extra...)
	s.cmd = exec.Command(binary, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.Env = append(os.Environ(), env...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("sluice log:\n%s", s.log.String())
		}
	})
	// A minute: a loaded machine starting nine nodes at once (TestRegions) beside other
	// packages' tests has taken more than 15 s; a node that fails to start exits, and that is
	// seen at once.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := client.Get(scheme + "://" + s.http + "/healthz"); err == nil {
			resp.Body.Close()
			return s
		}
		select {
		case err := <-s.exited:
			t.Fatalf("sluice exited at start: %v\n%s", err, s.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("sluice did not answer /healthz within a minute\n%s", s.log)
	return nil
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		if err != nil {
			s.t.Fatalf("sluice exited with %v after SIGTERM\n%s", err, s.log)
		}
	case <-time.After(15 * time.Second):
		s.t.Fatalf("sluice did not stop within 15 s of SIGTERM")
	}
}

func (s *server) post(path, body string) (int, http.Header, map[string]any) {
	s.t.Helper()
	resp, err := http.Post("http://"+s.http+path, "application/json", strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		s.t.Fatalf("POST %s: answer %q is not JSON", path, raw)
	}
	return resp.StatusCode, resp.Header, m
}

func (s *server) get(path string) string {
	s.t.Helper()
	resp, err := http.Get("http://" + s.http + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

func (s *server) policyVersion() string {
	var m map[string]string
	json.Unmarshal([]byte(s.get("/readyz")), &m)
	return m["policy_version"]
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write and rename, as editors and ConfigMaps do, so the server never reads half a file.
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const nativePolicy = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: sliding_window_log, limit: 5, period: 1h, soft: 60}
  - {name: search, match: {endpoint: /search, method: GET}, key: [user], algorithm: token_bucket, limit: 100, period: 1s}
`

const envoyPolicy = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2, name: per-ip}
  - key: path
    value: /health
`

func TestServeDecidesAndKeepsQuotaAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfgDir, dataDir := filepath.Join(dir, "policy"), filepath.Join(dir, "data")
	os.Mkdir(cfgDir, 0o755)
	writeFile(t, filepath.Join(cfgDir, "native.yaml"), nativePolicy)
	writeFile(t, filepath.Join(cfgDir, "envoy.yaml"), envoyPolicy)
	s := start(t, cfgDir, dataDir)

	for i := range 3 {
		code, h, body := s.post("/v1/check", `{"tenant":"acme","user":"ann","endpoint":"/search","method":"GET"}`)
		if code != 200 || body["remaining"] != float64(4-i) || body["rule"] != "per-user" {
			t.Fatalf("check %d: %d %v", i, code, body)
		}
		if h.Get("X-RateLimit-Limit") != "5" || !strings.Contains(h.Get("RateLimit-Policy"), `"search";q=100;w=1`) {
			t.Fatalf("headers: %v", h)
		}
		if i == 2 && (body["state"] != "soft" || h.Get("X-RateLimit-Warning") == "") {
			t.Fatalf("third of five at soft 60%%: state %v, warning %q", body["state"], h.Get("X-RateLimit-Warning"))
		}
	}
	if code, _, body := s.post("/v1/check", `{"user":5}`); code != 400 || !strings.Contains(body["error"].(string), "user") {
		t.Fatalf("bad input: %d %v", code, body)
	}

	// SIGTERM writes the snapshot; the next process starts with the same quota used.
	s.stop()
	if _, err := os.Stat(filepath.Join(dataDir, "memory.snapshot")); err != nil {
		t.Fatalf("no snapshot after SIGTERM: %v", err)
	}
	s2 := start(t, cfgDir, dataDir)
	code, _, body := s2.post("/v1/check", `{"tenant":"acme","user":"ann"}`)
	if code != 200 || body["remaining"] != 1.0 {
		t.Fatalf("after restart: %d %v, want remaining 1 (3 used before, 1 now)", code, body)
	}
	s2.post("/v1/check", `{"tenant":"acme","user":"ann"}`)
	code, h, body := s2.post("/v1/check", `{"tenant":"acme","user":"ann"}`)
	if code != 429 || body["allowed"] != false || h.Get("Retry-After") == "" {
		t.Fatalf("sixth request: %d %v", code, body)
	}
	if m := s2.get("/metrics"); !strings.Contains(m, `sluice_checks_total{api="http",mode="normal",result="denied",rule="per-user",state="hard"} 1`) {
		t.Errorf("metrics lack the denial:\n%s", grepLines(m, "sluice_"))
	}
}

func TestReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 1, period: 1h}\n")
	s := start(t, path, filepath.Join(dir, "data"))
	v1 := s.policyVersion()
	s.post("/v1/check", `{"user":"u"}`)
	if code, _, _ := s.post("/v1/check", `{"user":"u"}`); code != 429 {
		t.Fatalf("second request at limit 1: %d", code)
	}

	// A good edit is picked up by the file watcher, keeping the count.
	writeFile(t, path, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 3, period: 1h}\n")
	v2 := waitVersionChange(t, s, v1)
	if code, _, body := s.post("/v1/check", `{"user":"u"}`); code != 200 || body["remaining"] != 1.0 {
		t.Fatalf("after raising to 3: %d %v", code, body)
	}

	// A bad edit is refused: the running policy stays, and the failure is logged and counted.
	writeFile(t, path, "rules:\n  - {name: r, key: [user], limit: -1, period: 1h}\n")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.get("/metrics"), `sluice_policy_reloads_total{result="error"}`) {
		if time.Now().After(deadline) {
			t.Fatal("bad policy not counted in sluice_policy_reloads_total within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := s.policyVersion(); v != v2 {
		t.Fatalf("version %s after a bad reload, want %s kept", v, v2)
	}
	if !strings.Contains(s.log.String(), "rules[0].limit: must be from 1") {
		t.Errorf("log does not name the bad field:\n%s", s.log)
	}

	// SIGHUP reloads too.
	os.WriteFile(path, []byte("rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 10, period: 1h}\n"), 0o644)
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitVersionChange(t, s, v2)
}

func waitVersionChange(t *testing.T, s *server, from string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if v := s.policyVersion(); v != from && v != "" {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("policy version stayed %s for 10 s", from)
	return ""
}

func TestGRPC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "native.yaml"), nativePolicy)
	writeFile(t, filepath.Join(dir, "envoy.yaml"), envoyPolicy)
	s := start(t, dir, filepath.Join(dir, "data"), "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	native := sluicev1.NewRateLimiterClient(conn)
	resp, err := native.Check(ctx, &sluicev1.CheckRequest{Tenant: "acme", User: "bo"})
	if err != nil || !resp.Allowed || resp.Remaining != 4 || resp.Rule != "per-user" {
		t.Fatalf("sluice.v1 Check: %v %v", resp, err)
	}
	if _, err := native.Check(ctx, &sluicev1.CheckRequest{User: "bo", Ip: "nope"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad ip: %v, want InvalidArgument", err)
	}

	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}},
	}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		out, err := rls.ShouldRateLimit(ctx, req)
		if err != nil || out.OverallCode != want {
			t.Fatalf("RLS call %d: %v %v, want %v", i, out, err, want)
		}
		if st := out.Statuses[0]; st.CurrentLimit.GetName() != "per-ip" || st.CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("RLS status: %v", st)
		}
		if len(out.ResponseHeadersToAdd) == 0 {
			t.Fatalf("RLS call %d: no response headers with LIMIT_RESPONSE_HEADERS_ENABLED=true", i)
		}
	}
	whitelisted := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: "/health"}}},
	}}
	if out, err := rls.ShouldRateLimit(ctx, whitelisted); err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[0].CurrentLimit != nil {
		t.Fatalf("whitelisted: %v %v", out, err)
	}
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: ""}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty domain: %v", err)
	}
}

func TestBuiltInPolicyAndCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := start(t, "", filepath.Join(dir, "data"))
	code, _, body := s.post("/v1/check", `{"user":"new-user","endpoint":"/","method":"GET"}`)
	if code != 200 || body["allowed"] != true || len(body["results"].([]any)) < 2 {
		t.Fatalf("built-in policy: %d %v", code, body)
	}
	out, err := exec.Command(binary, "check", "--server", "http://"+s.http, "--user", "cli", "--cost", "0").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ALLOWED") {
		t.Fatalf("sluice check: %v\n%s", err, out)
	}
	cmd := exec.Command(binary, "check", "--server", "http://"+s.http, "--user", "cli", "--cost", "500")
	out, err = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.HasPrefix(string(out), "DENIED") {
		t.Fatalf("sluice check over capacity: exit %d %v\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	writeFile(t, good, nativePolicy)
	writeFile(t, bad, "rules:\n  - name: a\n    limit: 5\n    perod: 1s\n")
	if out, err := exec.Command(binary, "config", "validate", good).CombinedOutput(); err != nil || !strings.Contains(string(out), "ok (2 rules") {
		t.Fatalf("validate good: %v %s", err, out)
	}
	out, err := exec.Command(binary, "config", "validate", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), bad+":4: rules[0].perod: unknown field") {
		t.Fatalf("validate bad: %v %s", err, out)
	}
	if out, err := exec.Command(binary, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "sluice ") {
		t.Fatalf("version: %v %s", err, out)
	}
}

// TestServeRejectsBadFlags checks that serve refuses a bad setting with an error naming the
// flag, before it listens.
func TestServeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ flag, want string }{
		{"--grpc-workers=0", "--grpc-workers"},
		{"--grpc-workers=-5", "--grpc-workers"},
		{"--grpc-workers=100000", "--grpc-workers"},
		{"--log-format=xml", "--log-format"},
		{"--control=mysql://u:pw@db/x", "--control"},
		{"--audit-retention=0", "--audit-retention"},
		{"--violations-retention=soon", "--violations-retention"},
	} {
		// A serve that accepted the flag would run until killed: the deadline turns that into
		// a failure rather than a hang.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, binary, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir(), c.flag)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("serve %s: %v, output %q; want a failure naming %s", c.flag, err, out, c.want)
		}
		if strings.Contains(string(out), ":pw@") {
			t.Errorf("serve %s: the output shows the password: %q", c.flag, out)
		}
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
