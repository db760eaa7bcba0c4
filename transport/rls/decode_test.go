package rls_test

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/transport/rls"
)

// field encodes one length-delimited field by number, without checking UTF-8.
func field(num int, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, protowire.Number(num), protowire.BytesType), v)
}

// entry is a RateLimitDescriptor.Entry on the wire.
func entry(key, value string) []byte {
	return append(field(1, []byte(key)), field(2, []byte(value))...)
}

// TestInvalidUTF8 sends requests with strings that are not UTF-8 over a real gRPC connection:
// each is InvalidArgument naming the field, not Internal, and consumes nothing.
func TestInvalidUTF8(t *testing.T) {
	t.Parallel()
	srv, c := newServer(t, rls.Options{}, nil)
	conn := grpctest.Serve(t, srv.Register)

	alice := field(2, field(1, entry("client_id", "alice")))
	tests := []struct {
		name  string
		raw   []byte
		field string
	}{
		{"domain", append(field(1, []byte("ed\xffge")), alice...), "domain"},
		{"entry value", append(field(1, []byte("edge")), field(2, field(1, entry("client_id", "al\xc3ice")))...), "descriptors[0].entries[0].value"},
		{"entry key of a later descriptor", append(append(field(1, []byte("edge")), alice...),
			field(2, append(field(1, entry("client_id", "bob")), field(1, entry("pa\xfeth", "/x"))...))...), "descriptors[1].entries[1].key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out []byte
			err := conn.Invoke(t.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &tt.raw, &out, grpc.ForceCodecV2(grpctest.RawCodec{}))
			want := tt.field + ": not valid UTF-8"
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
				t.Fatalf("err = %v, want InvalidArgument %q", err, want)
			}
		})
	}
	// The same connection still serves, and the bad requests consumed nothing.
	client := rlsv3.NewRateLimitServiceClient(conn)
	if bad := run(t.Context(), client, c, []step{
		{req: edge(desc("client_id", "alice")), want: answer(ok(2, limit("", 3, minute), 50))},
	}); len(bad) > 0 {
		t.Errorf("after invalid requests: %s", bad)
	}
}
