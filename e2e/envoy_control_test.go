package e2e

import (
	"context"
	"encoding/json"
	"fmt"
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

// envoyControlPolicy limits a tenant (whose entry is org) and a tier; the tier entry picks
// the limit.
const envoyControlPolicy = `
domain: edge
descriptors:
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 3, name: per-tenant}
  - key: tier
    value: free
    rate_limit: {unit: hour, requests_per_unit: 1, name: free-tier}
  - key: tier
    value: premium
    rate_limit: {unit: hour, requests_per_unit: 100, name: premium-tier}
`

// TestEnvoyTrafficUnderTheControlPlane: through the binary, over gRPC (RLS) and HTTP (/json),
// what the admin API sets shapes Envoy requests as it shapes native checks: a ban and an
// exemption count nothing, a multiplier and a custom limit (named by rate_limit.name and by
// stat key) change current_limit and what is admitted, an assigned tier replaces the tier a
// descriptor claims, the tenant is read from the entry --envoy-attributes names, and the
// violations of RLS traffic name the tenant.
func TestEnvoyTrafficUnderTheControlPlane(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "envoy.yaml"), envoyControlPolicy)
	s := start(t, dir, filepath.Join(dir, "data"), "SLUICE_ADMIN_TOKEN="+e2eAdminToken,
		"SLUICE_EVENTS_FLUSH=200ms", "SLUICE_ENVOY_ATTRIBUTES=tenant=org")
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	// Both wire forms, one request each time: descs are key/value pairs, each a descriptor.
	type answer struct {
		over  bool
		limit uint32 // the first status's current_limit.requests_per_unit, 0 for none
		name  string
		codes []string
	}
	viaGRPC := func(hits uint32, descs ...string) answer {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits}
		for i := 0; i+1 < len(descs); i += 2 {
			d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: descs[i], Value: descs[i+1]}}}
			if hits == 0 {
				d.HitsAddend = wrapperspb.UInt64(0) // a look: the request's 0 would mean 1
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := rls.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		a := answer{over: out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT}
		for _, st := range out.Statuses {
			a.codes = append(a.codes, st.Code.String())
		}
		if cl := out.Statuses[0].CurrentLimit; cl != nil {
			a.limit, a.name = cl.RequestsPerUnit, cl.Name
		}
		return a
	}
	viaJSON := func(hits uint32, descs ...string) answer {
		t.Helper()
		var parts []string
		for i := 0; i+1 < len(descs); i += 2 {
			parts = append(parts, fmt.Sprintf(`{"entries":[{"key":%q,"value":%q}]}`, descs[i], descs[i+1]))
		}
		body := fmt.Sprintf(`{"domain":"edge","hits_addend":%d,"descriptors":[%s]}`, hits, strings.Join(parts, ","))
		resp, err := http.Post("http://"+s.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			OverallCode string `json:"overallCode"`
			Statuses    []struct {
				Code         string `json:"code"`
				CurrentLimit *struct {
					Name            string `json:"name"`
					RequestsPerUnit uint32 `json:"requestsPerUnit"`
				} `json:"currentLimit"`
			} `json:"statuses"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("/json %s: %d %v", body, resp.StatusCode, err)
		}
		a := answer{over: out.OverallCode == "OVER_LIMIT"}
		for _, st := range out.Statuses {
			a.codes = append(a.codes, st.Code)
		}
		if cl := out.Statuses[0].CurrentLimit; cl != nil {
			a.limit, a.name = cl.RequestsPerUnit, cl.Name
		}
		return a
	}
	admin := func(method, path, body string, want int) {
		t.Helper()
		if code, m := s.admin(method, path, body); code != want {
			t.Fatalf("%s %s: %d %v, want %d", method, path, code, m, want)
		}
	}
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	admin("POST", "/admin/v1/overrides", `{"tenant":"banned","type":"ban","reason":"e2e","expires_at":"`+until+`"}`, 201)
	admin("POST", "/admin/v1/overrides", `{"tenant":"double","rule":"per-tenant","type":"multiplier","value":2,"reason":"e2e","expires_at":"`+until+`"}`, 201)
	admin("POST", "/admin/v1/overrides", `{"tenant":"tight","rule":"edge.org","type":"custom","limit":1,"reason":"e2e","expires_at":"`+until+`"}`, 201)
	admin("POST", "/admin/v1/exemptions", `{"tenant":"vip","reason":"e2e"}`, 201)
	admin("PUT", "/admin/v1/identities/tenant/cheap", `{"tier":"free"}`, 200)
	admin("PUT", "/admin/v1/identities/tenant/probe", `{"tier":"free"}`, 200)
	// The changes reach the node in order; wait for the last one (each try counts).
	waitFor(t, 10*time.Second, "the assignment", func() bool { return viaGRPC(0, "tier", "premium", "org", "probe").name == "free-tier" })

	for _, via := range []struct {
		name string
		call func(hits uint32, descs ...string) answer
	}{{"grpc", viaGRPC}, {"json", viaJSON}} {
		t.Run(via.name, func(t *testing.T) {
			call := via.call
			// The tenants are fresh per wire form: each counts from 0.
			ban, vip, double, tight, cheap := "banned", "vip", "double", "tight", "cheap"
			sfx := "-" + via.name
			for range 5 {
				if a := call(1, "org", ban, "org", "other"+sfx); !a.over || a.codes[0] != "OVER_LIMIT" {
					t.Fatalf("a banned tenant: %+v", a)
				}
			}
			// The banned requests counted nothing: the tenant "other" has its 3 left.
			admitted := 0
			for range 4 {
				if !call(1, "org", "other"+sfx).over {
					admitted++
				}
			}
			if admitted != 3 {
				t.Errorf("after 5 banned requests naming it, tenant other%s admitted %d of 3", sfx, admitted)
			}
			for range 10 {
				if a := call(1, "org", vip, "org", "vip-other"+sfx); a.over || a.limit != 0 {
					t.Fatalf("an exempt tenant: %+v", a)
				}
			}
			admitted = 0
			for range 4 {
				if !call(1, "org", "vip-other"+sfx).over {
					admitted++
				}
			}
			if admitted != 3 {
				t.Errorf("after 10 exempt requests, tenant vip-other%s admitted %d of 3: an exempt request counted", sfx, admitted)
			}
			if via.name == "grpc" {
				// The counted tenants are shared by both wire forms: count them once.
				for _, tc := range []struct {
					tenant string
					limit  uint32
				}{{double, 6}, {tight, 1}} {
					admitted = 0
					for range 8 {
						a := call(1, "org", tc.tenant)
						if a.limit != tc.limit {
							t.Fatalf("tenant %s: current_limit %d, want %d", tc.tenant, a.limit, tc.limit)
						}
						if !a.over {
							admitted++
						}
					}
					if admitted != int(tc.limit) {
						t.Errorf("tenant %s admitted %d, want %d", tc.tenant, admitted, tc.limit)
					}
				}
				admitted = 0
				for range 3 {
					a := call(1, "org", cheap, "tier", "premium")
					if len(a.codes) != 2 {
						t.Fatalf("codes %v", a.codes)
					}
					if !a.over {
						admitted++
					}
				}
				if admitted != 1 {
					t.Errorf("tenant cheap claiming premium admitted %d, want its assigned free tier's 1", admitted)
				}
			}
		})
	}

	// Violations of RLS traffic name the tenant: other-grpc went past its limit.
	waitFor(t, 20*time.Second, "a violation naming the tenant", func() bool {
		code, m := s.admin("GET", "/admin/v1/violations?tenant=other-grpc", "")
		vs, _ := m["violations"].([]any)
		return code == 200 && len(vs) > 0 && vs[0].(map[string]any)["tenant"] == "other-grpc"
	})
}
