package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

// testPolicy: alice has 3 requests a minute; every tenant 100 a second; searches also go
// through a leaky bucket, which reports a queue delay.
const testPolicy = `
rules:
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 3, period: 1m}
  - {name: per-tenant, key: [tenant], algorithm: token_bucket, limit: 100, period: 1s}
  - {name: search, match: {endpoint: "/api/search"}, key: [user], algorithm: leaky_bucket, limit: 10, period: 1s, burst: 5}
exemptions:
  - {api_key: internal-health}
`

// env is one server with its own limiter, reached through a real connection.
type env struct {
	srv    *Server
	conn   *grpc.ClientConn
	client sluicev1.RateLimiterClient
	clock  *testutil.Clock
	reg    *prometheus.Registry
}

func newLimiter(t testing.TB, yml string) (*sluice.Limiter, *testutil.Clock) {
	t.Helper()
	c := testutil.NewClock()
	return testutil.Limiter(t, yml, c), c
}

// newEnv starts a gRPC server on a free loopback port and connects a client to it; both stop
// when the test ends.
func newEnv(t testing.TB, yml string) *env {
	t.Helper()
	l, c := newLimiter(t, yml)
	reg := prometheus.NewRegistry()
	srv := New(l, metrics.New(reg, "memory"))
	conn := grpctest.Serve(t, srv.Register)
	return &env{srv: srv, conn: conn, client: sluicev1.NewRateLimiterClient(conn), clock: c, reg: reg}
}

func (e *env) check(t testing.TB, r *sluicev1.CheckRequest) *sluicev1.CheckResponse {
	t.Helper()
	resp, err := e.client.Check(t.Context(), r)
	if err != nil {
		t.Fatalf("Check(%v): %v", r, err)
	}
	return resp
}

func (e *env) quota(t testing.TB, r *sluicev1.CheckRequest) *sluicev1.CheckResponse {
	t.Helper()
	resp, err := e.client.GetQuota(t.Context(), r)
	if err != nil {
		t.Fatalf("GetQuota(%v): %v", r, err)
	}
	return resp
}

// remaining lists each limit's remaining units, to compare before and after a call.
func remaining(resp *sluicev1.CheckResponse) string {
	var b strings.Builder
	for _, r := range resp.GetResults() {
		fmt.Fprintf(&b, "%s=%d ", r.GetRule(), r.GetRemaining())
	}
	return b.String()
}

// counter sums the samples of a counter family whose labels include want.
func (e *env) counter(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func wantCode(t testing.TB, err error, code codes.Code, substr string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), substr) {
		t.Fatalf("error %v, want code %v with message naming %q", err, code, substr)
	}
}

func alice() *sluicev1.CheckRequest {
	return &sluicev1.CheckRequest{Tenant: "acme", User: "alice", Endpoint: "/api/items", Method: "GET"}
}

