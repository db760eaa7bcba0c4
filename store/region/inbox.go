package region

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Inbox is a log, in the region's own store, of the Syncs that reached any node of the region.
// A load balancer sends each Sync of another region to one node; through the inbox every node
// of the region learns it, so that all of them subtract the same counts. The Redis store
// implements it; the memory store does not (a memory region is one node).
//
// Messages are opaque to the store. Counts are grow-only, so a message read twice, or read
// by the node that wrote it, changes nothing.
type Inbox interface {
	// AppendInbox adds msgs to the log, in order. The store may trim the oldest messages to
	// bound the log; what a node misses that way the others' periodic full sends restore.
	AppendInbox(ctx context.Context, msgs [][]byte) error
	// ReadInbox returns, in order, up to a store-chosen number of the messages added after
	// cursor ("" for the oldest held), and the cursor of the last one returned (cursor itself
	// when there is none). A cursor older than what the log still holds reads from its start.
	ReadInbox(ctx context.Context, cursor string) (msgs [][]byte, next string, err error)
}

// Inbox records are: a version byte, the writing node's id (8 bytes), the time the Sync
// arrived there (µs since the Unix epoch, 8 bytes, big-endian), then the Sync as a protobuf
// sluice.v1.SyncRequest (api/sluice/v1/regions.proto). The id lets a node skip its own
// records: it merged them when they arrived, and reading them again later could set a key's
// rate back to an older one.
//
// The SyncRequest is written and read here by hand (protowire), not with the generated type:
// the decorator imports no API package, the bytes are those proto.Marshal writes (fields in
// number order, zero values left out: TestInboxRecordMatchesProto), so nodes of either
// build share one inbox during an upgrade, and a node without the gRPC transport still shares
// its region's Syncs.
const (
	inboxVersion = 1
	inboxHeader  = 1 + 8 + 8
)

// inboxQueue bounds the records waiting to be appended: past it a Sync is merged here only
// (and the next full send tells the other nodes), so that a slow store never holds up a Sync.
const inboxQueue = 1024

// defaultResend is how often each node sends every peer all its tracked counts, not only
// those that changed (Config.Resend): a message a node of the peer region missed (a trimmed
// inbox, a restart, a failed append) is made good within this time.
const defaultResend = 30 * time.Second

// logEvery is the least time between two log lines of the same inbox failure.
const logEvery = 10 * time.Second

// errInboxRecord marks a record that cannot be read.
var errInboxRecord = errors.New("malformed region inbox record")

// newNodeID returns a random id for this node's inbox records.
func newNodeID() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; a time-based id is as good for
		// telling this process's records apart.
		return uint64(time.Now().UnixNano())
	}
	return binary.BigEndian.Uint64(b[:])
}

// Field numbers of sluice.v1.SyncRequest and sluice.v1.WindowCount.
const (
	fieldSyncRegion   protowire.Number = 1
	fieldSyncSentAt   protowire.Number = 2
	fieldSyncCounts   protowire.Number = 3
	fieldSyncInterval protowire.Number = 4

	fieldCountKey   protowire.Number = 1
	fieldCountStart protowire.Number = 2
	fieldCountCount protowire.Number = 3
	fieldCountRate  protowire.Number = 4
)

// encodeInbox returns the inbox record of msg, received at at (µs) by node.
func encodeInbox(node uint64, at int64, msg *SyncMessage) []byte {
	buf := make([]byte, inboxHeader, inboxHeader+syncSize(msg))
	buf[0] = inboxVersion
	binary.BigEndian.PutUint64(buf[1:], node)
	binary.BigEndian.PutUint64(buf[9:], uint64(at))
	return appendSync(buf, msg)
}

// syncSize is the size of msg as protobuf.
func syncSize(m *SyncMessage) int {
	n := 0
	if m.Region != "" {
		n += protowire.SizeTag(fieldSyncRegion) + protowire.SizeBytes(len(m.Region))
	}
	n += sizeInt(fieldSyncSentAt, m.SentAtUs)
	for i := range m.Counts {
		n += protowire.SizeTag(fieldSyncCounts) + protowire.SizeBytes(countSize(&m.Counts[i]))
	}
	return n + sizeInt(fieldSyncInterval, m.SyncIntervalUs)
}

// countSize is the size of c as protobuf.
func countSize(c *WindowCount) int {
	n := 0
	if len(c.Key) > 0 {
		n += protowire.SizeTag(fieldCountKey) + protowire.SizeBytes(len(c.Key))
	}
	n += sizeInt(fieldCountStart, c.WindowStartUs) + sizeInt(fieldCountCount, c.Count)
	if math.Float64bits(c.Rate) != 0 {
		n += protowire.SizeTag(fieldCountRate) + protowire.SizeFixed64()
	}
	return n
}

