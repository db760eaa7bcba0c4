// Package grpctest serves gRPC services on loopback for tests, and sends bytes that a
// well-behaved protobuf library refuses to marshal.
package grpctest

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// Serve starts a gRPC server on a free loopback port, lets register add its services, and
// returns a client connection to it. Both stop when the test ends, and an error from Serve
// other than its stopping fails the test.
func Serve(t testing.TB, register func(gs *grpc.Server)) *grpc.ClientConn {
	t.Helper()
	gs := grpc.NewServer()
	register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		gs.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

// RawCodec sends and receives *[]byte as they are, so a test can put on the wire what a
// well-behaved protobuf library refuses to marshal (a string that is not UTF-8). It is named
// "proto", so the server decodes with its usual codec; pass it to one call with
// grpc.ForceCodecV2(grpctest.RawCodec{}).
type RawCodec struct{}

// Marshal sends *v.
func (RawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

// Unmarshal keeps the answer's bytes in *v.
func (RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// Name is "proto": the codec the server expects.
func (RawCodec) Name() string { return "proto" }
