package rls_test

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/transport/rls"
)

// quotaConfig has quota_mode limits on two backends, a quota limit that is also a shadow, and
// an ordinary per-user limit, as a router-level quota filter and a route limit would send.
const quotaConfig = `
domain: ai
descriptors:
  - key: backend
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: backend
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: backend
    value: s
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`

func newQuotaClient(t *testing.T, o rls.Options) (rlsv3.RateLimitServiceClient, *clock) {
	t.Helper()
	srv, c := newServerOf(t, "ai.yaml", quotaConfig, o, nil)
	return serve(t, srv), c
}

// TestQuotaMode follows Envoy's reference service (its quota_mode: a quota descriptor over
// its limit is OVER_LIMIT in its own status, and the request is OVER_LIMIT only when every
// quota descriptor is over, or an ordinary limit is), and Sluice's rule that a denied request
// consumes nothing.
func TestQuotaMode(t *testing.T) {
	t.Parallel()
	a, b, s, user := limit("", 1, minute), limit("", 2, minute), limit("", 1, minute), limit("", 3, minute)
	req := func(kv ...string) *rlsv3.RateLimitRequest {
		var r rlsv3.RateLimitRequest
		r.Domain = "ai"
		for i := 0; i+1 < len(kv); i += 2 {
			r.Descriptors = append(r.Descriptors, desc(kv[i], kv[i+1]))
		}
		return &r
	}
	// answerWith is answer with the overall code given: a quota over its limit is OVER_LIMIT in
	// its status while the request may be OK.
	answerWith := func(code rlsv3.RateLimitResponse_Code, statuses ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: statuses}
	}
	const OK, OVER = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "quota descriptors only: over only when all are over", steps: []step{
			{req: req("backend", "a", "backend", "b"), want: answerWith(OK, ok(0, a, 50), ok(1, b, 50))},
			{req: req("backend", "a", "backend", "b"), want: answerWith(OK, over(a, 50), ok(0, b, 50))},
			{req: req("backend", "a", "backend", "b"), want: answerWith(OVER, over(a, 50), over(b, 50))},
			{req: req("backend", "b"), want: answerWith(OVER, over(b, 50))},
			{advance: time.Minute, req: req("backend", "b", "backend", "a"), want: answerWith(OK, ok(1, b, 50), ok(0, a, 50))},
		}},
		{name: "with an ordinary limit: the request consumes only when allowed", steps: []step{
			{req: req("user", "alice", "backend", "a", "backend", "b"), want: answerWith(OK, ok(2, user, 50), ok(0, a, 50), ok(1, b, 50))},
			// a is over, b is not: allowed, and user and b consume (a second store call).
			{req: req("user", "alice", "backend", "a", "backend", "b"), want: answerWith(OK, ok(1, user, 50), over(a, 50), ok(0, b, 50))},
			// Both over: denied, and user keeps its 1.
			{req: req("user", "alice", "backend", "a", "backend", "b"), want: answerWith(OVER, ok(1, user, 50), over(a, 50), over(b, 50))},
			{req: req("user", "alice"), want: answerWith(OK, ok(0, user, 50))},
			// The ordinary limit denies whatever the quotas say.
			{advance: time.Minute, req: req("user", "alice", "backend", "a"), want: answerWith(OK, ok(2, user, 50), ok(0, a, 50))},
			{req: req("user", "alice"), want: answerWith(OK, ok(1, user, 50))},
			{req: req("user", "alice"), want: answerWith(OK, ok(0, user, 50))},
			{req: req("user", "alice", "backend", "b"), want: answerWith(OVER, over(user, 50), ok(2, b, 50))},
		}},
		{name: "a shadow quota is never over, so the request is never over its quotas", steps: []step{
			{req: req("backend", "a", "backend", "s"), want: answerWith(OK, ok(0, a, 50), ok(0, s, 50))},
			{req: req("backend", "a", "backend", "s"), want: answerWith(OK, over(a, 50), ok(0, s, 50))},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client, c := newQuotaClient(t, rls.Options{})
			for _, bad := range run(t.Context(), client, c, tt.steps) {
				t.Error(bad)
			}
		})
	}
}

// TestQuotaModeHeaders: the headers describe the descriptor the reference picks. A quota over
// its limit counts by its remaining (0), not as the denial it is not: the first descriptor
// with the least remaining wins.
func TestQuotaModeHeaders(t *testing.T) {
	t.Parallel()
	client, _ := newQuotaClient(t, rls.Options{ResponseHeaders: true})
	for _, r := range []*rlsv3.RateLimitRequest{req("ai", desc("backend", "a")), req("ai", desc("backend", "b"))} {
		if _, err := client.ShouldRateLimit(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	// b has 0 left after this request and comes first; a is over its quota.
	resp, err := client.ShouldRateLimit(t.Context(), req("ai", desc("backend", "b"), desc("backend", "a")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v", resp.OverallCode)
	}
	want := []*corev3.HeaderValue{
		{Key: rls.DefaultLimitHeader, Value: "2"},
		{Key: rls.DefaultRemainingHeader, Value: "0"},
		{Key: rls.DefaultResetHeader, Value: "50"},
	}
	got := resp.GetResponseHeadersToAdd()
	if len(got) != len(want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Key != want[i].Key || got[i].Value != want[i].Value {
			t.Errorf("header %d: %s=%s, want %s=%s", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
}
