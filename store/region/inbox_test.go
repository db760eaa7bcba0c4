package region

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// The Redis store keeps the region inbox.
var _ Inbox = (*redis.Store)(nil)

// TestInboxRecordRoundTrip: a record reads back as written.
func TestInboxRecordRoundTrip(t *testing.T) {
	t.Parallel()
	msg := &SyncMessage{Region: "eu", SentAtUs: 12, SyncIntervalUs: 100_000,
		Counts: []WindowCount{{Key: []byte("sl:q:00000000"), WindowStartUs: 60_000_000, Count: 3, Rate: 1.5}}}
	rec := encodeInbox(42, 1_700_000_000_000_000, msg)
	node, at, got, err := decodeInbox(rec)
	if err != nil {
		t.Fatal(err)
	}
	if node != 42 || at != 1_700_000_000_000_000 || !reflect.DeepEqual(got, msg) {
		t.Fatalf("read back node %d at %d %+v, want 42 at 1700000000000000 %+v", node, at, got, msg)
	}
}

// syncProto is msg as the generated sluice.v1.SyncRequest.
func syncProto(msg *SyncMessage) *sluicev1.SyncRequest {
	req := &sluicev1.SyncRequest{Region: msg.Region, SentAtUs: msg.SentAtUs, SyncIntervalUs: msg.SyncIntervalUs}
	for _, c := range msg.Counts {
		req.Counts = append(req.Counts, &sluicev1.WindowCount{Key: c.Key, WindowStartUs: c.WindowStartUs, Count: c.Count, Rate: c.Rate})
	}
	return req
}

// protoRecord is the inbox record of req as the nodes before the move wrote it: the header,
// then proto.Marshal's bytes.
func protoRecord(t testing.TB, node uint64, at int64, req *sluicev1.SyncRequest) []byte {
	t.Helper()
	buf := make([]byte, inboxHeader)
	buf[0] = inboxVersion
	binary.BigEndian.PutUint64(buf[1:], node)
	binary.BigEndian.PutUint64(buf[9:], uint64(at))
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, req)
	if err != nil {
		t.Fatal(err)
	}
	return buf
}

// TestInboxRecordMatchesProto: the records this package writes by hand are byte for byte
// those the generated SyncRequest made, and it reads those back as they were, so nodes of
// both builds share one inbox during an upgrade.
func TestInboxRecordMatchesProto(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		msg  SyncMessage
	}{
		{"empty", SyncMessage{}},
		{"heartbeat", SyncMessage{Region: "eu", SentAtUs: 1_700_000_000_000_000, SyncIntervalUs: 100_000}},
		{"counts", SyncMessage{Region: "ap-south", SentAtUs: 5, SyncIntervalUs: 1, Counts: []WindowCount{
			{Key: []byte("sl:q:00000000:ann"), WindowStartUs: 60_000_000, Count: 3, Rate: 1.5},
			{Key: []byte("sl:q:00000000:bob"), WindowStartUs: 0, Count: 0, Rate: 0},
			{Key: []byte("sl:q:00000000:cy"), WindowStartUs: 1, Count: 1 << 40, Rate: -1},
		}}},
		{"negative zero rate", SyncMessage{Region: "eu", Counts: []WindowCount{{Key: []byte("k"), Rate: math.Copysign(0, -1)}}}},
		{"empty count", SyncMessage{Region: "eu", Counts: []WindowCount{{}}}},
		{"negatives", SyncMessage{Region: "eu", SentAtUs: -1, SyncIntervalUs: -7, Counts: []WindowCount{{Key: []byte("k"), WindowStartUs: -5, Count: -1, Rate: -3}}}},
		{"long key", SyncMessage{Region: "eu", Counts: []WindowCount{{Key: bytes.Repeat([]byte("k"), 4096), Count: 9}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := protoRecord(t, 7, 1_700_000_000_000_001, syncProto(&tc.msg))
			got := encodeInbox(7, 1_700_000_000_000_001, &tc.msg)
			if !bytes.Equal(got, want) {
				t.Fatalf("record\n%x, the proto's\n%x", got, want)
			}
			_, _, back, err := decodeInbox(want)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(syncProto(back), syncProto(&tc.msg)) {
				t.Fatalf("read back %+v, want %+v", back, tc.msg)
			}
		})
	}
}

