package rls_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/transport/rls"
)

// edgeConfig is written as for the reference service, in the style of its README.
const edgeConfig = `
domain: edge
descriptors:
  # Every client gets 3 requests a minute, each client on its own counter.
  - key: client_id
    rate_limit:
      unit: minute
      requests_per_unit: 3

  # An exact value beats the default.
  - key: client_id
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 5

  # Internal callers are not limited.
  - key: client_id
    value: internal

  # Batch jobs: 2 a minute for each job...
  - key: client_id
    value: batch-*
    rate_limit:
      unit: minute
      requests_per_unit: 2

  # ...while all teams share 2 a minute between them.
  - key: client_id
    value: team-*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2

  - key: path
    value: /health
    rate_limit:
      unlimited: true

  # Measure before enforcing.
  - key: path
    value: /beta
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1

  - key: path
    value: /export
    rate_limit:
      name: export
      unit: hour
      requests_per_unit: 1

  - key: path
    value: /blocked
    rate_limit:
      unit: second
      requests_per_unit: 0

  - key: route
    value: api
    rate_limit:
      name: standard
      unit: minute
      requests_per_unit: 1

  # Premium callers get their own limit instead of the standard one.
  - key: plan
    value: premium
    rate_limit:
      name: premium
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: standard

  - key: tenant
    descriptors:
      - key: quota
        value: daily
        rate_limit:
          name: daily
          unit: day
          requests_per_unit: 10
`

// t0 is 10s into a minute, so the windows in force end in 50s (minute), 3590s (hour) and
// 43190s (day, at 00:00 UTC).
var t0 = time.Date(2026, 11, 23, 12, 0, 10, 0, time.UTC)

// clock is the memory store's clock, moved by the tests.
type clock struct{ us atomic.Int64 }

func (c *clock) Now() int64          { return c.us.Load() }
func (c *clock) Add(d time.Duration) { c.us.Add(d.Microseconds()) }

// newServer builds the engine over edgeConfig with a clock at t0.
func newServer(t testing.TB, o rls.Options, m *metrics.Metrics) (*rls.Server, *clock) {
	t.Helper()
	return newServerOf(t, "edge.yaml", edgeConfig, o, m)
}

// newServerOf builds the engine over the Envoy-format file yml, called name, with a clock at t0.
func newServerOf(t testing.TB, name, yml string, o rls.Options, m *metrics.Metrics) (*rls.Server, *clock) {
	t.Helper()
	cfg, err := envoyconf.Load(map[string][]byte{name: []byte(yml)}, false)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := policy.Compile(&policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{}
	c.us.Store(t0.UnixMicro())
	st := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	l, err := sluice.New(st, snap.WithEnvoy(cfg, "v1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return rls.New(l, m, o), c
}

// serve starts srv on a real listener and returns a client of it.
func serve(t testing.TB, srv *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(grpctest.Serve(t, srv.Register))
}

func newClient(t testing.TB, o rls.Options) (rlsv3.RateLimitServiceClient, *clock) {
	t.Helper()
	srv, c := newServer(t, o, nil)
	return serve(t, srv), c
}

// Request builders.

func req(domain string, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}
}

func edge(descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return req("edge", descs...)
}

func hits(n uint32, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitRequest {
	r.HitsAddend = n
	return r
}

// desc takes key, value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func descHits(n uint64, d *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func descLimit(n uint32, u typev3.RateLimitUnit, d *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: u}
	return d
}

// Response builders.

const (
	second = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day    = rlsv3.RateLimitResponse_RateLimit_DAY
)

func limit(name string, n uint32, u rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: n, Unit: u}
}

func ok(remaining uint32, l *rlsv3.RateLimitResponse_RateLimit, reset int64) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OK, CurrentLimit: l, LimitRemaining: remaining,
		DurationUntilReset: &durationpb.Duration{Seconds: reset},
	}
}

func over(l *rlsv3.RateLimitResponse_RateLimit, reset int64) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: l,
		DurationUntilReset: &durationpb.Duration{Seconds: reset},
	}
}

// noLimit is the status of an unmatched, whitelisted, replaced or unknown-domain descriptor.
func noLimit() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
}

func unlimited() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
}

func answer(statuses ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}
	for _, s := range statuses {
		if s.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			r.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	return r
}

// step is one request of a scenario, made after moving the clock by advance.
type step struct {
	advance time.Duration
	req     *rlsv3.RateLimitRequest
	want    *rlsv3.RateLimitResponse
}

