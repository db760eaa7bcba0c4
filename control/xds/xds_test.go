package xds_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/internal/testkit/xdstest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// within is how long a test waits for what the client should do at once: wide, for a loaded
// machine; the figures are in docs/measurements.md.
const within = 20 * time.Second

func anyOf(t *testing.T, cfgs ...*rlsconfpb.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cfgs))
	for i, c := range cfgs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// TestDocuments: each RateLimitConfig becomes a document of the reference's format that the
// policy loads with the same limits; what the reference refuses is refused with its field.
func TestDocuments(t *testing.T) {
	t.Parallel()
	limit := func(unit rlsconfpb.RateLimitUnit, n uint32) *rlsconfpb.RateLimitPolicy {
		return &rlsconfpb.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
	}
	for _, c := range []struct {
		name  string
		cfgs  []*rlsconfpb.RateLimitConfig
		check func(t *testing.T, cfg *envoyconf.Config)
		err   string // in Documents or in the policy's load
	}{
		{
			name: "nested descriptors, names, replaces, shadow",
			cfgs: []*rlsconfpb.RateLimitConfig{{Name: "edge-config", Domain: "edge", Descriptors: []*rlsconfpb.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: limit(rlsconfpb.RateLimitUnit_SECOND, 5)},
				{Key: "path", Value: "/login", Descriptors: []*rlsconfpb.RateLimitDescriptor{
					{Key: "user", ShadowMode: true, DetailedMetric: true, RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_DAY, RequestsPerUnit: 100, Name: "daily", Replaces: []*rlsconfpb.RateLimitReplace{{Name: "hourly"}}}},
				}},
				{Key: "path", Value: "/health", RateLimit: &rlsconfpb.RateLimitPolicy{Unlimited: true}},
			}}},
			check: func(t *testing.T, cfg *envoyconf.Config) {
				m := cfg.Match("edge", []envoyconf.Entry{{Key: "remote_address", Value: "10.0.0.1"}})
				if m.Limit == nil || m.Limit.RequestsPerUnit != 5 || m.Limit.Period != time.Second {
					t.Errorf("remote_address: %+v, want 5 a second", m.Limit)
				}
				m = cfg.Match("edge", []envoyconf.Entry{{Key: "path", Value: "/login"}, {Key: "user", Value: "ann"}})
				if m.Limit == nil || m.Limit.RequestsPerUnit != 100 || m.Limit.Period != 24*time.Hour || m.Limit.Name != "daily" || !m.Limit.Shadow || !m.Limit.DetailedMetric || len(m.Limit.Replaces) != 1 {
					t.Errorf("path/user: %+v, want 100 a day named daily, shadow, detailed, replacing hourly", m.Limit)
				}
				m = cfg.Match("edge", []envoyconf.Entry{{Key: "path", Value: "/health"}})
				if m.Limit == nil || !m.Limit.Unlimited {
					t.Errorf("path=/health: %+v, want unlimited", m.Limit)
				}
			},
		},
		{
			name: "two domains",
			cfgs: []*rlsconfpb.RateLimitConfig{xdstest.Config("a", "one", 1, [2]string{"k", "v"}), xdstest.Config("b", "two", 2, [2]string{"k", "v"})},
			check: func(t *testing.T, cfg *envoyconf.Config) {
				if d := cfg.Domains(); len(d) != 2 {
					t.Errorf("domains %v, want one and two", d)
				}
			},
		},
		{name: "no resources", check: func(t *testing.T, cfg *envoyconf.Config) {
			if cfg != nil && len(cfg.Domains()) != 0 {
				t.Errorf("domains %v, want none", cfg.Domains())
			}
		}},
		{name: "unit missing", cfgs: []*rlsconfpb.RateLimitConfig{{Name: "x", Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "k", RateLimit: limit(rlsconfpb.RateLimitUnit_UNKNOWN, 3)}}}}, err: "descriptors[0].rate_limit.unit"},
		{name: "unit out of range", cfgs: []*rlsconfpb.RateLimitConfig{{Name: "x", Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "k", RateLimit: limit(9, 3)}}}}, err: "descriptors[0].rate_limit.unit"},
		{name: "no domain", cfgs: []*rlsconfpb.RateLimitConfig{{Name: "x", Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "k", RateLimit: limit(rlsconfpb.RateLimitUnit_HOUR, 3)}}}}, err: "domain"},
		{name: "no key", cfgs: []*rlsconfpb.RateLimitConfig{{Name: "x", Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{{RateLimit: limit(rlsconfpb.RateLimitUnit_HOUR, 3)}}}}, err: "descriptors[0].key"},
		{name: "one domain twice", cfgs: []*rlsconfpb.RateLimitConfig{xdstest.Config("a", "same", 1, [2]string{"k", "v"}), xdstest.Config("b", "same", 2, [2]string{"k", "v"})}, err: "same"},
		{name: "one name twice", cfgs: []*rlsconfpb.RateLimitConfig{xdstest.Config("a", "one", 1, [2]string{"k", "v"}), xdstest.Config("a", "two", 2, [2]string{"k", "v"})}, err: `resources[1]: name: "a" is given twice`},
		{name: "no name", cfgs: []*rlsconfpb.RateLimitConfig{{}}, err: "resources[0]: name: missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			docs, err := xds.Documents(anyOf(t, c.cfgs...))
			if err == nil {
				var files *policy.Files
				files, err = policy.ParseFiles(docs)
				if err == nil && c.check != nil {
					c.check(t, files.Snapshot().Envoy())
				}
			}
			if c.err == "" && err != nil {
				t.Fatalf("error %v, want none", err)
			}
			if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("error %v, want one naming %q", err, c.err)
			}
		})
	}
}

