package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyExtensionsPolicy has a limit per user with an escalation and an adaptive limit per
// client.
const envoyExtensionsPolicy = `
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 100000
      escalation: {window: 1s, threshold: 5, penalty: 5m}
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4, adaptive: trust}
`

// TestEnvoyExtensionsThroughTheBinary: over RLS, an Envoy-format limit's escalation warns and
// then bans a user that bursts (the automatic ban is an override on the limit's stat key,
// denying that user only), and adaptive: trust scales a limit by the trust the admin API
// assigns (current_limit and admissions both).
func TestEnvoyExtensionsThroughTheBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "envoy.yaml"), envoyExtensionsPolicy)
	s := start(t, dir, filepath.Join(dir, "data"), "SLUICE_ADMIN_TOKEN="+e2eAdminToken)
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	call := func(hits uint32, descs ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits}
		for i := 0; i+1 < len(descs); i += 2 {
			d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: descs[i], Value: descs[i+1]}}}
			if hits == 0 {
				d.HitsAddend = wrapperspb.UInt64(0)
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := rls.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	over := func(out *rlsv3.RateLimitResponse) bool { return out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT }

	t.Run("escalation", func(t *testing.T) {
		// Bursts of 20 requests: each crosses the threshold of 5 per second at least once
		// (one window), however slow the machine; the first warns, a later one bans.
		waitFor(t, 60*time.Second, "the bursting user is banned", func() bool {
			for range 20 {
				if over(call(1, "user", "burster")) {
					return true
				}
			}
			return false
		})
		if over(call(1, "user", "calm")) {
			t.Fatal("another user was denied")
		}
		code, m := s.admin("GET", "/admin/v1/overrides", "")
		if code != 200 {
			t.Fatalf("GET overrides: %d %v", code, m)
		}
		list, _ := m["overrides"].([]any)
		var types []string
		for _, o := range list {
			o := o.(map[string]any)
			if o["user"] == "burster" && o["rule"] == "edge.user" && o["source"] == "automatic" {
				types = append(types, o["type"].(string))
			}
		}
		if strings.Join(types, ",") != "ban" {
			t.Fatalf("automatic overrides of burster on edge.user: %v, want the ban (which replaced the warning); all: %v", types, list)
		}
	})

	t.Run("adaptive", func(t *testing.T) {
		if code, m := s.admin("PUT", "/admin/v1/identities/user/trusted", `{"trust":1}`); code != 200 {
			t.Fatalf("PUT identity: %d %v", code, m)
		}
		// The client descriptor comes first: its status is Statuses[0].
		waitFor(t, 10*time.Second, "the trust score", func() bool {
			return call(0, "client", "probe", "user", "trusted").Statuses[0].CurrentLimit.GetRequestsPerUnit() == 6
		})
		admitted := 0
		for range 10 {
			if !over(call(1, "client", "c1", "user", "trusted")) {
				admitted++
			}
		}
		if admitted != 6 {
			t.Errorf("a user of trust 1 was admitted %d times under 4 per hour × 1.5, want 6", admitted)
		}
		admitted = 0
		for range 10 {
			out := call(1, "client", "c2", "user", "untrusted")
			if got := out.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 4 {
				t.Fatalf("an untrusted user's current_limit %d, want 4", got)
			}
			if !over(out) {
				admitted++
			}
		}
		if admitted != 4 {
			t.Errorf("an untrusted user was admitted %d times, want 4", admitted)
		}
		// /json is the same pipeline.
		admitted = 0
		for range 10 {
			body := `{"domain":"edge","descriptors":[{"entries":[{"key":"client","value":"c3"}]},{"entries":[{"key":"user","value":"trusted"}]}]}`
			resp, err := http.Post("http://"+s.http+"/json", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			var out struct {
				OverallCode string `json:"overallCode"`
				Statuses    []struct {
					CurrentLimit struct {
						RequestsPerUnit uint32 `json:"requestsPerUnit"`
					} `json:"currentLimit"`
				} `json:"statuses"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || len(out.Statuses) != 2 || out.Statuses[0].CurrentLimit.RequestsPerUnit != 6 {
				t.Fatalf("/json: %d %+v %v; want current_limit 6 for the trusted user", resp.StatusCode, out, err)
			}
			if out.OverallCode == "OK" {
				admitted++
			}
		}
		if admitted != 6 {
			t.Errorf("/json: a user of trust 1 was admitted %d times, want 6", admitted)
		}
	})
}