func TestAPI(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"allowed then denied", func(t *testing.T, e *env) {
			for i := range 3 {
				resp := e.check(t, alice())
				if !resp.Allowed || resp.Remaining != int64(2-i) || resp.Rule != "per-user" || resp.Limit != 3 {
					t.Fatalf("request %d: %v", i, resp)
				}
			}
			// Off the millisecond grid: the wait must round up, never down.
			e.clock.Add(1500 * time.Microsecond)
			resp := e.check(t, alice())
			if resp.Allowed || resp.State != sluicev1.State_STATE_HARD || resp.Rule != "per-user" || resp.Scope != "user" {
				t.Fatalf("4th request: %v", resp)
			}
			if resp.RetryAfterMs != 59999 || resp.ResetAfterMs != 59999 {
				t.Fatalf("retry_after_ms %d reset_after_ms %d, want 59999 (60s - 1.5ms rounded up)", resp.RetryAfterMs, resp.ResetAfterMs)
			}
			e.clock.Add(time.Duration(resp.RetryAfterMs) * time.Millisecond)
			if resp := e.check(t, alice()); !resp.Allowed || resp.State != sluicev1.State_STATE_NORMAL {
				t.Fatalf("after retry_after_ms: %v", resp)
			}
			if got := e.counter(t, "sluice_checks_total", map[string]string{"api": "grpc", "result": "denied", "rule": "per-user"}); got != 1 {
				t.Errorf("denied checks counted %v, want 1", got)
			}
		}},
		{"results list", func(t *testing.T, e *env) {
			r := alice()
			r.Endpoint = "/api/search"
			e.check(t, r)
			resp := e.check(t, r)
			type row struct {
				rule, scope, algorithm string
				limit, remaining       int64
				delayMs                int64
			}
			want := []row{
				{"per-user", "user", "fixed_window", 3, 1, 0},
				{"per-tenant", "tenant", "token_bucket", 100, 98, 0},
				// A bucket's limit is its burst, what can be spent at once (issue 30), never
				// below remaining; one is queued ahead at 10/s.
				{"search", "user", "leaky_bucket", 5, 3, 100},
			}
			if len(resp.Results) != len(want) {
				t.Fatalf("results %v, want %d", resp.Results, len(want))
			}
			for i, w := range want {
				g := resp.Results[i]
				got := row{g.Rule, g.Scope, g.Algorithm, g.Limit, g.Remaining, g.DelayMs}
				if got != w || !g.Allowed || g.State != sluicev1.State_STATE_NORMAL {
					t.Errorf("result %d = %+v allowed=%v state=%v, want %+v", i, got, g.Allowed, g.State, w)
				}
			}
			// The top level is the limit with the least remaining.
			if resp.Rule != "per-user" || resp.Remaining != 1 || resp.PolicyVersion == "" {
				t.Errorf("deciding limit %q remaining %d policy %q", resp.Rule, resp.Remaining, resp.PolicyVersion)
			}
		}},
		{"GetQuota does not consume", func(t *testing.T, e *env) {
			for range 5 {
				if q := e.quota(t, alice()); !q.Allowed || q.Remaining != 3 {
					t.Fatalf("quota: %v", q)
				}
			}
			if resp := e.check(t, alice()); resp.Remaining != 2 {
				t.Fatalf("first check after quotas: remaining %d, want 2", resp.Remaining)
			}
			if got := e.counter(t, "sluice_checks_total", map[string]string{"api": "grpc"}); got != 6 {
				t.Errorf("checks counted %v, want 6", got)
			}
		}},
		{"cost 0 looks", func(t *testing.T, e *env) {
			r := alice()
			r.Cost = proto.Int64(3)
			e.check(t, r)
			r.Cost = proto.Int64(0)
			for range 3 {
				// A look at a spent limit is allowed: it asks for nothing.
				if resp := e.check(t, r); !resp.Allowed || resp.Remaining != 0 {
					t.Fatalf("look: %v", resp)
				}
			}
			if resp := e.check(t, alice()); resp.Allowed {
				t.Fatalf("looks consumed nothing, yet: %v", resp)
			}
		}},
		{"idempotency key replays", func(t *testing.T, e *env) {
			r := alice()
			r.Cost, r.IdempotencyKey = proto.Int64(2), "pay-42"
			first := e.check(t, r)
			if first.Replayed || first.Remaining != 1 {
				t.Fatalf("first: %v", first)
			}
			for range 3 {
				if again := e.check(t, r); !again.Replayed || again.Remaining != 1 || !again.Allowed {
					t.Fatalf("retry: %v", again)
				}
			}
			if resp := e.check(t, alice()); resp.Remaining != 0 || !resp.Allowed {
				t.Fatalf("retries consumed: %v", resp)
			}
		}},
		{"idempotency key reused for another cost", func(t *testing.T, e *env) {
			r := alice()
			r.Cost, r.IdempotencyKey = proto.Int64(1), "pay-43"
			e.check(t, r)
			before := remaining(e.quota(t, alice()))
			r.Cost = proto.Int64(2)
			_, err := e.client.Check(t.Context(), r)
			wantCode(t, err, codes.FailedPrecondition, "idempotency_key")
			if after := remaining(e.quota(t, alice())); after != before {
				t.Fatalf("the refused reuse consumed: %s, then %s", before, after)
			}
			if n := e.counter(t, "sluice_requests_rejected_total", map[string]string{"api": "grpc", "reason": "idempotency_mismatch"}); n != 1 {
				t.Fatalf("rejected{reason=idempotency_mismatch} = %v, want 1", n)
			}
		}},
		{"exempt", func(t *testing.T, e *env) {
			r := alice()
			r.ApiKey = "internal-health"
			for range 5 {
				if resp := e.check(t, r); !resp.Allowed || !resp.Exempt || len(resp.Results) != 0 {
					t.Fatalf("exempt: %v", resp)
				}
			}
		}},
		{"reset by rule", func(t *testing.T, e *env) {
			r := alice()
			r.Cost = proto.Int64(3)
			e.check(t, r)
			reset, err := e.client.Reset(t.Context(), &sluicev1.ResetRequest{Tenant: "acme", User: "alice", Rule: "per-user"})
			if err != nil || reset.KeysReset != 1 {
				t.Fatalf("Reset: %v, %v", reset, err)
			}
			if got := remaining(e.quota(t, alice())); got != "per-user=3 per-tenant=97 " {
				t.Fatalf("after reset of per-user: %s", got)
			}
			reset, err = e.client.Reset(t.Context(), &sluicev1.ResetRequest{Tenant: "acme", User: "alice"})
			if err != nil || reset.KeysReset != 2 {
				t.Fatalf("Reset of every rule: %v, %v", reset, err)
			}
			if got := remaining(e.quota(t, alice())); got != "per-user=3 per-tenant=100 " {
				t.Fatalf("after reset of every rule: %s", got)
			}
		}},
		{"reset bad input", func(t *testing.T, e *env) {
			_, err := e.client.Reset(t.Context(), &sluicev1.ResetRequest{User: "alice", Rule: "nope"})
			wantCode(t, err, codes.InvalidArgument, `rule: no rule named "nope"`)
			_, err = e.client.Reset(t.Context(), &sluicev1.ResetRequest{Ip: "not-an-ip"})
			wantCode(t, err, codes.InvalidArgument, "ip:")
			raw, out := wire(9, []byte("per-\xffuser")), []byte(nil)
			err = e.conn.Invoke(t.Context(), sluicev1.RateLimiter_Reset_FullMethodName, &raw, &out, grpc.ForceCodecV2(grpctest.RawCodec{}))
			wantCode(t, err, codes.InvalidArgument, "rule: not valid UTF-8")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newEnv(t, testPolicy))
		})
	}
}

