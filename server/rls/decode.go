package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/grpcdecode"
)

// Register adds the service to gs. Use it rather than rlsv3.RegisterRateLimitServiceServer: it
// also answers a request that does not decode (a string that is not valid UTF-8, which proto3
// rejects while unmarshalling) with InvalidArgument naming the field, where gRPC would answer
// Internal, a server fault, for the client's bad input. It assumes gs decodes with the
// standard proto codec (no ForceServerCodec), as server/grpcapi's Register does.
func (s *Server) Register(gs *grpc.Server) {
	grpcdecode.Register(gs, &rlsv3.RateLimitService_ServiceDesc, s, func() { s.m.Rejected(api, "invalid") })
}
