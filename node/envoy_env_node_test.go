package node

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/testkit/oteltest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testca"
)

// envoyTestConfig is testConfig with the reference service's variables vars, read as serve
// reads them from the environment (without touching the process's, so tests stay parallel).
func envoyTestConfig(t *testing.T, vars map[string]string, args ...string) Config {
	t.Helper()
	cmd := &cobra.Command{Use: "serve"}
	c := Config{Version: "test"}
	c.RegisterFlags(cmd)
	base := []string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"), "--log-level", "error"}
	if err := cmd.Flags().Parse(append(base, args...)); err != nil {
		t.Fatal(err)
	}
	s, err := readEnvoyEnv(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	c.envoy = s
	if err := applyEnvoyEnv(cmd.Flags(), s, env(vars)); err != nil {
		t.Fatal(err)
	}
	return c
}

// runNode starts a node of c and stops it when the test ends.
func runNode(t *testing.T, c Config) *Node {
	t.Helper()
	n, err := New(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		n.Close()
	})
	return n
}

// runtimeDir writes files into RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, the reference's
// layout, and returns the variables that name it.
func runtimeDir(t *testing.T, files map[string]string) map[string]string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit"}
}

// with returns vars with more added.
func with(vars map[string]string, more ...string) map[string]string {
	out := map[string]string{}
	for k, v := range vars {
		out[k] = v
	}
	for i := 0; i+1 < len(more); i += 2 {
		out[more[i]] = more[i+1]
	}
	return out
}

const edgeConfig = `domain: edge
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: per_day
    rate_limit: {unit: day, requests_per_unit: 100}
`

// shouldRateLimit sends one RLS request for each descriptor key=value given.
func shouldRateLimit(ctx context.Context, conn *grpc.ClientConn, kv ...string) (*rlsv3.RateLimitResponse, error) {
	req := &rlsv3.RateLimitRequest{Domain: "edge"}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: kv[i], Value: kv[i+1]}}})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// redisKeys lists every key the Redis at addr holds.
func redisKeys(t *testing.T, addr string) []string {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys, err := c.Do(t.Context(), c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// dbSize is how many keys srv holds, expired ones not yet deleted included.
func dbSize(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	v, err := srv.Do("DBSIZE")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("DBSIZE: %q", v)
	}
	return n
}

// bucketKeys are the keys of keys that hold a bucket of the descriptor key name.
func bucketKeys(keys []string, name string) []string {
	var out []string
	for _, k := range keys {
		if strings.Contains(k, name) {
			out = append(out, k)
		}
	}
	return out
}

// TestEnvoyGRPCTLS: GRPC_SERVER_USE_TLS serves RLS over TLS on the gRPC listener (a plaintext
// call fails, HTTP stays plaintext as there); GRPC_CLIENT_TLS_CACERT requires a client
// certificate from that CA; GRPC_CLIENT_TLS_SAN requires it to name the SAN.
func TestEnvoyGRPCTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCA, clientCA := testca.New(t, "server CA"), testca.New(t, "client CA")
	certFile, keyFile := serverCA.Server(t, "sluice").Files(t, dir, "server")
	clientCAFile := clientCA.File(t, dir, "client-ca.pem")
	clientPair := clientCA.Client(t, "envoy")
	clientCert, err := tls.X509KeyPair(clientPair.CertPEM, clientPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	strangerPair := testca.New(t, "another CA").Client(t, "stranger")
	stranger, err := tls.X509KeyPair(strangerPair.CertPEM, strangerPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	policy := runtimeDir(t, map[string]string{"edge.yaml": edgeConfig})
	tlsOn := with(policy, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", certFile, "GRPC_SERVER_TLS_KEY", keyFile)
	trusting := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: serverCA.Pool(), Certificates: certs, MinVersion: tls.VersionTLS12})
	}
	type call struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}
	for _, tc := range []struct {
		name  string
		vars  map[string]string
		calls []call
	}{
		{"tls", tlsOn, []call{
			{"over TLS", trusting(), true},
			{"plaintext", insecure.NewCredentials(), false},
		}},
		{"mutual tls", with(tlsOn, "GRPC_CLIENT_TLS_CACERT", clientCAFile), []call{
			{"client certificate from the CA", trusting(clientCert), true},
			{"no client certificate", trusting(), false},
			{"client certificate from another CA", trusting(stranger), false},
			{"plaintext", insecure.NewCredentials(), false},
		}},
		{"mutual tls with the client's SAN", with(tlsOn, "GRPC_CLIENT_TLS_CACERT", clientCAFile, "GRPC_CLIENT_TLS_SAN", "localhost"), []call{
			{"client certificate naming it", trusting(clientCert), true},
		}},
		{"mutual tls with another SAN", with(tlsOn, "GRPC_CLIENT_TLS_CACERT", clientCAFile, "GRPC_CLIENT_TLS_SAN", "envoy.mesh.internal"), []call{
			{"client certificate not naming it", trusting(clientCert), false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := runNode(t, envoyTestConfig(t, tc.vars))
			for _, c := range tc.calls {
				resp, err := shouldRateLimit(t.Context(), dial(t, n.GRPCAddr(), c.creds), "per_second", "a")
				if c.ok && (err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK) {
					t.Errorf("%s: %v, %v; want OK", c.name, resp, err)
				}
				if !c.ok && err == nil {
					t.Errorf("%s: answered %v; want the call refused", c.name, resp)
				}
			}
			// HTTP is not the reference's gRPC listener: it stays plaintext.
			resp, err := http.Get("http://" + n.HTTPAddr() + "/healthcheck")
			if err != nil {
				t.Fatalf("plaintext /healthcheck: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/healthcheck: %d", resp.StatusCode)
			}
		})
	}
}