// sizeInt is the size of an int64 field of value v: none when 0, as proto3 leaves it out.
func sizeInt(num protowire.Number, v int64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(v))
}

// appendSync appends msg as protobuf, as proto.Marshal writes a sluice.v1.SyncRequest.
func appendSync(b []byte, m *SyncMessage) []byte {
	if m.Region != "" {
		b = protowire.AppendTag(b, fieldSyncRegion, protowire.BytesType)
		b = protowire.AppendString(b, m.Region)
	}
	b = appendInt(b, fieldSyncSentAt, m.SentAtUs)
	for i := range m.Counts {
		c := &m.Counts[i]
		b = protowire.AppendTag(b, fieldSyncCounts, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(countSize(c)))
		if len(c.Key) > 0 {
			b = protowire.AppendTag(b, fieldCountKey, protowire.BytesType)
			b = protowire.AppendBytes(b, c.Key)
		}
		b = appendInt(b, fieldCountStart, c.WindowStartUs)
		b = appendInt(b, fieldCountCount, c.Count)
		// proto3 leaves out a double whose bits are 0: -0 is written.
		if bits := math.Float64bits(c.Rate); bits != 0 {
			b = protowire.AppendTag(b, fieldCountRate, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, bits)
		}
	}
	return appendInt(b, fieldSyncInterval, m.SyncIntervalUs)
}

// appendInt appends an int64 field unless it is 0.
func appendInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

// decodeInbox reads an inbox record. It checks only the record's framing and wire format;
// the Sync is checked by checkSync like one that came from a peer.
func decodeInbox(rec []byte) (node uint64, at int64, msg *SyncMessage, err error) {
	if len(rec) < inboxHeader {
		return 0, 0, nil, fmt.Errorf("%w: %d bytes, shorter than its header", errInboxRecord, len(rec))
	}
	if rec[0] != inboxVersion {
		return 0, 0, nil, fmt.Errorf("%w: version %d, want %d", errInboxRecord, rec[0], inboxVersion)
	}
	node = binary.BigEndian.Uint64(rec[1:])
	at = int64(binary.BigEndian.Uint64(rec[9:]))
	if at <= 0 {
		return 0, 0, nil, fmt.Errorf("%w: received at %d", errInboxRecord, at)
	}
	msg = &SyncMessage{}
	if err := parseSync(rec[inboxHeader:], msg); err != nil {
		return 0, 0, nil, fmt.Errorf("%w: %w", errInboxRecord, err)
	}
	return node, at, msg, nil
}

// errWire marks protobuf that does not parse.
var errWire = errors.New("not a sluice.v1.SyncRequest")

