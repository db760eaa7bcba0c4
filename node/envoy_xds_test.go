package node

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testkit/testca"
	"github.com/sluicehq/sluice/internal/testkit/xdstest"
)

// TestReadEnvoyXDS: CONFIG_TYPE=GRPC_XDS_SOTW and the CONFIG_GRPC_XDS_* variables set the
// --envoy-xds flags and drop the RUNTIME_ROOT folder; bad values are errors naming the
// variable.
func TestReadEnvoyXDS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vars map[string]string
		want map[string]string // flag → value
		err  string
	}{
		{name: "file config", vars: map[string]string{"CONFIG_TYPE": "FILE", "RUNTIME_ROOT": "/data"}, want: map[string]string{"config": "/data/config"}},
		{name: "xds variables ignored without CONFIG_TYPE", vars: map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "cp:18000"}, want: map[string]string{}},
		{name: "xds with the reference's defaults", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "RUNTIME_ROOT": "/data"},
			want: map[string]string{"envoy-xds": "localhost:18000"}},
		{name: "xds in full", vars: map[string]string{
			"CONFIG_TYPE": "grpc_xds_sotw", "CONFIG_GRPC_XDS_SERVER_URL": "cp:18000", "CONFIG_GRPC_XDS_NODE_ID": "rl-1",
			"CONFIG_GRPC_XDS_NODE_METADATA": "zone=a,team:edge", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "500ms",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/ca.pem",
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/c.pem", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/k.pem",
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN": "cp.internal", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
			"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer t0k", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "8388608",
		}, want: map[string]string{
			"envoy-xds-headers": "authorization:Bearer t0k", "envoy-xds-max-message": "8388608",
			"envoy-xds": "cp:18000", "envoy-xds-node-id": "rl-1", "envoy-xds-node-metadata": "zone=a,team:edge",
			"envoy-xds-retry": "500ms", "envoy-xds-tls": "true", "envoy-xds-ca": "/ca.pem", "envoy-xds-cert": "/c.pem",
			"envoy-xds-key": "/k.pem", "envoy-xds-san": "cp.internal", "envoy-xds-force-start": "true",
		}},
		{name: "later backoff settings", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "60s", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.5", "XDS_CLIENT_BACKOFF_JITTER": "true"},
			want: map[string]string{"envoy-xds": "localhost:18000", "envoy-xds-retry": "10s", "envoy-xds-retry-max": "60s"}},
		{name: "connect retry interval wins over the initial backoff", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "2s", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10s"},
			want: map[string]string{"envoy-xds": "localhost:18000", "envoy-xds-retry": "2s"}},
		{name: "bad backoff max", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "soon"}, err: "XDS_CLIENT_BACKOFF_MAX_INTERVAL"},
		{name: "other random factor", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.2"}, err: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR: \"0.2\": only 0.5"},
		{name: "jitter off", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_JITTER": "false"}, err: "XDS_CLIENT_BACKOFF_JITTER"},
		{name: "bad config type", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_DELTA"}, err: `CONFIG_TYPE: "GRPC_XDS_DELTA" is not FILE or GRPC_XDS_SOTW`},
		{name: "bad retry", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3"}, err: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"},
		{name: "bad tls switch", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "sure"}, err: "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{name: "bad headers", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": ":x"}, err: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{name: "bad max message", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "4MB"}, err: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"},
		{name: "bad metadata", vars: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA": "zone"}, err: "CONFIG_GRPC_XDS_NODE_METADATA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := readEnvoyEnv(env(tc.vars))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, d := range s.defaults {
				got[d.Flag] = d.Value
			}
			if len(got) != len(tc.want) {
				t.Errorf("flags %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("--%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			// The flags take every value (a value a flag refuses would stop serve).
			cmd := &cobra.Command{Use: "serve"}
			var c Config
			c.RegisterFlags(cmd)
			if err := applyEnvoyEnv(cmd.Flags(), s, env(nil)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEnvoyXDSRefusesBadSettings: settings openPolicySource cannot use stop New with an error
// naming the flag, before anything is dialled.
func TestEnvoyXDSRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--envoy-xds", "127.0.0.1:1", "--config", "policy.yaml"}, "--envoy-xds: the configuration comes from the xDS server"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-node-metadata", "=x"}, "--envoy-xds-node-metadata"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-retry", "0s"}, "--envoy-xds-retry"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-headers", "token"}, "--envoy-xds-headers"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-retry-max", "-1s"}, "--envoy-xds-retry-max"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-max-message", "-1"}, "--envoy-xds-max-message"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-ca", "/ca.pem"}, "--envoy-xds-ca: needs --envoy-xds-tls"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-tls", "--envoy-xds-ca", "/nonexistent/ca.pem"}, "--envoy-xds-ca"},
		{[]string{"--envoy-xds", "127.0.0.1:1", "--envoy-xds-tls", "--envoy-xds-cert", "/c.pem"}, "--envoy-xds-cert: needs --envoy-xds-key"},
	} {
		t.Run(tc.err, func(t *testing.T) {
			_, err := New(t.Context(), testConfig(t, tc.args...))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("New: %v, want an error naming %q", err, tc.err)
			}
		})
	}
}