// TestEnvoyPerSecondRedis: with REDIS_PERSECOND, per-second limits land on the second Redis
// and the others on the first; CACHE_KEY_PREFIX starts every key on both.
func TestEnvoyPerSecondRedis(t *testing.T) {
	t.Parallel()
	// A per-second bucket expires at the end of its second, which a loaded machine may pass
	// before the test looks. With active expiry off, an expired key stays counted by DBSIZE
	// (KEYS hides it): each server's DBSIZE tells what landed there, whenever it is read.
	start := func() *redistest.Server {
		srv := redistest.Start(t, redistest.WithConfig("enable-debug-command local"))
		if _, err := srv.Do("DEBUG", "SET-ACTIVE-EXPIRE", "0"); err != nil {
			t.Fatal(err)
		}
		return srv
	}
	main, perSecond := start(), start()
	vars := with(runtimeDir(t, map[string]string{"edge.yaml": edgeConfig}),
		"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", main.Addr,
		"REDIS_PERSECOND", "true", "REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", perSecond.Addr,
		"CACHE_KEY_PREFIX", "rl-prod_")
	n := runNode(t, envoyTestConfig(t, vars))
	conn := dial(t, n.GRPCAddr(), insecure.NewCredentials())
	for range 3 {
		resp, err := shouldRateLimit(t.Context(), conn, "per_second", "a", "per_day", "b")
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%v, %v", resp, err)
		}
	}
	mainKeys, secondKeys := redisKeys(t, main.Addr), redisKeys(t, perSecond.Addr)
	t.Logf("main %q, per-second %q", mainKeys, secondKeys)
	if len(bucketKeys(mainKeys, "per_day")) != 1 || dbSize(t, main) != 1 {
		t.Errorf("main Redis holds %q, %d keys in all; want the per-day bucket alone", mainKeys, dbSize(t, main))
	}
	if len(bucketKeys(secondKeys, "per_day")) != 0 || dbSize(t, perSecond) != 1 {
		t.Errorf("per-second Redis holds %q, %d keys in all; want the per-second bucket alone", secondKeys, dbSize(t, perSecond))
	}
	for _, k := range append(bucketKeys(mainKeys, "per_"), bucketKeys(secondKeys, "per_")...) {
		if !strings.HasPrefix(k, "rl-prod_") {
			t.Errorf("key %q does not start with CACHE_KEY_PREFIX", k)
		}
	}
}

// TestEnvoyMergeDomainConfig: two files of one domain stop the start unless
// MERGE_DOMAIN_CONFIG=true, which merges them: both files' limits apply.
func TestEnvoyMergeDomainConfig(t *testing.T) {
	t.Parallel()
	policy := runtimeDir(t, map[string]string{
		// Hours and days: two calls cannot straddle a window's end but at its hour.
		"a.yaml": "domain: edge\ndescriptors:\n  - key: per_hour\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		"b.yaml": "domain: edge\ndescriptors:\n  - key: per_day\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
	})
	if _, err := New(t.Context(), envoyTestConfig(t, policy)); err == nil || !strings.Contains(err.Error(), "edge") {
		t.Fatalf("without MERGE_DOMAIN_CONFIG: err = %v, want the domain in two files refused", err)
	}
	n := runNode(t, envoyTestConfig(t, with(policy, "MERGE_DOMAIN_CONFIG", "true")))
	conn := dial(t, n.GRPCAddr(), insecure.NewCredentials())
	for _, key := range []string{"per_hour", "per_day"} {
		first, err := shouldRateLimit(t.Context(), conn, key, "x")
		if err != nil {
			t.Fatal(err)
		}
		second, err := shouldRateLimit(t.Context(), conn, key, "x")
		if err != nil {
			t.Fatal(err)
		}
		if first.OverallCode != rlsv3.RateLimitResponse_OK || second.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s (limit 1): %v then %v; want OK then OVER_LIMIT, the file's limit applied", key, first.OverallCode, second.OverallCode)
		}
	}
}