// TestDocumentsRefusesOtherTypes: a resource of another type is not read as a RateLimitConfig.
func TestDocumentsRefusesOtherTypes(t *testing.T) {
	t.Parallel()
	a, err := anypb.New(&rlsconfpb.RateLimitDescriptor{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xds.Documents([]*anypb.Any{a}); err == nil || !strings.Contains(err.Error(), "resources[0]: type") {
		t.Fatalf("error %v, want one naming resources[0]'s type", err)
	}
}

// holder is the Apply side of a client: it keeps the last policy that loaded, as the node's
// reload path does.
type holder struct {
	mu      sync.Mutex
	version string
	files   *policy.Files
}

func (h *holder) apply(version string, docs map[string][]byte) error {
	files, err := policy.ParseFiles(docs)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.version, h.files = version, files
	h.mu.Unlock()
	return nil
}

// limitOf is the per-minute limit the held policy gives domain's key=value, or -1.
func (h *holder) limitOf(domain, key, value string) (string, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.files == nil || h.files.Snapshot().Envoy() == nil {
		return h.version, -1
	}
	m := h.files.Snapshot().Envoy().Match(domain, []envoyconf.Entry{{Key: key, Value: value}})
	if m.Limit == nil {
		return h.version, -1
	}
	return h.version, int64(m.Limit.RequestsPerUnit)
}

// eventually polls cond until it holds or within passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClientAgainstControlPlane runs the client against go-control-plane's own server: the
// initial configuration, an update, an invalid one (NACKed, the last good kept), the server
// stopped (the last configuration stays) and restarted with a new snapshot (taken).
func TestClientAgainstControlPlane(t *testing.T) {
	t.Parallel()
	srv := xdstest.Start(t)
	const node = "sluice-test"
	srv.Set(node, "v1", xdstest.Config("edge", "edge", 10, [2]string{"path", "/a"}))

	h := &holder{}
	c, err := xds.New(xds.Options{
		Server: srv.Addr, NodeID: node, NodeMetadata: map[string]string{"zone": "test"},
		Headers:       map[string]string{"Authorization": "Bearer t0k"},
		RetryInterval: 50 * time.Millisecond, Apply: h.apply,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(ctx) }()
	defer func() { cancel(); <-ran; c.Close() }()

	want := func(version string, limit int64) func() bool {
		return func() bool { v, l := h.limitOf("edge", "path", "/a"); return v == version && l == limit }
	}
	eventually(t, "initial configuration v1 (10/min)", want("v1", 10))
	reqs := srv.Requests()
	if len(reqs) == 0 {
		t.Fatal("the server recorded no request")
	}
	if n := reqs[0].GetNode(); n.GetId() != node || n.GetMetadata().GetFields()["zone"].GetStringValue() != "test" {
		t.Errorf("first request's node: %v, want id %s with metadata zone=test", n, node)
	}
	if got := srv.Headers().Get("authorization"); len(got) != 1 || got[0] != "Bearer t0k" {
		t.Errorf("stream metadata authorization = %q, want the header given", got)
	}

	srv.Set(node, "v2", xdstest.Config("edge", "edge", 20, [2]string{"path", "/a"}))
	eventually(t, "update v2 (20/min)", want("v2", 20))
	eventually(t, "ACK of v2", func() bool { return acked(srv, "v2") })

	bad := xdstest.Config("edge", "edge", 30, [2]string{"path", "/a"})
	bad.Descriptors[0].RateLimit.Unit = rlsconfpb.RateLimitUnit_UNKNOWN
	srv.Set(node, "v3-bad", bad)
	eventually(t, "NACK of v3-bad", func() bool {
		for _, r := range srv.Requests() {
			if r.GetErrorDetail() != nil && r.GetVersionInfo() == "v2" && strings.Contains(r.GetErrorDetail().GetMessage(), "rate_limit.unit") {
				return true
			}
		}
		return false
	})
	// The server answers each NACK with the same snapshot: the client slows that loop to one
	// round per 500 ms instead of spinning (hundreds of rounds a second without it).
	countNacks := func() int {
		n := 0
		for _, r := range srv.Requests() {
			if r.GetErrorDetail() != nil {
				n++
			}
		}
		return n
	}
	before := countNacks()
	time.Sleep(time.Second)
	if n := countNacks() - before; n > 6 {
		t.Errorf("%d NACKs of one configuration in a second, want at most a few", n)
	}
	if st := c.State(); st.Acked != "v2" || st.Nacked != "v3-bad" {
		t.Errorf("state %+v, want v2 acked and v3-bad nacked", st)
	}
	if !want("v2", 20)() {
		t.Error("the refused configuration replaced the last good one")
	}

	srv.Stop()
	eventually(t, "the client to notice the server is gone", func() bool { return !c.State().Connected })
	time.Sleep(200 * time.Millisecond) // several retries fail meanwhile
	if !want("v2", 20)() {
		v, l := h.limitOf("edge", "path", "/a")
		t.Errorf("with the server away: version %q limit %d, want v2's 20 kept", v, l)
	}

	srv.Restart()
	srv.Set(node, "v4", xdstest.Config("edge", "edge", 40, [2]string{"path", "/a"}))
	eventually(t, "v4 (40/min) from the restarted server", want("v4", 40))
}

// acked reports whether the server has received an ACK of version.
func acked(srv *xdstest.Server, version string) bool {
	for _, r := range srv.Requests() {
		if r.GetErrorDetail() == nil && r.GetVersionInfo() == version && r.GetResponseNonce() != "" {
			return true
		}
	}
	return false
}

// TestNewRefusesBadOptions: options New cannot use are errors naming them.
func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	apply := func(string, map[string][]byte) error { return nil }
	for _, c := range []struct {
		o   xds.Options
		err string
	}{
		{xds.Options{Apply: apply}, "server"},
		{xds.Options{Server: "127.0.0.1:1"}, "Apply"},
		{xds.Options{Server: "127.0.0.1:1", Apply: apply, RetryInterval: -time.Second}, "retry interval"},
		{xds.Options{Server: "127.0.0.1:1", Apply: apply, MaxMessageBytes: -1}, "max message size"},
	} {
		t.Run(c.err, func(t *testing.T) {
			_, err := xds.New(c.o)
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %v, want one naming %s", err, c.err)
			}
		})
	}
}
