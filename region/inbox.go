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

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
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
// arrived there (µs since the Unix epoch, 8 bytes, big-endian), then the SyncRequest as
// protobuf. The id lets a node skip its own records: it merged them when they arrived, and
// reading them again later could set a key's rate back to an older one.
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

// encodeInbox returns the inbox record of req, received at at (µs) by node.
func encodeInbox(node uint64, at int64, req *sluicev1.SyncRequest) ([]byte, error) {
	buf := make([]byte, inboxHeader, inboxHeader+proto.Size(req))
	buf[0] = inboxVersion
	binary.BigEndian.PutUint64(buf[1:], node)
	binary.BigEndian.PutUint64(buf[9:], uint64(at))
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, req)
	if err != nil {
		return nil, fmt.Errorf("encode region inbox record: %w", err)
	}
	return buf, nil
}

// decodeInbox reads an inbox record. It checks only the record's framing; the SyncRequest is
// checked by checkSync like one that came over gRPC.
func decodeInbox(rec []byte) (node uint64, at int64, req *sluicev1.SyncRequest, err error) {
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
	req = &sluicev1.SyncRequest{}
	if err := proto.Unmarshal(rec[inboxHeader:], req); err != nil {
		return 0, 0, nil, fmt.Errorf("%w: %w", errInboxRecord, err)
	}
	return node, at, req, nil
}

// postInbox queues req, received at now, for the inbox, without waiting: when the queue is
// full the record is dropped and counted.
func (r *Region) postInbox(req *sluicev1.SyncRequest, now int64) {
	if r.inbox == nil {
		return
	}
	rec, err := encodeInbox(r.nodeID, now, req)
	if err != nil {
		r.inboxDropped.Add(1)
		r.inboxLostQueue.Add(1)
		return
	}
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
	node, at, req, err := decodeInbox(rec)
	if err != nil {
		return err
	}
	if node == r.nodeID {
		return nil
	}
	pi, counts, err := r.checkSync(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errInboxRecord, err)
	}
	// The time it arrived in the region is the age of its counts; a node whose clock runs
	// behind the writer's must not take it for news from the future.
	at = min(at, r.nowMicros())
	r.receive(pi, counts, at)
	p := r.peers[pi]
	p.stale.arrived(req.GetSentAtUs(), at)
	storeMax(&p.fromPeer, at)
	storeMax(&p.heard, at)
	return nil
}

// checkSync checks a peer's message whole and returns the peer's index and the counts.
func (r *Region) checkSync(req *sluicev1.SyncRequest) (int, []entry, error) {
	pi, ok := r.byName[req.GetRegion()]
	if !ok {
		return 0, nil, invalid("region", "%q is not in this region's --regions", req.GetRegion())
	}
	counts := make([]entry, len(req.GetCounts()))
	for i, c := range req.GetCounts() {
		switch {
		case len(c.GetKey()) == 0 || len(c.GetKey()) > maxKeyLen:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].key", i), "must be 1 to %d bytes", maxKeyLen)
		case c.GetWindowStartUs() < 0:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].window_start_us", i), "negative")
		case c.GetCount() < 0:
			return 0, nil, invalid(fmt.Sprintf("counts[%d].count", i), "negative")
		case math.IsNaN(c.GetRate()) || math.IsInf(c.GetRate(), 0) || (c.GetRate() < 0 && c.GetRate() != -1):
			return 0, nil, invalid(fmt.Sprintf("counts[%d].rate", i), "must be >= 0, or -1 for none")
		}
		counts[i] = entry{key: c.GetKey(), start: c.GetWindowStartUs(), count: c.GetCount(), rate: c.GetRate()}
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
