package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// grpcCheck is what `sluice check --grpc` asks: sluice.v1 Check (or GetQuota) with the
// attributes, or, with a domain, Envoy's ShouldRateLimit with one descriptor made of the
// --descriptor entries in their order. It spares README readers a grpcurl install.
type grpcCheck struct {
	addr        string
	domain      string
	quota       bool
	attrs       map[string]*string
	descriptors []string // key=value, checked already
	cost        *int64
}

// run asks the server and prints the answer as JSON; denied is true for a denial or
// OVER_LIMIT, which check exits 2 on as over HTTP.
func (g *grpcCheck) run(ctx context.Context, out io.Writer) (denied bool, err error) {
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, fmt.Errorf("--grpc-server %q: %w", g.addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var answer proto.Message
	if g.domain != "" {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, kv := range g.descriptors {
			k, v, _ := strings.Cut(kv, "=")
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		in := &rlsv3.RateLimitRequest{Domain: g.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
		if g.cost != nil {
			in.HitsAddend = uint32(*g.cost)
		}
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, in)
		if err != nil {
			return false, fmt.Errorf("ask %s (ShouldRateLimit): %w", g.addr, err)
		}
		answer, denied = resp, resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	} else {
		in := &sluicev1.CheckRequest{Descriptors: map[string]string{}, Cost: g.cost}
		fields := map[string]*string{"tenant": &in.Tenant, "user": &in.User, "api_key": &in.ApiKey, "ip": &in.Ip,
			"endpoint": &in.Endpoint, "method": &in.Method, "tier": &in.Tier, "idempotency_key": &in.IdempotencyKey}
		for name, v := range g.attrs {
			*fields[name] = *v
		}
		for _, kv := range g.descriptors {
			k, v, _ := strings.Cut(kv, "=")
			in.Descriptors[k] = v
		}
		c := sluicev1.NewRateLimiterClient(conn)
		call := c.Check
		if g.quota {
			call = c.GetQuota
		}
		resp, err := call(ctx, in)
		if err != nil {
			return false, fmt.Errorf("ask %s (sluice.v1.RateLimiter): %w", g.addr, err)
		}
		answer, denied = resp, !resp.GetAllowed()
	}
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(answer)
	if err != nil {
		return false, err
	}
	// protojson varies its whitespace from build to build on purpose (so that nobody relies
	// on it), which made the answer read `"remaining":  "0"` from one binary and
	// `"remaining": "0"` from the next; encoding/json's indentation is the same every time.
	var text bytes.Buffer
	if err := json.Indent(&text, raw, "", "  "); err != nil {
		return false, err
	}
	verdict := "ALLOWED"
	if denied {
		verdict = "DENIED"
	}
	fmt.Fprintf(out, "%s (gRPC %s)\n%s\n", verdict, g.addr, text.Bytes())
	return denied, nil
}