// wire encodes string fields of a CheckRequest by number without checking UTF-8.
func wire(fields ...any) []byte {
	var b []byte
	for i := 0; i < len(fields); i += 2 {
		b = protowire.AppendTag(b, protowire.Number(fields[i].(int)), protowire.BytesType)
		b = protowire.AppendBytes(b, fields[i+1].([]byte))
	}
	return b
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", policy.MaxAttribute+1)
	many := map[string]string{}
	for i := range policy.MaxDescriptors + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	with := func(f func(r *sluicev1.CheckRequest)) *sluicev1.CheckRequest {
		r := alice()
		f(r)
		return r
	}
	// A descriptor entry: key (1) and value (2) of the map entry message, as field 8.
	entry := wire(1, []byte("k\xff"), 2, []byte("v"))
	cases := []struct {
		name string
		req  *sluicev1.CheckRequest
		raw  []byte // sent as is instead of req
		want string // in the error message
	}{
		{name: "negative cost", req: with(func(r *sluicev1.CheckRequest) { r.Cost = proto.Int64(-1) }), want: "cost: must be >= 0"},
		{name: "huge cost", req: with(func(r *sluicev1.CheckRequest) { r.Cost = proto.Int64(1 << 40) }), want: "cost: must be <="},
		{name: "attribute over 1024 bytes", req: with(func(r *sluicev1.CheckRequest) { r.Endpoint = long }), want: "endpoint: longer than 1024 bytes"},
		{name: "descriptor value over 1024 bytes", req: with(func(r *sluicev1.CheckRequest) { r.Descriptors = map[string]string{"k": long} }), want: "descriptors.k"},
		{name: "too many descriptors", req: with(func(r *sluicev1.CheckRequest) { r.Descriptors = many }), want: "descriptors: at most 32"},
		{name: "empty descriptor key", req: with(func(r *sluicev1.CheckRequest) { r.Descriptors = map[string]string{"": "v"} }), want: "descriptors: empty key"},
		{name: "bad ip", req: with(func(r *sluicev1.CheckRequest) { r.Ip = "300.1.2.3" }), want: `ip: "300.1.2.3" is not an IP address`},
		{name: "ip with port", req: with(func(r *sluicev1.CheckRequest) { r.Ip = "10.1.2.3:80" }), want: "ip:"},
		// proto3 rejects the request while unmarshalling, before the handler; gRPC would
		// answer Internal, and Register turns it into InvalidArgument.
		{name: "invalid UTF-8 in tenant", raw: wire(1, []byte("ac\xffme"), 2, []byte("alice")), want: "tenant: not valid UTF-8"},
		{name: "invalid UTF-8 in descriptor key", raw: append(wire(2, []byte("alice")), wire(8, entry)...), want: "descriptors: not valid UTF-8"},
		{name: "invalid UTF-8 in descriptor value", raw: append(wire(2, []byte("alice")), wire(8, wire(1, []byte("k"), 2, []byte("v\xff")))...), want: "descriptors.k: not valid UTF-8"},
		{name: "truncated message", raw: []byte{0x0a, 0x05, 'a'}, want: "malformed request"},
	}
	e := newEnv(t, testPolicy)
	before := remaining(e.quota(t, alice()))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{sluicev1.RateLimiter_Check_FullMethodName, sluicev1.RateLimiter_GetQuota_FullMethodName} {
				var err error
				if tc.raw != nil {
					var out []byte
					err = e.conn.Invoke(t.Context(), method, &tc.raw, &out, grpc.ForceCodecV2(grpctest.RawCodec{}))
				} else {
					err = e.conn.Invoke(t.Context(), method, tc.req, new(sluicev1.CheckResponse))
				}
				wantCode(t, err, codes.InvalidArgument, tc.want)
			}
			if after := remaining(e.quota(t, alice())); after != before {
				t.Fatalf("bad request consumed: before %s after %s", before, after)
			}
			if got := e.counter(t, "sluice_requests_rejected_total", map[string]string{"api": "grpc", "reason": "invalid"}); got != float64(2*(i+1)) {
				t.Errorf("rejected counted %v, want %d", got, 2*(i+1))
			}
		})
	}
}