// FuzzSyncWire: whatever the bytes, the hand-written reader accepts what proto.Unmarshal
// accepts, refuses what it refuses, and reads the same message.
func FuzzSyncWire(f *testing.F) {
	for _, m := range []*SyncMessage{
		{Region: "eu", SentAtUs: 1, SyncIntervalUs: 2, Counts: []WindowCount{{Key: []byte("sl:q:0:a"), WindowStartUs: 3, Count: 4, Rate: -1}}},
		{Region: "eu", Counts: []WindowCount{{}, {Key: []byte("x")}}},
	} {
		f.Add(appendSync(nil, m))
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})       // region not UTF-8
	f.Add([]byte{0x08, 0x01, 0x10, 0x05})       // region of the wrong wire type
	f.Add([]byte{0x1a, 0x03, 0x08, 0x01, 0x2a}) // a count cut short
	f.Add([]byte{0x2b, 0x08, 0x01, 0x2c})       // a group
	f.Fuzz(func(t *testing.T, b []byte) {
		var got SyncMessage
		err := parseSync(b, &got)
		var want sluicev1.SyncRequest
		perr := proto.Unmarshal(b, &want)
		if (err == nil) != (perr == nil) {
			t.Fatalf("%x: parseSync %v, proto.Unmarshal %v", b, err, perr)
		}
		// Fields this package does not know are skipped; the generated type keeps them.
		want.ProtoReflect().SetUnknown(nil)
		for _, c := range want.Counts {
			c.ProtoReflect().SetUnknown(nil)
		}
		if err == nil && !proto.Equal(syncProto(&got), &want) {
			t.Fatalf("%x: read %+v, proto.Unmarshal %v", b, got, &want)
		}
	})
}

// TestMemoryRegionHasNoInbox: a memory store's region is one node, and keeps no inbox.
func TestMemoryRegionHasNoInbox(t *testing.T) {
	t.Parallel()
	mem := memory.New(memory.WithSweepInterval(0))
	defer mem.Close()
	r, err := New(Config{Name: "us", Peers: map[string]string{"eu": "127.0.0.1:1"}}, mem, mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.inbox != nil {
		t.Fatal("a memory region keeps an inbox")
	}
}

// FuzzInboxRecord: whatever a record holds, merging it neither panics nor merges a count a
// Sync could not carry.
func FuzzInboxRecord(f *testing.F) {
	mem := memory.New(memory.WithSweepInterval(0))
	defer mem.Close()
	r, err := New(Config{Name: "us", Peers: map[string]string{"eu": "127.0.0.1:1"}}, mem, mem, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, msg := range []*SyncMessage{
		{Region: "eu", SentAtUs: 1, Counts: []WindowCount{{Key: []byte("sl:q:00000000:a"), WindowStartUs: 0, Count: 1, Rate: -1}}},
		{Region: "eu"},
		{Region: "mars"},
	} {
		f.Add(encodeInbox(1, 5, msg))
	}
	f.Add([]byte{})
	f.Add([]byte{inboxVersion})
	f.Fuzz(func(t *testing.T, rec []byte) {
		if err := r.mergeInbox(rec); err != nil {
			return
		}
		r.table.mu.RLock()
		defer r.table.mu.RUnlock()
		for k, rk := range r.table.keys {
			for _, pc := range rk.per {
				for _, w := range pc.win {
					if w.count < 0 || w.start < 0 || len(k) == 0 || len(k) > maxKeyLen {
						t.Fatalf("merged %q %+v from %x", k, w, rec)
					}
				}
			}
		}
	})
}
