package rls_test

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/transport/rls"
)

// checkAnswer fails unless ShouldRateLimit answered a well-formed response or InvalidArgument.
func checkAnswer(t *testing.T, in *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, err error) {
	t.Helper()
	if err != nil {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("error %v for %v", err, in)
		}
		return
	}
	if len(resp.Statuses) != len(in.GetDescriptors()) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(in.GetDescriptors()))
	}
	over := false
	for _, st := range resp.Statuses {
		switch st.Code {
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over = true
			if st.CurrentLimit == nil || st.LimitRemaining != 0 {
				t.Fatalf("OVER_LIMIT status %v", st)
			}
		case rlsv3.RateLimitResponse_OK:
		default:
			t.Fatalf("status code %v", st.Code)
		}
		if (st.CurrentLimit == nil) != (st.DurationUntilReset == nil) {
			t.Fatalf("current_limit and duration_until_reset disagree: %v", st)
		}
	}
	if over != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
		t.Fatalf("overall %v with statuses %v", resp.OverallCode, resp.Statuses)
	}
}

// FuzzShouldRateLimit builds requests field by field, including shapes the wire cannot carry
// (nil descriptors and entries), and calls the Server directly.
func FuzzShouldRateLimit(f *testing.F) {
	srv, c := newServer(f, rls.Options{ResponseHeaders: true}, nil)
	f.Add("edge", "client_id", "alice", uint8(1), uint32(0), uint64(0), false, uint32(0), int32(0), uint8(0), int64(0))
	f.Add("edge", "client_id", "team-x", uint8(3), uint32(2), uint64(0), true, uint32(0), int32(0), uint8(0), int64(1e6))
	f.Add("edge", "tenant", "acme", uint8(2), uint32(1<<31), uint64(1<<63), true, uint32(5), int32(3), uint8(0), int64(0))
	f.Add("edge", "path", "/beta", uint8(0), uint32(0), uint64(0), false, uint32(1), int32(99), uint8(7), int64(-1))
	f.Add("", "", "", uint8(1), uint32(0), uint64(0), false, uint32(0), int32(-1), uint8(255), int64(0))
	f.Fuzz(func(t *testing.T, domain, key, value string, ndesc uint8, hitsAddend uint32, descHits uint64,
		hasDescHits bool, rpu uint32, unit int32, flags uint8, advance int64) {
		c.us.Add(advance % 1e12) // the clock may go back: a store must cope with both
		in := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hitsAddend}
		for i := range int(ndesc % 6) {
			if flags&1 != 0 && i == 1 {
				in.Descriptors = append(in.Descriptors, nil)
				continue
			}
			d := &commonv3.RateLimitDescriptor{}
			k, v := key, value
			for j := range i%3 + 1 {
				if flags&2 != 0 && j == 1 {
					d.Entries = append(d.Entries, nil)
					continue
				}
				d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
				// A deeper level that the configuration knows.
				k, v = "quota", "daily"
			}
			if hasDescHits {
				d.HitsAddend = wrapperspb.UInt64(descHits >> (i * 8))
			}
			if flags&4 != 0 {
				d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit(unit)}
			}
			d.IsNegativeHits = flags&8 != 0 && i == 2
			in.Descriptors = append(in.Descriptors, d)
		}
		resp, err := srv.ShouldRateLimit(t.Context(), in)
		checkAnswer(t, in, resp, err)
	})
}

// FuzzShouldRateLimitWire feeds requests decoded from arbitrary bytes, as the gRPC server
// would, to the Server directly.
func FuzzShouldRateLimitWire(f *testing.F) {
	srv, _ := newServer(f, rls.Options{ResponseHeaders: true}, nil)
	for _, r := range []*rlsv3.RateLimitRequest{
		edge(desc("client_id", "alice")),
		hits(3, edge(descHits(0, desc("client_id", "gold")), desc("path", "/health"))),
		edge(descLimit(2, typev3.RateLimitUnit_DAY, desc("tenant", "acme", "quota", "daily"))),
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(b, in) != nil {
			return
		}
		resp, err := srv.ShouldRateLimit(t.Context(), in)
		checkAnswer(t, in, resp, err)
	})
}