// TestInvalidUTF8NamesField calls the handler directly, as an in-process caller can with any
// Go string: the engine's check names the field.
func TestInvalidUTF8NamesField(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, testPolicy)
	s := New(l, nil)
	r := alice()
	r.User = "al\xffice"
	_, err := s.Check(t.Context(), r)
	wantCode(t, err, codes.InvalidArgument, "user: not valid UTF-8")
	_, err = s.Reset(t.Context(), &sluicev1.ResetRequest{Tier: "\xfe"})
	wantCode(t, err, codes.InvalidArgument, "tier: not valid UTF-8")
}

// TestNilRequests: a nil message is the empty message, as in proto, never a panic.
func TestNilRequests(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, testPolicy)
	s := New(l, nil)
	if resp, err := s.Check(t.Context(), nil); err != nil || !resp.Allowed {
		t.Fatalf("Check(nil): %v, %v", resp, err)
	}
	if resp, err := s.GetQuota(t.Context(), nil); err != nil || !resp.Allowed {
		t.Fatalf("GetQuota(nil): %v, %v", resp, err)
	}
	if _, err := s.Reset(t.Context(), nil); err != nil {
		t.Fatalf("Reset(nil): %v", err)
	}
}

func TestErrorCodes(t *testing.T) {
	t.Parallel()
	s := New(nil, nil)
	cases := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"field error", &policy.FieldError{Field: "cost", Msg: "must be >= 0"}, codes.InvalidArgument},
		{"wrapped field error", fmt.Errorf("check: %w", &policy.FieldError{Field: "ip", Msg: "bad"}), codes.InvalidArgument},
		{"store failure", errors.New("redis: connection refused"), codes.Unavailable},
		{"deadline", context.DeadlineExceeded, codes.Unavailable},
		{"idempotency key reused", sluice.ErrIdempotencyMismatch, codes.FailedPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := s.fail(tc.err)
			if status.Code(err) != tc.want || status.Convert(err).Message() != tc.err.Error() {
				t.Fatalf("fail(%v) = %v, want %v with the error's text", tc.err, err, tc.want)
			}
		})
	}
}

func TestCeilMillis(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		d    time.Duration
		want int64
	}{
		{"zero", 0, 0},
		{"negative", -time.Second, 0},
		{"one microsecond", time.Microsecond, 1},
		{"exact", 2 * time.Millisecond, 2},
		{"just over", 2*time.Millisecond + 1, 3},
		{"longest", time.Duration(1<<63 - 1), (1<<63-1)/1_000_000 + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ceilMillis(tc.d); got != tc.want {
				t.Fatalf("ceilMillis(%v) = %d, want %d", tc.d, got, tc.want)
			}
		})
	}
}