// run plays steps and returns every mismatch, so that a case documenting an engine gap can
// tell a known failure from a fixed one.
func run(ctx context.Context, client rlsv3.RateLimitServiceClient, c *clock, steps []step) []string {
	var bad []string
	for i, s := range steps {
		c.Add(s.advance)
		got, err := client.ShouldRateLimit(ctx, s.req)
		if err != nil {
			bad = append(bad, fmt.Sprintf("step %d: %v", i, err))
			continue
		}
		if !proto.Equal(got, s.want) {
			bad = append(bad, fmt.Sprintf("step %d: %s\n got: %s\nwant: %s", i, prototext.Format(s.req),
				prototext.Format(got), prototext.Format(s.want)))
		}
	}
	return bad
}

func TestShouldRateLimit(t *testing.T) {
	t.Parallel()
	perClient := limit("", 3, minute)
	gold := limit("", 5, minute)
	batch := limit("", 2, minute)
	export := limit("export", 1, hour)
	daily := limit("daily", 10, day)
	tests := []struct {
		name  string
		steps []step
		// gap, when set, names a known difference of the engine from the reference service:
		// the case documents the reference's answer and is skipped while it fails.
		gap string
	}{
		{name: "matched limit counts down then OVER_LIMIT", steps: []step{
			{req: edge(desc("client_id", "alice")), want: answer(ok(2, perClient, 50))},
			{req: edge(desc("client_id", "alice")), want: answer(ok(1, perClient, 50))},
			{req: edge(desc("client_id", "alice")), want: answer(ok(0, perClient, 50))},
			{req: edge(desc("client_id", "alice")), want: answer(over(perClient, 50))},
			{req: edge(desc("client_id", "bob")), want: answer(ok(2, perClient, 50))},
			{advance: 50 * time.Second, req: edge(desc("client_id", "alice")), want: answer(ok(2, perClient, 60))},
		}},
		{name: "over by cost reports nothing remaining", steps: []step{
			{req: hits(2, edge(desc("client_id", "alice"))), want: answer(ok(1, perClient, 50))},
			{req: hits(2, edge(desc("client_id", "alice"))), want: answer(over(perClient, 50))},
			{req: edge(desc("client_id", "alice")), want: answer(ok(0, perClient, 50))},
		}},
		{name: "wildcard values keep their own counters", steps: []step{
			{req: edge(desc("client_id", "batch-1")), want: answer(ok(1, batch, 50))},
			{req: edge(desc("client_id", "batch-1")), want: answer(ok(0, batch, 50))},
			{req: edge(desc("client_id", "batch-2")), want: answer(ok(1, batch, 50))},
			{req: edge(desc("client_id", "batch-1")), want: answer(over(batch, 50))},
		}},
		{name: "share_threshold shares one counter", steps: []step{
			{req: edge(desc("client_id", "team-a")), want: answer(ok(1, batch, 50))},
			{req: edge(desc("client_id", "team-b")), want: answer(ok(0, batch, 50))},
			{req: edge(desc("client_id", "team-c")), want: answer(over(batch, 50))},
		}},
		{name: "exact value beats wildcard beats default", steps: []step{
			{req: edge(desc("client_id", "gold")), want: answer(ok(4, gold, 50))},
			{req: edge(desc("client_id", "batch-gold")), want: answer(ok(1, batch, 50))},
			{req: edge(desc("client_id", "golden")), want: answer(ok(2, perClient, 50))},
		}},
		{name: "whitelisted node is never limited", steps: []step{
			{req: edge(desc("client_id", "internal")), want: answer(noLimit())},
			{req: hits(1000, edge(desc("client_id", "internal"))), want: answer(noLimit())},
			{req: edge(desc("client_id", "internal")), want: answer(noLimit())},
		}},
		{name: "unmatched descriptor", steps: []step{
			{req: edge(desc("user_agent", "curl")), want: answer(noLimit())},
			// A limit on an intermediate node does not apply to a longer descriptor.
			{req: edge(desc("client_id", "alice", "path", "/x")), want: answer(noLimit())},
			// Nor does a leaf's limit to a descriptor that stops above it.
			{req: edge(desc("tenant", "acme")), want: answer(noLimit())},
		}},
		{name: "unknown domain", steps: []step{
			{req: req("nowhere", desc("client_id", "alice")), want: answer(noLimit())},
			{req: req("nowhere", descLimit(1, typev3.RateLimitUnit_SECOND, desc("client_id", "alice"))), want: answer(noLimit())},
		}},
		{name: "unlimited", steps: []step{
			{req: edge(desc("path", "/health")), want: answer(unlimited())},
			{req: edge(desc("path", "/health"), desc("client_id", "alice")), want: answer(unlimited(), ok(2, perClient, 50))},
		}},
		{name: "shadow_mode answers OK though over", steps: []step{
			{req: edge(desc("path", "/beta")), want: answer(ok(0, limit("", 1, minute), 50))},
			{req: edge(desc("path", "/beta")), want: answer(ok(0, limit("", 1, minute), 50))},
			{req: hits(5, edge(desc("path", "/beta"))), want: answer(ok(0, limit("", 1, minute), 50))},
		}},
		{name: "replaces", steps: []step{
			{req: edge(desc("route", "api"), desc("plan", "premium")), want: answer(noLimit(), ok(99, limit("premium", 100, minute), 50))},
			{req: edge(desc("route", "api"), desc("plan", "premium")), want: answer(noLimit(), ok(98, limit("premium", 100, minute), 50))},
			// Without its replacer the standard limit applies, and was not counted before.
			{req: edge(desc("route", "api")), want: answer(ok(0, limit("standard", 1, minute), 50))},
			{req: edge(desc("route", "api")), want: answer(over(limit("standard", 1, minute), 50))},
		}},
		{name: "request hits_addend 0 counts as 1", steps: []step{
			{req: hits(0, edge(desc("client_id", "alice"))), want: answer(ok(2, perClient, 50))},
			{req: hits(2, edge(desc("client_id", "alice"))), want: answer(ok(0, perClient, 50))},
		}},
		{name: "descriptor hits_addend overrides the request's", steps: []step{
			{req: hits(3, edge(descHits(1, desc("client_id", "alice")), desc("client_id", "bob"))),
				want: answer(ok(2, perClient, 50), ok(0, perClient, 50))},
		}},
		{name: "descriptor hits_addend 0 looks without counting", steps: []step{
			{req: hits(3, edge(desc("client_id", "alice"))), want: answer(ok(0, perClient, 50))},
			{req: edge(descHits(0, desc("client_id", "alice"))), want: answer(ok(0, perClient, 50))},
			{req: edge(descHits(0, desc("client_id", "alice"))), want: answer(ok(0, perClient, 50))},
			{req: edge(desc("client_id", "alice")), want: answer(over(perClient, 50))},
		}},
		{name: "per-descriptor limit override", steps: []step{
			{req: edge(descLimit(1, typev3.RateLimitUnit_HOUR, desc("client_id", "alice"))), want: answer(ok(0, limit("", 1, hour), 3590))},
			{req: edge(descLimit(1, typev3.RateLimitUnit_HOUR, desc("client_id", "alice"))), want: answer(over(limit("", 1, hour), 3590))},
			// The configured limit has its own counter, untouched by the override.
			{req: edge(desc("client_id", "alice")), want: answer(ok(2, perClient, 50))},
			// An override applies even where the file has no limit.
			{req: edge(descLimit(2, typev3.RateLimitUnit_SECOND, desc("client_id", "internal"))), want: answer(ok(1, limit("", 2, second), 1))},
		}},
		{name: "all-or-nothing across descriptors", steps: []step{
			{req: edge(desc("client_id", "carol"), desc("path", "/export")), want: answer(ok(2, perClient, 50), ok(0, export, 3590))},
			// Sluice's deliberate difference: the denied request consumes nothing from carol's
			// limit (the reference would count it and answer 1).
			{req: edge(desc("client_id", "carol"), desc("path", "/export")), want: answer(ok(2, perClient, 50), over(export, 3590))},
			{req: edge(desc("client_id", "carol")), want: answer(ok(1, perClient, 50))},
		}},
		{name: "duration_until_reset counts down to the epoch-aligned window end", steps: []step{
			{req: edge(desc("tenant", "acme", "quota", "daily")), want: answer(ok(9, daily, 43190))},
			{advance: time.Hour, req: edge(desc("tenant", "acme", "quota", "daily")), want: answer(ok(8, daily, 39590))},
			// 23:59:59.5: half a second left reads as 1, as on the reference's whole-second clock.
			{advance: 10*time.Hour + 59*time.Minute + 49*time.Second + 500*time.Millisecond,
				req: edge(desc("tenant", "acme", "quota", "daily")), want: answer(ok(7, daily, 1))},
			// 00:00:00 UTC starts a new day with a full window.
			{advance: 500 * time.Millisecond, req: edge(desc("tenant", "acme", "quota", "daily")), want: answer(ok(9, daily, 86400))},
			// Each tenant has its own counter.
			{req: edge(desc("tenant", "other", "quota", "daily")), want: answer(ok(9, daily, 86400))},
		}},
		{name: "requests_per_unit 0 denies every request", steps: []step{
			{req: edge(desc("path", "/blocked")), want: answer(over(limit("", 0, second), 1))},
		}},
		{name: "look at a fresh limit reports the window end", steps: []step{
			{req: edge(descHits(0, desc("client_id", "dave"))), want: answer(ok(3, perClient, 50))},
		}},
		{name: "a huge hits_addend is OVER_LIMIT", steps: []step{
			{req: hits(math.MaxUint32, edge(desc("client_id", "erin"))), want: answer(over(perClient, 50))},
			{req: hits(math.MaxUint32, edge(desc("user_agent", "curl"))), want: answer(noLimit())},
		}},
		{name: "descriptor without entries is OK without a limit", steps: []step{
			{req: edge(desc("client_id", "alice"), desc()), want: answer(ok(2, perClient, 50), noLimit())},
		}},
		{name: "entry without a key is OK without a limit", steps: []step{
			{req: edge(desc("", "alice")), want: answer(noLimit())},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client, c := newClient(t, rls.Options{})
			bad := run(t.Context(), client, c, tt.steps)
			switch {
			case tt.gap != "" && len(bad) > 0:
				t.Skipf("engine differs from the reference: %s\n%s", tt.gap, strings.Join(bad, "\n"))
			case tt.gap != "":
				t.Errorf("now answers as the reference: remove the gap note %q", tt.gap)
			}
			for _, b := range bad {
				t.Error(b)
			}
		})
	}
}

