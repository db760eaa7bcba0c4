package rls_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/transport/rls"
)

const metadataConfig = `
domain: md
descriptors:
  - key: user
    metadata: {team: {name: alpha, tier: 1}, cost_center: a}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    metadata: {team: {region: eu, name: beta}, cost_center: b}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    metadata: {unused: true}
    rate_limit: {unlimited: true}
`

// TestDynamicMetadata: with Options.DynamicMetadata (RESPONSE_DYNAMIC_METADATA=true) the answer
// carries the domain, the descriptors, hitsAddend and the merged metadata of the limits that
// passed, as the reference builds them; without it, none.
func TestDynamicMetadata(t *testing.T) {
	t.Parallel()
	srv, _ := newServerOf(t, "md.yaml", metadataConfig, rls.Options{DynamicMetadata: true}, nil)
	client := serve(t, srv)
	ask := func(r *rlsv3.RateLimitRequest) map[string]any {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if resp.DynamicMetadata == nil {
			t.Fatal("no dynamic metadata")
		}
		return resp.DynamicMetadata.AsMap()
	}
	r := hits(2, req("md", desc("user", "alice"), descHits(1, desc("ip", "10.0.0.1")), desc("free", "x")))
	// user's limit is 1 and the request costs 2: user is over, ip passes, free is unlimited.
	got := ask(r)
	want := map[string]any{
		"domain":     "md",
		"hitsAddend": float64(2),
		"descriptors": []any{
			map[string]any{"entries": []any{"user=alice"}},
			map[string]any{"entries": []any{"ip=10.0.0.1"}, "hitsAddend": float64(1)},
			map[string]any{"entries": []any{"free=x"}},
		},
		"metadata": map[string]any{"team": map[string]any{"region": "eu", "name": "beta"}, "cost_center": "b"},
	}
	if !equalJSON(t, got, want) {
		t.Fatalf("metadata\n got %v\nwant %v", got, want)
	}
	// Both pass: the first descriptor's values win, mappings merge.
	got = ask(hits(1, req("md", desc("user", "bob"), desc("ip", "10.0.0.2"))))
	md := got["metadata"]
	wantMD := map[string]any{"team": map[string]any{"name": "alpha", "tier": float64(1), "region": "eu"}, "cost_center": "a"}
	if !equalJSON(t, md, wantMD) {
		t.Fatalf("merged metadata\n got %v\nwant %v", md, wantMD)
	}

	plain, _ := newServerOf(t, "md.yaml", metadataConfig, rls.Options{}, nil)
	resp, err := serve(t, plain).ShouldRateLimit(context.Background(), req("md", desc("ip", "1")))
	if err != nil || resp.DynamicMetadata != nil {
		t.Fatalf("without the option: %v, %v; want no dynamic metadata", resp.GetDynamicMetadata(), err)
	}
}

// equalJSON compares two values after a round trip through structpb, which gives both the
// same number and map types.
func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	va, err := structpb.NewValue(a)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := structpb.NewValue(b)
	if err != nil {
		t.Fatal(err)
	}
	return proto.Equal(va, vb)
}
