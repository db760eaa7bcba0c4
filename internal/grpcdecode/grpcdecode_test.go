package grpcdecode

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/policy"
)

// wire encodes one length-delimited field by number, without checking UTF-8.
func wire(num int, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, protowire.Number(num), protowire.BytesType), v)
}

// cat joins wire-form fields into one message.
func cat(fields ...[]byte) []byte {
	var b []byte
	for _, f := range fields {
		b = append(b, f...)
	}
	return b
}

var (
	check  = (&sluicev1.CheckRequest{}).ProtoReflect().Descriptor()
	rlsReq = (&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor()
)

// TestInvalidUTF8Field names the first string that is not UTF-8 by its path: repeated fields
// by index, map values by key, as policy.Request's validation names them.
func TestInvalidUTF8Field(t *testing.T) {
	t.Parallel()
	// RateLimitRequest: domain (1), descriptors (2: entries (1: key 1, value 2)).
	// CheckRequest: tenant (1), user (2), descriptors (8, a map: key 1, value 2).
	entry := func(k, v string) []byte { return wire(1, cat(wire(1, []byte(k)), wire(2, []byte(v)))) }
	long := strings.Repeat("k", policy.MaxAttribute+1)
	cases := []struct {
		name string
		md   protoreflect.MessageDescriptor
		b    []byte
		want string
	}{
		{"valid", check, cat(wire(1, []byte("acme")), wire(8, cat(wire(1, []byte("k")), wire(2, []byte("v"))))), ""},
		{"top-level string", check, cat(wire(1, []byte("acme")), wire(2, []byte("al\xffice"))), "user"},
		{"map value named by its key", check, wire(8, cat(wire(1, []byte("path")), wire(2, []byte("/x\xff")))), "descriptors.path"},
		{"map value before its key on the wire", check, wire(8, cat(wire(2, []byte("/x\xff")), wire(1, []byte("path")))), "descriptors.path"},
		{"map key", check, wire(8, cat(wire(1, []byte("pa\xfeth")), wire(2, []byte("/x")))), "descriptors"},
		{"map value of an empty key", check, wire(8, wire(2, []byte("\xff"))), "descriptors"},
		{"map value of a key too long to repeat", check, wire(8, cat(wire(1, []byte(long)), wire(2, []byte("\xff")))), "descriptors"},
		{"second map entry", check, cat(wire(8, cat(wire(1, []byte("a")), wire(2, []byte("1")))), wire(8, cat(wire(1, []byte("b")), wire(2, []byte("\xc3("))))), "descriptors.b"},
		{"nested repeated", rlsReq, cat(wire(1, []byte("edge")), wire(2, entry("client_id", "al\xc3ice"))), "descriptors[0].entries[0].value"},
		{"later element", rlsReq, cat(wire(1, []byte("edge")), wire(2, entry("client_id", "alice")),
			wire(2, cat(entry("client_id", "bob"), entry("pa\xfeth", "/x")))), "descriptors[1].entries[1].key"},
		{"unknown field", check, wire(99, []byte("\xff")), ""},
		{"truncated", check, []byte{0x0a, 0x05, 'a'}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := InvalidUTF8Field(tc.md, tc.b); got != tc.want {
				t.Errorf("InvalidUTF8Field = %q, want %q", got, tc.want)
			}
		})
	}
}

// checker answers every Check with OK.
type checker struct {
	sluicev1.UnimplementedRateLimiterServer
}

func (checker) Check(context.Context, *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	return &sluicev1.CheckResponse{Allowed: true}, nil
}

// TestRegister sends requests that do not decode over a real gRPC connection: each is
// InvalidArgument naming the field or saying the request is malformed, not Internal, and
// counted as rejected; a valid one reaches the handler.
func TestRegister(t *testing.T) {
	t.Parallel()
	var rejected atomic.Int64 // the server's goroutines count; the test reads
	conn := grpctest.Serve(t, func(gs *grpc.Server) {
		Register(gs, &sluicev1.RateLimiter_ServiceDesc, checker{}, func() { rejected.Add(1) })
	})
	for i, tc := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"invalid UTF-8", wire(2, []byte("al\xffice")), "user: not valid UTF-8"},
		{"invalid UTF-8 in a descriptor value", wire(8, cat(wire(1, []byte("k")), wire(2, []byte("\xff")))), "descriptors.k: not valid UTF-8"},
		{"truncated", []byte{0x0a, 0x05, 'a'}, "malformed request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out []byte
			err := conn.Invoke(t.Context(), sluicev1.RateLimiter_Check_FullMethodName, &tc.raw, &out, grpc.ForceCodecV2(grpctest.RawCodec{}))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("err = %v, want InvalidArgument %q", err, tc.want)
			}
			if n := rejected.Load(); n != int64(i+1) {
				t.Errorf("rejected called %d times, want %d", n, i+1)
			}
		})
	}
	out, err := sluicev1.NewRateLimiterClient(conn).Check(t.Context(), &sluicev1.CheckRequest{User: "alice"})
	if err != nil || !out.GetAllowed() {
		t.Fatalf("valid request: %v, %v", out, err)
	}
}

// FuzzRawRequest decodes arbitrary bytes as the gRPC codec would hand them over, as each
// request message the servers register: never a panic, never a failure of the codec itself,
// an error exactly when proto.Unmarshal fails, and one that names a field or says the request
// is malformed.
func FuzzRawRequest(f *testing.F) {
	good, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge"})
	f.Add(good)
	f.Add([]byte("\x0a\x03e\xffe"))
	f.Add([]byte("\x12\x0b\x0a\x09\x0a\x01k\x12\x04v\xc3\x28x"))
	f.Add(cat(wire(1, []byte("acme")), wire(2, []byte("alice"))))
	f.Add(wire(8, cat(wire(1, []byte("k\xff")), wire(2, []byte("v")))))
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}) // cost -1
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{new(rlsv3.RateLimitRequest), new(sluicev1.CheckRequest), new(sluicev1.ResetRequest)} {
			want := proto.Unmarshal(b, proto.Clone(m))
			raw := rawRequest{m: m}
			if err := raw.Unmarshal(b); err != nil {
				t.Fatalf("Unmarshal returned %v; it must keep errors", err)
			}
			if (raw.err == nil) != (want == nil) {
				t.Fatalf("decode error %v, proto.Unmarshal says %v", raw.err, want)
			}
			if raw.err != nil && !strings.Contains(raw.err.Error(), "not valid UTF-8") && !strings.Contains(raw.err.Error(), "malformed request") {
				t.Fatalf("decode error %q names neither a field nor the problem", raw.err)
			}
		}
	})
}