func header(kv ...string) []*corev3.HeaderValue {
	var hs []*corev3.HeaderValue
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
	}
	return hs
}

func TestResponseHeaders(t *testing.T) {
	t.Parallel()
	on := rls.Options{ResponseHeaders: true}
	tests := []struct {
		name  string
		opts  rls.Options
		steps []*rlsv3.RateLimitRequest // all but the last prepare the state
		want  []*corev3.HeaderValue
	}{
		{name: "off", opts: rls.Options{}, steps: []*rlsv3.RateLimitRequest{
			edge(desc("client_id", "alice")),
		}},
		{name: "one limit", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(desc("client_id", "alice")),
		}, want: header("RateLimit-Limit", "3", "RateLimit-Remaining", "2", "RateLimit-Reset", "50")},
		{name: "least remaining wins", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(desc("client_id", "gold"), desc("client_id", "alice"), desc("path", "/export")),
		}, want: header("RateLimit-Limit", "1", "RateLimit-Remaining", "0", "RateLimit-Reset", "3590")},
		{name: "first of equals wins", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(desc("client_id", "alice"), desc("client_id", "batch-1")),
			edge(desc("client_id", "alice"), desc("client_id", "batch-1"), desc("path", "/export")),
		}, want: header("RateLimit-Limit", "2", "RateLimit-Remaining", "0", "RateLimit-Reset", "50")},
		{name: "over limit wins", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(desc("path", "/export")),
			edge(desc("client_id", "gold"), desc("path", "/export"), desc("client_id", "bob")),
		}, want: header("RateLimit-Limit", "1", "RateLimit-Remaining", "0", "RateLimit-Reset", "3590")},
		{name: "unlimited and whitelisted give none", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(desc("path", "/health"), desc("client_id", "internal"), desc("nothing", "here")),
		}},
		{name: "unknown domain gives none", opts: on, steps: []*rlsv3.RateLimitRequest{
			req("nowhere", desc("client_id", "alice")),
		}},
		{name: "override", opts: on, steps: []*rlsv3.RateLimitRequest{
			edge(descLimit(7, typev3.RateLimitUnit_HOUR, desc("client_id", "internal"))),
		}, want: header("RateLimit-Limit", "7", "RateLimit-Remaining", "6", "RateLimit-Reset", "3590")},
		{name: "renamed", opts: rls.Options{ResponseHeaders: true, LimitHeader: "X-Limit", RemainingHeader: "X-Left", ResetHeader: "X-Reset"},
			steps: []*rlsv3.RateLimitRequest{edge(desc("client_id", "alice"))},
			want:  header("X-Limit", "3", "X-Left", "2", "X-Reset", "50")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client, _ := newClient(t, tt.opts)
			var got *rlsv3.RateLimitResponse
			for _, r := range tt.steps {
				var err error
				if got, err = client.ShouldRateLimit(t.Context(), r); err != nil {
					t.Fatal(err)
				}
			}
			want := &rlsv3.RateLimitResponse{ResponseHeadersToAdd: tt.want}
			if !proto.Equal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: got.ResponseHeadersToAdd}, want) {
				t.Errorf("response_headers_to_add\n got %v\nwant %v", got.ResponseHeadersToAdd, tt.want)
			}
		})
	}
}

