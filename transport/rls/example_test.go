package rls_test

import (
	"context"
	"fmt"
	"net"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/rls"
)

func Example() {
	// A configuration file of Envoy's reference rate limit service, used as-is.
	cfg, err := envoyconf.Load(map[string][]byte{"config.yaml": []byte(`
domain: messaging
descriptors:
  # 2 messages a day to any one phone number.
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 2
`)}, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	snap, err := policy.Compile(&policy.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := sluice.New(memory.New(), snap.WithEnvoy(cfg, "v1"))
	if err != nil {
		panic(err)
	}
	defer l.Close()

	gs := grpc.NewServer()
	rls.New(l, nil, rls.Options{}).Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go gs.Serve(lis)
	defer gs.Stop()

	// Envoy's side of the conversation.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{
		Domain: "messaging",
		Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "to_number", Value: "2061111111"}},
		}},
	}
	for range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(resp.OverallCode)
	}
	// Output:
	// OK
	// OK
	// OVER_LIMIT
}
