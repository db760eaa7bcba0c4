package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/key"
)

// abuseIdentityPolicy limits Envoy requests per API key and per client address: 10 an hour
// each, 1 under the detector's penalty (multiplier 0.1).
const abuseIdentityPolicy = `
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-key}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-ip}
`

// TestAbuseDetectorPenalizesRLSKeysAndIPs (issue 27): through the binary, RLS traffic from
// one API key, and from one address, far over its limit gets each an automatic override
// (the key by its hash, the address by itself) that every later RLS request of theirs meets:
// current_limit 1 and OVER_LIMIT. A calm key and a calm address keep their limit of 10.
func TestAbuseDetectorPenalizesRLSKeysAndIPs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "envoy.yaml"), abuseIdentityPolicy)
	s := start(t, dir, filepath.Join(dir, "data"), "SLUICE_ADMIN_TOKEN="+e2eAdminToken, "SLUICE_EVENTS_FLUSH=200ms",
		"ABUSE_INTERVAL=1s", "ABUSE_WINDOW=1m", "ABUSE_MIN_REQUESTS=20", "ABUSE_PENALTY=10m")
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	// call sends one RLS request of one descriptor and returns its code and current_limit.
	call := func(k, v string) (over bool, limit uint32) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: v}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if cl := out.Statuses[0].CurrentLimit; cl != nil {
			limit = cl.RequestsPerUnit
		}
		return out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT, limit
	}
	const noisyKey, calmKey, noisyIP, calmIP = "sk-noisy", "sk-calm", "198.51.100.7", "198.51.100.8"
	// 300 each from the noisy: 290 denied of at least 300 + the 10 the calm send (over 90%).
	for range 300 {
		call("api_key", noisyKey)
		call("remote_address", noisyIP)
	}
	for range 5 {
		for _, c := range [][2]string{{"api_key", calmKey}, {"remote_address", calmIP}} {
			if over, _ := call(c[0], c[1]); over {
				t.Fatalf("calm %s %s refused", c[0], c[1])
			}
		}
	}
	var last string
	defer func() {
		if t.Failed() {
			_, m := s.admin("GET", "/admin/v1/overrides", "")
			t.Logf("last answers: %s; overrides %v", last, m)
		}
	}()
	took := waitFor(t, 30*time.Second, "the noisy key's and address's penalties enforced on RLS", func() bool {
		overK, limK := call("api_key", noisyKey)
		overI, limI := call("remote_address", noisyIP)
		last = fmt.Sprintf("key: over %v limit %d; address: over %v limit %d", overK, limK, overI, limI)
		return overK && limK == 1 && overI && limI == 1
	})
	t.Logf("penalties enforced %v after the traffic", took)
	for _, c := range [][2]string{{"api_key", calmKey}, {"remote_address", calmIP}} {
		if over, limit := call(c[0], c[1]); over || limit != 10 {
			t.Errorf("calm %s %s: over %v, current_limit %d; want allowed under 10 (not penalized)", c[0], c[1], over, limit)
		}
	}
	code, m := s.admin("GET", "/admin/v1/overrides?source=automatic", "")
	list, _ := m["overrides"].([]any)
	targets := map[string]bool{}
	for _, o := range list {
		o, _ := o.(map[string]any)
		if o["created_by"] != "abuse-detector" || o["type"] != "multiplier" || o["value"] != 0.1 {
			t.Errorf("automatic override %v", o)
		}
		h, _ := o["api_key_hash"].(string)
		ip, _ := o["ip"].(string)
		targets[h+ip] = true
	}
	want := map[string]bool{key.HashedAPIKey(noisyKey): true, noisyIP: true}
	if code != 200 || len(targets) != len(want) || !targets[key.HashedAPIKey(noisyKey)] || !targets[noisyIP] {
		t.Errorf("automatic overrides (%d): %v, want exactly %v", code, targets, want)
	}
}
