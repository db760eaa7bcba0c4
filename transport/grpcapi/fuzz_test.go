package grpcapi

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// FuzzHandlers feeds arbitrary requests straight to the handlers, as an in-process caller
// could (no unmarshalling, so strings need not be UTF-8): every answer is OK or
// InvalidArgument, and nothing panics.
func FuzzHandlers(f *testing.F) {
	f.Add("acme", "alice", "", "", "/api/search", "GET", "", "k", "v", int64(1), true, "", "")
	f.Add("", "", "internal-health", "10.0.0.1", "", "", "free", "", "", int64(0), true, "idem", "per-user")
	f.Add("t", "u\xff", "", "::1", "/", "post", "", "", "", int64(-1), true, "", "nope")
	f.Add("t", "u", "", "1.2.3.4:80", "", "", "", "k\xfe", "", int64(1<<40), false, "", "search")
	l, c := newLimiter(f, testPolicy)
	s := New(l, nil)
	f.Fuzz(func(t *testing.T, tenant, user, apiKey, ip, endpoint, method, tier, dk, dv string, cost int64, hasCost bool, idem, rule string) {
		r := &sluicev1.CheckRequest{
			Tenant: tenant, User: user, ApiKey: apiKey, Ip: ip, Endpoint: endpoint, Method: method,
			Tier: tier, IdempotencyKey: idem,
		}
		if dk != "" || dv != "" {
			r.Descriptors = map[string]string{dk: dv}
		}
		if hasCost {
			r.Cost = proto.Int64(cost)
		}
		for name, call := range map[string]func() (*sluicev1.CheckResponse, error){
			"Check":    func() (*sluicev1.CheckResponse, error) { return s.Check(t.Context(), r) },
			"GetQuota": func() (*sluicev1.CheckResponse, error) { return s.GetQuota(t.Context(), r) },
		} {
			resp, err := call()
			if code := status.Code(err); code != codes.OK && code != codes.InvalidArgument {
				t.Fatalf("%s(%v): %v", name, r, err)
			}
			if err == nil && (resp == nil || resp.RetryAfterMs < 0 || resp.ResetAfterMs < 0 || resp.DelayMs < 0 || resp.Remaining < 0) {
				t.Fatalf("%s(%v) = %v", name, r, resp)
			}
		}
		reset := &sluicev1.ResetRequest{
			Tenant: tenant, User: user, ApiKey: apiKey, Ip: ip, Endpoint: endpoint, Method: method,
			Tier: tier, Descriptors: r.Descriptors, Rule: rule,
		}
		if _, err := s.Reset(t.Context(), reset); status.Code(err) != codes.OK && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Reset(%v): %v", reset, err)
		}
		c.Add(time.Millisecond) // let time pass so windows and buckets move on
	})
}