func TestInvalidArgument(t *testing.T) {
	t.Parallel()
	srv, c := newServer(t, rls.Options{}, nil)
	client := serve(t, srv)
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string // part of the error text
		// direct calls the Server without the network, for shapes the wire cannot carry.
		direct bool
	}{
		{name: "empty domain", req: req("", desc("client_id", "alice")), msg: "domain"},
		{name: "no descriptors", req: edge(), msg: "descriptors"},
		{name: "override without unit", req: edge(descLimit(5, typev3.RateLimitUnit_UNKNOWN, desc("client_id", "alice"))), msg: "limit.unit"},
		{name: "override with a bad unit", req: edge(descLimit(5, typev3.RateLimitUnit(99), desc("client_id", "alice"))), msg: "limit.unit"},
		{name: "negative hits", req: edge(func() *commonv3.RateLimitDescriptor {
			d := descHits(1, desc("client_id", "alice"))
			d.IsNegativeHits = true
			return d
		}()), msg: "is_negative_hits"},
		{name: "nil request", req: nil, msg: "domain", direct: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Bad input next to a valid descriptor consumes nothing from it (checked below).
			var err error
			if tt.direct {
				_, err = srv.ShouldRateLimit(t.Context(), tt.req)
			} else {
				_, err = client.ShouldRateLimit(t.Context(), tt.req)
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("err = %v, want InvalidArgument naming %q", err, tt.msg)
			}
		})
	}
	if bad := run(t.Context(), client, c, []step{
		{req: edge(desc("client_id", "alice")), want: answer(ok(2, limit("", 3, minute), 50))},
	}); len(bad) > 0 {
		t.Errorf("invalid requests consumed: %s", bad)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	srv, _ := newServer(t, rls.Options{}, m)
	client := serve(t, srv)
	for _, r := range []*rlsv3.RateLimitRequest{
		edge(desc("client_id", "alice")),
		edge(desc("path", "/export")),
		edge(desc("path", "/export")),
		edge(),
	} {
		client.ShouldRateLimit(t.Context(), r)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"sluice_checks_total{api=rls,mode=normal,result=allowed,rule=edge/client_id,state=normal}": 1,
		"sluice_checks_total{api=rls,mode=normal,result=allowed,rule=export,state=normal}":         1,
		"sluice_checks_total{api=rls,mode=normal,result=denied,rule=export,state=hard}":            1,
		"sluice_check_duration_seconds{api=rls}":                                                   3,
		"sluice_requests_rejected_total{api=rls,reason=invalid}":                                   1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// Shapes the wire cannot carry still get an answer, never a panic.
func TestNilShapes(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, rls.Options{ResponseHeaders: true}, nil)
	for _, in := range []*rlsv3.RateLimitRequest{
		edge(desc("client_id", "alice"), nil),
		edge(&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{nil}}),
		edge(&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client_id"}, nil}}),
	} {
		resp, err := srv.ShouldRateLimit(t.Context(), in)
		checkAnswer(t, in, resp, err)
	}
}

// A Limiter without an Envoy-format policy answers every domain as unknown.
func TestNoEnvoyPolicy(t *testing.T) {
	t.Parallel()
	snap, err := policy.Compile(&policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sluice.New(memory.New(memory.WithSweepInterval(0)), snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	resp, err := rls.New(l, nil, rls.Options{ResponseHeaders: true}).ShouldRateLimit(t.Context(), edge(desc("client_id", "alice")))
	if err != nil || !proto.Equal(resp, answer(noLimit())) {
		t.Fatalf("got %v, %v; want OK without a limit", resp, err)
	}
}
