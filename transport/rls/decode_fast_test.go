package rls

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// request is an Envoy request of n descriptors of two entries each.
func request(n int) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 2}
	for i := range n {
		r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: "acme"}, {Key: "user", Value: "u" + string(rune('0'+i))},
		}})
	}
	return r
}

// nested is field num holding the message b.
func nested(num protowire.Number, b []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRequest: what Envoy sends is decoded by the fast path, exactly as protobuf decodes
// it; everything else is declined, for protobuf to decode or refuse.
func TestDecodeRequest(t *testing.T) {
	t.Parallel()
	withLimit := request(1)
	withLimit.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	withDescHits := request(1)
	withDescHits.Descriptors[0].HitsAddend = wrapperspb.UInt64(3)
	valid := marshal(t, request(4))
	for _, c := range []struct {
		name string
		b    []byte
		fast bool
	}{
		{"empty", nil, true},
		{"one descriptor", marshal(t, request(1)), true},
		{"four descriptors", valid, true},
		{"empty entry", marshal(t, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{}}}}}), true},
		{"domain twice (the last wins)", append(marshal(t, &rlsv3.RateLimitRequest{Domain: "a"}), marshal(t, &rlsv3.RateLimitRequest{Domain: "b"})...), true},
		{"limit override", marshal(t, withLimit), false},
		{"descriptor hits_addend", marshal(t, withDescHits), false},
		{"unknown field", protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), valid...), 9, protowire.VarintType), 1), false},
		{"domain not UTF-8", protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff}), false},
		{"value not UTF-8", nested(2, nested(1, protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte("v\xff")))), false},
		{"truncated", valid[:len(valid)-3], false},
		{"domain as a varint", protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fast := new(rlsv3.RateLimitRequest)
			if got := decodeRequest(c.b, fast); got != c.fast {
				t.Fatalf("fast path took it: %v, want %v", got, c.fast)
			}
			if c.fast {
				std := new(rlsv3.RateLimitRequest)
				if err := proto.Unmarshal(c.b, std); err != nil || !proto.Equal(fast, std) {
					t.Fatalf("fast %v, protobuf %v (%v)", fast, std, err)
				}
			}
		})
	}
}

// FuzzDecodeRequest holds the fast path to protobuf: whatever it decodes, protobuf decodes
// without error into an equal message.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(marshal(f, request(1)))
	f.Add(marshal(f, request(4)))
	f.Add(append(marshal(f, request(2)), marshal(f, request(1))...))
	f.Fuzz(func(t *testing.T, b []byte) {
		fast := new(rlsv3.RateLimitRequest)
		if !decodeRequest(b, fast) {
			return
		}
		std := new(rlsv3.RateLimitRequest)
		if err := proto.Unmarshal(b, std); err != nil {
			t.Fatalf("fast path decoded %x, which protobuf refuses: %v", b, err)
		}
		if !proto.Equal(fast, std) {
			t.Fatalf("%x: fast %v, protobuf %v", b, fast, std)
		}
	})
}

// BenchmarkDecodeRequest decodes a request of four descriptors by the fast path and by
// protobuf.
//
//	go test -run '^$' -bench BenchmarkDecodeRequest -benchmem ./transport/rls/
func BenchmarkDecodeRequest(b *testing.B) {
	wire := marshal(b, request(4))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !decodeRequest(wire, new(rlsv3.RateLimitRequest)) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(wire, new(rlsv3.RateLimitRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
