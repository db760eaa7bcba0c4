package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestEnvoyReferenceEnv runs sluice with a deployment's environment for Envoy's reference
// service: the policy folder from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, SHADOW_MODE
// (nothing denied, everything reported), LIMIT_*_HEADER names on RLS answers, LOG_LEVEL; and
// GRPC_HOST/PORT, which the --grpc and --http flags of the test override.
func TestEnvoyReferenceEnv(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cfgDir, "native.yaml"), nativePolicy)
	writeFile(t, filepath.Join(cfgDir, "envoy.yaml"), envoyPolicy)
	s := start(t, "", filepath.Join(root, "data"),
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit",
		"SHADOW_MODE=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left", "LIMIT_LIMIT_HEADER=X-Limit", "LIMIT_RESET_HEADER=X-Reset",
		"LOG_LEVEL=DEBUG",
		// Not a listen address anyone could take: the flags win, or start fails.
		"GRPC_HOST=192.0.2.1", "GRPC_PORT=1", "HOST=192.0.2.1", "PORT=1",
	)

	// The native policy from the runtime folder allows 5 per user: the 6th and 7th are over,
	// reported as shadow, and allowed.
	for i := range 7 {
		code, _, body := s.post("/v1/check", `{"tenant":"acme","user":"ann"}`)
		over := i >= 5
		if code != 200 || body["allowed"] != true || (body["shadow"] == true) != over {
			t.Fatalf("check %d under SHADOW_MODE: %d %v", i, code, body)
		}
	}

	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}},
	}}
	for i := range 3 {
		out, err := rls.ShouldRateLimit(ctx, req)
		if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("RLS call %d of a limit of 2 under SHADOW_MODE: %v %v", i, out, err)
		}
		headers := map[string]string{}
		for _, h := range out.ResponseHeadersToAdd {
			headers[h.Key] = h.Value
		}
		if headers["X-Limit"] != "2" || headers["X-Left"] == "" || headers["X-Reset"] == "" {
			t.Fatalf("RLS call %d: headers %v, want X-Limit, X-Left and X-Reset", i, headers)
		}
	}
	if m := s.get("/metrics"); !strings.Contains(m, `mode="shadow"`) {
		t.Errorf("no shadow decisions in the metrics:\n%s", grepLines(m, "sluice_checks_total"))
	}
	if !strings.Contains(s.log.String(), ratelimitRuntime(root)) {
		t.Errorf("the log does not name the policy folder %s:\n%s", ratelimitRuntime(root), s.log)
	}
}

func ratelimitRuntime(root string) string { return filepath.Join(root, "ratelimit", "config") }
