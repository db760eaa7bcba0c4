package rls

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzRawRequest decodes arbitrary bytes as the gRPC codec would hand them over: never a
// panic, never a failure of the codec itself, and a message that decodes has no error.
func FuzzRawRequest(f *testing.F) {
	good, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge"})
	f.Add(good)
	f.Add([]byte("\x0a\x03e\xffe"))
	f.Add([]byte("\x12\x0b\x0a\x09\x0a\x01k\x12\x04v\xc3\x28x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := rawRequest{m: &rlsv3.RateLimitRequest{}}
		if err := r.Unmarshal(b); err != nil {
			t.Fatalf("Unmarshal failed: %v", err)
		}
		if (proto.Unmarshal(b, &rlsv3.RateLimitRequest{}) == nil) != (r.err == nil) {
			t.Fatalf("decode error %v disagrees with proto.Unmarshal", r.err)
		}
	})
}
