package grpcdecode

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// BenchmarkDecode is the strict decoding Register puts in front of every handler, on a valid
// request decoded by gRPC's own proto codec, as a generated handler asks for it.
func BenchmarkDecode(b *testing.B) {
	codec := encoding.GetCodecV2("proto")
	body, err := proto.Marshal(&sluicev1.CheckRequest{Tenant: "acme", User: "alice", Endpoint: "/api/items", Descriptors: map[string]string{"k": "v"}})
	if err != nil {
		b.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(body)}
	dec := func(m any) error { return codec.Unmarshal(data, m) }
	h := decodeErrors(func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(sluicev1.CheckRequest)
		return in, dec(in)
	}, nil, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h(nil, ctx, dec, nil); err != nil {
			b.Fatal(err)
		}
	}
}