// TestEnvoyExtraListeners: DEBUG_PORT serves Go's profiles and USE_PROMETHEUS the metrics at
// PROMETHEUS_PATH, each on its own listener; REDIS_HEALTH_CHECK_ACTIVE_CONNECTION makes
// /healthcheck fail while the store does not answer.
func TestEnvoyExtraListeners(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	n := runNode(t, envoyTestConfig(t, map[string]string{
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_PATH": "/stats/prometheus",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true",
	}))
	get := func(url string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, body := get("http://" + n.DebugAddr() + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("debug listener: %d %.80q", code, body)
	}
	if code, body := get("http://" + n.PrometheusAddr() + "/stats/prometheus"); code != http.StatusOK || !strings.Contains(body, "sluice_") {
		t.Errorf("prometheus listener: %d %.80q", code, body)
	}
	if code, _ := get("http://" + n.HTTPAddr() + "/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck with Redis up: %d", code)
	}
	health := healthpb.NewHealthClient(dial(t, n.GRPCAddr(), insecure.NewCredentials()))
	grpcHealth := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("grpc health: %v", err)
		}
		return resp.Status
	}
	srv.Pause()
	defer srv.Resume()
	if code, _ := get("http://" + n.HTTPAddr() + "/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck with Redis paused: %d, want 500", code)
	}
	// The gRPC health service follows the store within a few of its 1 s looks.
	waitFor(t, 30*time.Second, func() bool { return grpcHealth() == healthpb.HealthCheckResponse_NOT_SERVING })
	srv.Resume()
	waitFor(t, 30*time.Second, func() bool { return grpcHealth() == healthpb.HealthCheckResponse_SERVING })
}

// waitFor polls cond until it holds, or fails the test after limit (wide: a loaded machine).
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %v", limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEnvoyTracing: TRACING_ENABLED with the gRPC exporter and TRACING_SAMPLING_RATE=1 traces
// every RLS call (Sluice's own default samples 1%), to the collector --otlp-endpoint names.
func TestEnvoyTracing(t *testing.T) {
	t.Parallel()
	recv := oteltest.Start(t)
	vars := with(runtimeDir(t, map[string]string{"edge.yaml": edgeConfig}),
		"TRACING_ENABLED", "true", "TRACING_EXPORTER_PROTOCOL", "grpc", "TRACING_SAMPLING_RATE", "1")
	n, err := New(t.Context(), envoyTestConfig(t, vars, "--otlp-endpoint", "http://"+recv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	conn := dial(t, n.GRPCAddr(), insecure.NewCredentials())
	const calls = 5
	for range calls {
		if _, err := shouldRateLimit(t.Context(), conn, "per_day", "x"); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	n.Close() // flushes the spans
	if got := len(recv.Spans()); got < calls {
		t.Fatalf("%d spans arrived for %d calls; want every call traced", got, calls)
	}
}

// TestEnvoyStoreErrors: settings that need a Redis store stop the start naming the variable
// when the store is memory; CACHE_KEY_PREFIX reaches a --store URL given as a flag too.
func TestEnvoyStoreErrors(t *testing.T) {
	t.Parallel()
	c := envoyTestConfig(t, map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "127.0.0.1:1"})
	if _, err := New(t.Context(), c); err == nil || !strings.Contains(err.Error(), "REDIS_PERSECOND") {
		t.Fatalf("per-second Redis beside the memory store: err = %v, want it named", err)
	}
	for _, tc := range []struct{ in, prefix, want string }{
		{"redis://r:6379", "p_", "redis://r:6379?key_prefix=p_"},
		{"redis-cluster://a:1,b:2?tls=true", "p_", "redis-cluster://a:1,b:2?key_prefix=p_&tls=true"},
		{"redis://r:6379?key_prefix=mine", "p_", "redis://r:6379?key_prefix=mine"}, // the URL's own wins
		{"redis://r:6379", "", "redis://r:6379"},
		{"memory", "p_", "memory"},
	} {
		got, err := withKeyPrefix(tc.in, tc.prefix)
		if err != nil || got != tc.want {
			t.Errorf("withKeyPrefix(%q, %q) = %q, %v; want %q", tc.in, tc.prefix, got, err, tc.want)
		}
	}
}

// TestEnvoyMaxConnectionAge: GRPC_MAX_CONNECTION_AGE closes a client's connection with a
// GOAWAY once it is that old, so the client leaves READY (and reconnects on its next call).
func TestEnvoyMaxConnectionAge(t *testing.T) {
	t.Parallel()
	vars := with(runtimeDir(t, map[string]string{"edge.yaml": edgeConfig}), "GRPC_MAX_CONNECTION_AGE", "500ms", "GRPC_MAX_CONNECTION_AGE_GRACE", "500ms")
	n := runNode(t, envoyTestConfig(t, vars))
	conn := dial(t, n.GRPCAddr(), insecure.NewCredentials())
	if _, err := shouldRateLimit(t.Context(), conn, "per_day", "x"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for conn.GetState() == connectivity.Ready {
		if !conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("the connection was still READY after 30 s; want it closed at its age")
		}
	}
	if _, err := shouldRateLimit(t.Context(), conn, "per_day", "x"); err != nil {
		t.Fatalf("a call after the GOAWAY: %v", err)
	}
}