// parseSync reads a sluice.v1.SyncRequest into m as proto.Unmarshal would: the last of a
// repeated scalar wins, fields of unknown number or of another wire type are skipped, and the
// region must be UTF-8.
func parseSync(b []byte, m *SyncMessage) error {
	return parseFields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fieldSyncRegion && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 {
				if !utf8.Valid(v) {
					return 0, fmt.Errorf("%w: region is not UTF-8", errWire)
				}
				m.Region = string(v)
			}
			return n, nil
		case num == fieldSyncSentAt && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.SentAtUs = int64(v)
			return n, nil
		case num == fieldSyncInterval && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.SyncIntervalUs = int64(v)
			return n, nil
		case num == fieldSyncCounts && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			var c WindowCount
			if err := parseCount(v, &c); err != nil {
				return 0, err
			}
			m.Counts = append(m.Counts, c)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// parseCount reads a sluice.v1.WindowCount into c.
func parseCount(b []byte, c *WindowCount) error {
	return parseFields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fieldCountKey && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 {
				c.Key = v
			}
			return n, nil
		case num == fieldCountStart && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			c.WindowStartUs = int64(v)
			return n, nil
		case num == fieldCountCount && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			c.Count = int64(v)
			return n, nil
		case num == fieldCountRate && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			c.Rate = math.Float64frombits(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// parseFields calls field for each field of the protobuf message b with the bytes after its
// tag; field returns how many it read (< 0: malformed).
func parseFields(b []byte, field func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: field number %d", errWire, num)
		}
		b = b[n:]
		m, err := field(num, typ, b)
		if err != nil {
			return err
		}
		if m < 0 {
			return fmt.Errorf("%w: field %d: %w", errWire, num, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}

// postInbox queues msg, received at now, for the inbox, without waiting: when the queue is
// full the record is dropped and counted.
func (r *Region) postInbox(msg *SyncMessage, now int64) {
	if r.inbox == nil {
		return
	}
	rec := encodeInbox(r.nodeID, now, msg)
	select {
	case r.inboxQ <- rec:
	default:
		r.inboxDropped.Add(1)
		r.inboxLostQueue.Add(1)
	}
}

// inboxTimeout bounds one append or read of the inbox: a sync or two, within 50 ms to the
// peer timeout, so that a stalled store delays the inbox by little more than the store's own
// timeout would.
func (r *Region) inboxTimeout() time.Duration {
	return min(max(2*r.cfg.Sync, 50*time.Millisecond), r.cfg.Timeout)
}

// writeInbox appends the queued records, as many as are waiting in one call, until Stop.
func (r *Region) writeInbox() {
	defer r.done.Done()
	var (
		failed, dropped int64
		lastLog         time.Time
		lastErr         error
	)
	batch := make([][]byte, 0, 64)
	for {
		select {
		case <-r.stop:
			return
		case rec := <-r.inboxQ:
			batch = append(batch[:0], rec)
		}
	drain:
		for len(batch) < cap(batch) {
			select {
			case rec := <-r.inboxQ:
				batch = append(batch, rec)
			default:
				break drain
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.inboxTimeout())
		err := r.inbox.AppendInbox(ctx, batch)
		cancel()
		if err != nil {
			failed += int64(len(batch))
			r.inboxLostAppend.Add(uint64(len(batch)))
			lastErr = err
		}
		clear(batch) // the records are not kept past the append
		dropped += r.inboxDropped.Swap(0)
		// The counts were merged on this node all the same, and the next full send tells the
		// others: a line now and then says the region's nodes may disagree meanwhile.
		if (failed > 0 || dropped > 0) && time.Since(lastLog) >= logEvery {
			r.log.Warn("region inbox: Syncs not shared with this region's other nodes (merged here only)",
				"failed", failed, "dropped_queue_full", dropped, "err", lastErr)
			failed, dropped, lastErr, lastLog = 0, 0, nil, time.Now()
		}
	}
}

// readInbox merges, every sync until Stop, the records other nodes of the region appended.
func (r *Region) readInbox() {
	defer r.done.Done()
	t := time.NewTicker(r.cfg.Sync)
	defer t.Stop()
	var (
		cursor       string
		errs, bad    int64
		lastLog      time.Time
		lastErr, why error
	)
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
		msgs, next, err := r.inbox.ReadInbox(ctx, cursor)
		cancel()
		if err != nil {
			errs++
			lastErr = err
		} else {
			cursor = next
			for _, rec := range msgs {
				if err := r.mergeInbox(rec); err != nil {
					bad++
					r.inboxSkipped.Add(1)
					why = err
				}
			}
		}
		if (errs > 0 || bad > 0) && time.Since(lastLog) >= logEvery {
			r.log.Warn("region inbox: reading the Syncs other nodes of this region received failed",
				"read_errors", errs, "err", lastErr, "records_skipped", bad, "why", why)
			errs, bad, lastErr, why, lastLog = 0, 0, nil, nil, time.Now()
		}
	}
}

// mergeInbox merges one inbox record, unless this node wrote it. A record that does not read
// or check is skipped whole.
func (r *Region) mergeInbox(rec []byte) error {
	node, at, msg, err := decodeInbox(rec)
	if err != nil {
		return err
	}
	if node == r.nodeID {
		return nil
	}
	pi, counts, err := r.checkSync(msg)
	if err != nil {
		return fmt.Errorf("%w: %w", errInboxRecord, err)
	}
	// The time it arrived in the region is the age of its counts; a node whose clock runs
	// behind the writer's must not take it for news from the future.
	at = min(at, r.nowMicros())
	r.receive(pi, counts, at)
	p := r.peers[pi]
	p.stale.arrived(msg.SentAtUs, at)
	storeMax(&p.fromPeer, at)
	storeMax(&p.heard, at)
	return nil
}

// checkSync checks a peer's message whole and returns the peer's index and the counts. A
// field that does not check is a *FieldError naming it.
func (r *Region) checkSync(msg *SyncMessage) (int, []entry, error) {
	pi, ok := r.byName[msg.Region]
	if !ok {
		return 0, nil, invalid("region", "%q is not in this region's --regions", msg.Region)
	}
	counts := make([]entry, len(msg.Counts))
	for i := range msg.Counts {
		c := &msg.Counts[i]
		switch {
		case len(c.Key) == 0 || len(c.Key) > maxKeyLen:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].key", i), "must be 1 to %d bytes", maxKeyLen)
		case c.WindowStartUs < 0:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].window_start_us", i), "negative")
		case c.Count < 0:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].count", i), "negative")
		case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || (c.Rate < 0 && c.Rate != -1):
			return 0, nil, invalid(fmt.Sprintf("counts[%d].rate", i), "must be >= 0, or -1 for none")
		}
		counts[i] = entry{key: c.Key, start: c.WindowStartUs, count: c.Count, rate: c.Rate}
	}
	return pi, counts, nil
}

// storeMax sets a to v unless it holds more: Syncs merged directly and read from the inbox
// race, and a time must not go back.
func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}