// within is how long a test waits for what should happen at once: wide, for a loaded
// machine; the figures are in docs/measurements.md.
const within = 20 * time.Second

// rlsLimit asks the node over RLS for domain edge, path=/a and returns the requests_per_unit
// of the limit in force, or 0 when none applies.
func rlsLimit(t *testing.T, client rlsv3.RateLimitServiceClient) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/a"}}},
	}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// TestNodeFromXDS runs a node whose Envoy domains come from go-control-plane's own xDS
// server, checked by RLS calls: New waits for the first configuration, which is then
// enforced; an update is enforced soon after the push; an invalid one is NACKed and the old
// one stays; with the server stopped the last configuration stays; the restarted server's new
// snapshot is taken.
func TestNodeFromXDS(t *testing.T) {
	srv := xdstest.Start(t)
	const node = "sluice-node"
	c := testConfig(t, "--envoy-xds", srv.Addr, "--envoy-xds-node-id", node, "--envoy-xds-retry", "50ms")

	type built struct {
		n   *Node
		err error
	}
	done := make(chan built, 1)
	go func() { n, err := New(t.Context(), c); done <- built{n, err} }()
	select {
	case b := <-done:
		t.Fatalf("New returned before the xDS server had a configuration: %v", b.err)
	case <-time.After(300 * time.Millisecond):
	}
	srv.Set(node, "v1", xdstest.Config("edge", "edge", 10, [2]string{"path", "/a"}))
	var n *Node
	select {
	case b := <-done:
		if b.err != nil {
			t.Fatal(b.err)
		}
		n = b.n
	case <-time.After(within):
		t.Fatalf("New still waiting %v after the first configuration", within)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() { cancel(); <-ran; n.Close() }()

	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client); got != 10 {
		t.Fatalf("first configuration: limit %d, want 10", got)
	}
	enforced := func(what string, want uint32) {
		t.Helper()
		start := time.Now()
		for got := rlsLimit(t, client); got != want; got = rlsLimit(t, client) {
			if time.Since(start) > within {
				t.Fatalf("%s: limit %d %v after the push, want %d", what, got, within, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s enforced %v after the push", what, time.Since(start))
	}

	srv.Set(node, "v2", xdstest.Config("edge", "edge", 20, [2]string{"path", "/a"}))
	enforced("update v2", 20)

	bad := xdstest.Config("edge", "edge", 30, [2]string{"path", "/a"})
	bad.Descriptors[0].RateLimit.Unit = rlsconfpb.RateLimitUnit_UNKNOWN
	srv.Set(node, "v3-bad", bad)
	deadline := time.Now().Add(within)
	for !nacked(srv, "v2", "rate_limit.unit") {
		if time.Now().After(deadline) {
			t.Fatalf("no NACK of v3-bad keeping v2 within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := rlsLimit(t, client); got != 20 {
		t.Fatalf("after the NACK: limit %d, want v2's 20", got)
	}

	srv.Stop()
	time.Sleep(300 * time.Millisecond) // several attempts to reconnect fail meanwhile
	if got := rlsLimit(t, client); got != 20 {
		t.Fatalf("with the xDS server away: limit %d, want v2's 20", got)
	}

	srv.Restart()
	srv.Set(node, "v4", xdstest.Config("edge", "edge", 40, [2]string{"path", "/a"}))
	enforced("v4 from the restarted server", 40)
}

// nacked reports whether the server received a NACK that keeps version and names field.
func nacked(srv *xdstest.Server, version, field string) bool {
	for _, r := range srv.Requests() {
		if r.GetErrorDetail() != nil && r.GetVersionInfo() == version && strings.Contains(r.GetErrorDetail().GetMessage(), field) {
			return true
		}
	}
	return false
}

// TestNodeFromXDSForceStart: with --envoy-xds-force-start the node serves before the server
// has a configuration, with no Envoy domains, and takes the first one when it comes.
func TestNodeFromXDSForceStart(t *testing.T) {
	srv := xdstest.Start(t)
	c := testConfig(t, "--envoy-xds", srv.Addr, "--envoy-xds-retry", "50ms", "--envoy-xds-force-start")
	n, err := New(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() { cancel(); <-ran; n.Close() }()
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client); got != 0 {
		t.Fatalf("before any configuration: limit %d, want none", got)
	}
	srv.Set(envoyDefaultXDSNodeID, "v1", xdstest.Config("edge", "edge", 7, [2]string{"path", "/a"}))
	deadline := time.Now().Add(within)
	for got := rlsLimit(t, client); got != 7; got = rlsLimit(t, client) {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d %v after the first push, want 7", got, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNodeFromXDSOverTLS: with --envoy-xds-tls the node reaches a server that requires a
// client certificate, verifying the server's against --envoy-xds-ca under the name
// --envoy-xds-san (the address is an IP; the name is localhost).
func TestNodeFromXDSOverTLS(t *testing.T) {
	ca := testca.New(t, "xds-ca")
	dir := t.TempDir()
	serverPair := ca.Server(t, "xds-server")
	cert, err := tls.X509KeyPair(serverPair.CertPEM, serverPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdstest.StartTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	srv.Set(envoyDefaultXDSNodeID, "v1", xdstest.Config("edge", "edge", 9, [2]string{"path", "/a"}))
	clientCert, clientKey := ca.Client(t, "sluice").Files(t, dir, "client")
	c := testConfig(t, "--envoy-xds", srv.Addr, "--envoy-xds-retry", "50ms", "--envoy-xds-tls",
		"--envoy-xds-ca", ca.File(t, dir, "ca.pem"), "--envoy-xds-cert", clientCert, "--envoy-xds-key", clientKey,
		"--envoy-xds-san", "localhost")
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	n, err := New(ctx, c)
	if err != nil {
		t.Fatalf("New over TLS: %v", err)
	}
	runCtx, stop := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(runCtx) }()
	defer func() { stop(); <-ran; n.Close() }()
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := rlsLimit(t, rlsv3.NewRateLimitServiceClient(conn)); got != 9 {
		t.Fatalf("limit %d, want the TLS server's 9", got)
	}
}

// TestEnvoyXDSFlagVariables: the xDS flags with a plain default read their SLUICE_*
// variables, and a bad value stops serve naming the variable.
func TestEnvoyXDSFlagVariables(t *testing.T) {
	for _, tc := range []struct{ env, flag string }{
		{"SLUICE_ENVOY_XDS_RETRY", "envoy-xds-retry"},
		{"SLUICE_ENVOY_XDS_RETRY_MAX", "envoy-xds-retry-max"},
		{"SLUICE_ENVOY_XDS_MAX_MESSAGE", "envoy-xds-max-message"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, "soon")
			cmd := &cobra.Command{Use: "serve"}
			var c Config
			c.RegisterFlags(cmd)
			if err := c.ReadEnv(cmd.Flags()); err == nil || !strings.Contains(err.Error(), tc.env) {
				t.Fatalf("ReadEnv with %s=soon: %v, want an error naming it", tc.env, err)
			}
		})
	}
	t.Setenv("SLUICE_ENVOY_XDS_RETRY_MAX", "90s")
	cmd := &cobra.Command{Use: "serve"}
	var c Config
	c.RegisterFlags(cmd)
	if err := c.ReadEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	if c.xds.retryMax != 90*time.Second {
		t.Fatalf("--envoy-xds-retry-max = %v, want SLUICE_ENVOY_XDS_RETRY_MAX's 90s", c.xds.retryMax)
	}
}
