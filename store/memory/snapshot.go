package memory

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// The snapshot format is our own because it is the store's core: a header, then one record per
// key, each framed as uvarint(length) payload crc32c(payload), then an end record with the
// count. Per-record checksums let a reader keep every sound record, before and after damage
// (see resync), which a single gob or JSON document would lose whole.
const snapshotMagic = "SLUICE-SNAPSHOT\x00\x01"

// Record kinds, the first byte of a payload. A new kind must be known to loadRecord, and to
// verifies, or reading would never resume at a record of that kind after damage.
const (
	recBucket = 'b'
	// recIdem is an idempotency record bound to its batch's fingerprint. recIdemUnbound is
	// the record of earlier versions, without one: it is read and dropped, since it cannot
	// tell a retry from another request (a retry of one is decided afresh).
	recIdem        = 'f'
	recIdemUnbound = 'i'
	recEnd         = 'e'
	// maxRecord bounds a record's length: a longer claim is damage.
	maxRecord = 64 << 20
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// snapshotIfChanged writes the snapshot when anything changed since the last write.
func (s *Store) snapshotIfChanged() {
	// Cleared before writing: a change made while the file is written is written next time.
	if !s.changed.Swap(false) {
		return
	}
	if err := s.WriteSnapshot(s.snapshotPath); err != nil {
		s.log.Error("memory store: write snapshot", "path", s.snapshotPath, "err", err)
		s.changed.Store(true)
	}
}

// WriteSnapshot writes every live key to path atomically: a temporary file, synced, renamed.
// Each stripe's keys are listed under its lock, then each entry is encoded under its own.
func (s *Store) WriteSnapshot(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("snapshot dir: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".snapshot-*")
	if err != nil {
		return fmt.Errorf("create snapshot: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename this finds nothing
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := w.WriteString(snapshotMagic); err != nil {
		f.Close()
		return err
	}
	now := s.clock()
	var count uint64
	var buf, rec []byte
	type keyed struct {
		k string
		e *entry
	}
	var list []keyed
	for i := range s.shards {
		buf, list = buf[:0], list[:0]
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.entries(func(k string, e *entry) { list = append(list, keyed{k, e}) })
		sh.mu.Unlock()
		for _, ke := range list {
			ke.e.mu.Lock()
			if ke.e.idleAt > now {
				rec = encodeBucket(rec[:0], ke.k, ke.e)
				buf = frame(buf, rec)
				count++
			}
			ke.e.mu.Unlock()
		}
		is := &s.idem[i]
		is.mu.Lock()
		for k, e := range is.m {
			if e.idleAt > now {
				rec = encodeIdem(rec[:0], k, e)
				buf = frame(buf, rec)
				count++
			}
		}
		is.mu.Unlock()
		if _, err := w.Write(buf); err != nil {
			f.Close()
			return fmt.Errorf("write snapshot: %w", err)
		}
	}
	end := binary.AppendUvarint([]byte{recEnd}, count)
	if _, err := w.Write(frame(nil, end)); err != nil {
		f.Close()
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync snapshot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close snapshot: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("rename snapshot: %w", err)
	}
	return nil
}

func frame(dst, payload []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(payload)))
	dst = append(dst, payload...)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(payload, crcTable))
}

func encodeBucket(dst []byte, k string, e *entry) []byte {
	dst = append(dst, recBucket)
	dst = binary.AppendUvarint(dst, uint64(len(k)))
	dst = append(dst, k...)
	for _, v := range [...]int64{e.t, e.v, e.w, e.idleAt} {
		dst = binary.AppendVarint(dst, v)
	}
	var log []algorithm.Entry
	if e.log != nil {
		log = e.log.Entries
	}
	dst = binary.AppendUvarint(dst, uint64(len(log)))
	for _, le := range log {
		dst = binary.AppendVarint(dst, le.At)
		dst = binary.AppendVarint(dst, le.Cost)
	}
	// A sliding_window_counter's buckets follow, when it has any: a record without them (as
	// earlier versions wrote) reads as none.
	if e.log != nil && (len(e.log.Buckets) > 0 || len(e.log.Slots) > 0) {
		dst = binary.AppendVarint(dst, e.log.TickExp)
		dst = binary.AppendUvarint(dst, uint64(len(e.log.Buckets)))
		for _, b := range e.log.Buckets {
			dst = binary.AppendVarint(dst, b.First)
			dst = binary.AppendVarint(dst, b.Last)
			dst = binary.AppendVarint(dst, b.Count)
		}
	}
	// A concurrency key's slots follow the (then empty) buckets: leases in flight survive
	// a restart, as counts do.
	if e.log != nil && len(e.log.Slots) > 0 {
		dst = binary.AppendUvarint(dst, uint64(len(e.log.Slots)))
		for _, sl := range e.log.Slots {
			dst = binary.AppendUvarint(dst, uint64(len(sl.ID)))
			dst = append(dst, sl.ID...)
			dst = binary.AppendVarint(dst, sl.Expiry)
		}
	}
	return dst
}

func encodeIdem(dst []byte, k string, e *idemEntry) []byte {
	dst = append(dst, recIdem)
	dst = binary.AppendUvarint(dst, uint64(len(k)))
	dst = append(dst, k...)
	dst = binary.AppendVarint(dst, e.idleAt)
	dst = append(dst, e.fp[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(e.results)))
	for _, r := range e.results {
		var flags byte
		if r.Allowed {
			flags = 1
		}
		dst = append(dst, flags, byte(r.Reason))
		for _, v := range [...]int64{r.Remaining, r.ResetAfter, r.RetryAfter, r.Delay} {
			dst = binary.AppendVarint(dst, v)
		}
	}
	return dst
}

// loadFile reads a snapshot into the store, logging what it could not read. A file it could not
// read whole is kept aside under a name of its own (see keepAside): the next save would
// otherwise overwrite the only copy of what was skipped.
func (s *Store) loadFile(path string) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Error("memory store: open snapshot; starting empty", "path", path, "err", err)
		return
	}
	n, err := s.ReadSnapshot(f)
	f.Close()
	if err == nil {
		s.log.Info("memory store: snapshot loaded", "path", path, "records", n)
		return
	}
	attrs := []any{"path", path, "loaded", n}
	var de *DamageError
	if errors.As(err, &de) {
		skipped := any("unknown")
		if de.Skipped >= 0 {
			skipped = de.Skipped
		}
		attrs = append(attrs, "skipped", skipped, "damaged_bytes", de.Bytes)
	}
	aside, renameErr := s.keepAside(path)
	if renameErr != nil {
		s.log.Error("memory store: could not keep the damaged snapshot aside; the next save replaces it", "path", path, "err", renameErr)
	} else {
		attrs = append(attrs, "kept_aside", aside)
	}
	s.log.Error("memory store: snapshot damaged; loaded every sound record, skipped the damaged ones", append(attrs, "err", err)...)
}

// keepAside renames a damaged snapshot to path.damaged-TIME (the store's clock, UTC), so that
// it can be examined or repaired while the store saves a fresh one.
func (s *Store) keepAside(path string) (string, error) {
	aside := path + ".damaged-" + time.UnixMicro(s.clock()).UTC().Format("20060102T150405.000000Z")
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, nil
}

// ErrSnapshotDamaged is wrapped by ReadSnapshot's errors about the file's content.
var ErrSnapshotDamaged = errors.New("snapshot damaged")

// DamageError is ReadSnapshot's account of the damage it read past. It wraps
// ErrSnapshotDamaged.
type DamageError struct {
	// First is the first problem met.
	First error
	// Skipped is how many records were lost, by the end record's count, or -1 when the end
	// record was not read (the file ends early, or the end record itself is damaged).
	Skipped int
	// Regions is how many damaged stretches were skipped, and Bytes their total length.
	Regions, Bytes int
}

func (e *DamageError) Error() string {
	msg := fmt.Sprintf("%v: %v", ErrSnapshotDamaged, e.First)
	if e.Regions > 0 {
		msg += fmt.Sprintf(" (%d damaged stretch(es), %d bytes skipped", e.Regions, e.Bytes)
		if e.Skipped >= 0 {
			msg += fmt.Sprintf(", %d record(s) lost", e.Skipped)
		}
		msg += ")"
	}
	return msg
}

func (e *DamageError) Unwrap() error { return ErrSnapshotDamaged }

// ReadSnapshot loads the records of a snapshot into the store, skipping keys already idle, and
// returns how many records it read. A damaged record is skipped and reading resumes at the next
// sound one (see resync), so damage costs the records it touches, not every later one; the
// error, a *DamageError, then says what was skipped.
func (s *Store) ReadSnapshot(r io.Reader) (int, error) {
	// Whole, because resynchronising looks ahead of a damaged record. The file is an encoding
	// of the store's own state, so it fits beside it.
	data, err := io.ReadAll(r)
	if err != nil {
		return 0, fmt.Errorf("read snapshot: %w", err)
	}
	if !bytes.HasPrefix(data, []byte(snapshotMagic)) {
		return 0, &DamageError{First: errors.New("not a Sluice snapshot (bad header)"), Skipped: -1}
	}
	now := s.clock()
	var damage *DamageError
	noteDamage := func(from, to int, err error) {
		if damage == nil {
			damage = &DamageError{First: err, Skipped: -1}
		}
		damage.Regions++
		damage.Bytes += to - from
	}
	budget := resyncBudget(len(data))
	largest := 0 // the longest sound record so far, for resync
	n := 0
	for off := len(snapshotMagic); ; {
		if off == len(data) {
			err := fmt.Errorf("truncated after %d records (no end record)", n)
			if damage == nil {
				return n, &DamageError{First: err, Skipped: -1}
			}
			return n, damage
		}
		payload, next, err := frameAt(data, off)
		if err == nil && payload[0] == recEnd {
			want, _ := binary.Uvarint(payload[1:])
			switch {
			case damage == nil && want == uint64(n):
				return n, nil
			case damage == nil:
				return n, &DamageError{First: fmt.Errorf("end record counts %d records, read %d", want, n), Skipped: -1}
			case want >= uint64(n) && want-uint64(n) <= uint64(len(data)):
				damage.Skipped = int(want - uint64(n))
			}
			return n, damage
		}
		if err == nil {
			err = s.loadRecord(payload, now)
		}
		if err != nil {
			resume := resync(data, off, next, max(largest, minResyncRecord), &budget)
			if resume < 0 {
				noteDamage(off, len(data), fmt.Errorf("record at byte %d: %w", off, err))
				return n, damage
			}
			noteDamage(off, resume, fmt.Errorf("record at byte %d: %w", off, err))
			off = resume
			continue
		}
		n++
		largest = max(largest, len(payload))
		off = next
	}
}

// frameAt reads the frame at off: uvarint(length) payload crc32c(payload). It returns the
// payload and where the next frame starts, or an error and, when the length could be read,
// where that length says the frame ends.
func frameAt(data []byte, off int) (payload []byte, next int, err error) {
	size, w := binary.Uvarint(data[off:])
	if w <= 0 {
		return nil, -1, errors.New("truncated length")
	}
	if size == 0 || size > maxRecord {
		return nil, -1, fmt.Errorf("claims %d bytes", size)
	}
	start := off + w
	end := start + int(size)
	if end+4 > len(data) {
		return nil, -1, errors.New("truncated")
	}
	payload = data[start:end]
	if binary.LittleEndian.Uint32(data[end:]) != crc32.Checksum(payload, crcTable) {
		return nil, end + 4, errors.New("fails its checksum")
	}
	return payload, end + 4, nil
}

// loadRecord loads a bucket or idempotency record.
func (s *Store) loadRecord(payload []byte, now int64) error {
	switch payload[0] {
	case recBucket:
		return s.loadBucket(payload[1:], now)
	case recIdem:
		return s.loadIdem(payload[1:], now)
	case recIdemUnbound: // sound, counted, dropped
		return nil
	}
	return fmt.Errorf("unknown kind %q", payload[0])
}

// resync finds where reading resumes after the damaged record at off: the first offset past it
// where a whole frame verifies, that is a sane length, a known kind and a matching checksum.
// The file keeps no marker between records (so files written before this reader still read);
// the checksum is the marker: a stretch of damage passes for a record only if a CRC-32C of 32
// bits happens to match, and a record so misread ends at a frame that does not verify, which
// resynchronises again. next, where the damaged record's own length says it ends, is tried
// first: when only the payload is damaged, the next record starts there.
//
// The scan checksums only at offsets whose length and kind look right, and only lengths up to
// longest (the longest sound record so far, or minResyncRecord): in noise, a length read from
// random bytes is often megabytes, and checksumming that much at every offset would make the
// scan quadratic. The price is that a record longer than any before it, right after damage,
// is skipped with it. budget caps the bytes checksummed in all, as a last bound on time. It
// returns -1 when no frame verifies before the end or the budget runs out.
func resync(data []byte, off, next, longest int, budget *int) int {
	if next > off && next < len(data) && verifies(data, next, maxRecord, budget) {
		return next
	}
	for p := off + 1; p < len(data) && *budget > 0; p++ {
		if verifies(data, p, longest, budget) {
			return p
		}
	}
	return -1
}

// minResyncRecord is the longest record resync looks for before it has read a longer one: far
// above a bucket (tens of bytes) or an idempotency record, and a sliding log of thousands of
// entries.
const minResyncRecord = 64 << 10

// resyncBudget is the checksum work resync may spend on a file of size bytes: a multiple of
// the file, which CRC-32C (in hardware on amd64 and arm64) reads at gigabytes a second.
func resyncBudget(size int) int { return 64<<20 + 16*size }

// verifies tells whether a frame of at most longest bytes that passes every check starts at p.
func verifies(data []byte, p, longest int, budget *int) bool {
	size, w := binary.Uvarint(data[p:])
	if w <= 0 || size < 2 || size > uint64(longest) || p+w+int(size)+4 > len(data) {
		return false
	}
	payload := data[p+w : p+w+int(size)]
	switch payload[0] {
	case recBucket, recIdem, recIdemUnbound:
		// Every such record starts with its key's length, which fits in the record.
		if k, kw := binary.Uvarint(payload[1:]); kw <= 0 || k > uint64(len(payload)) {
			return false
		}
	case recEnd:
	default:
		return false
	}
	*budget -= len(payload)
	return binary.LittleEndian.Uint32(data[p+w+int(size):]) == crc32.Checksum(payload, crcTable)
}

// decoder reads varints from a record, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errors.New("malformed record")
	}
	d.b = nil
}

func (s *Store) loadBucket(b []byte, now int64) error {
	d := decoder{b: b}
	k := d.bytes(d.uvarint())
	var e entry
	e.t, e.v, e.w, e.idleAt = d.varint(), d.varint(), d.varint(), d.varint()
	var log *algorithm.Log
	if n := d.uvarint(); n > 0 {
		if n > uint64(len(d.b))/2 {
			d.fail()
		} else {
			log = &algorithm.Log{Entries: make([]algorithm.Entry, n)}
			for i := range log.Entries {
				log.Entries[i] = algorithm.Entry{At: d.varint(), Cost: d.varint()}
			}
		}
	}
	if len(d.b) > 0 {
		exp := d.varint()
		if n := d.uvarint(); n > algorithm.CounterSlots || n > uint64(len(d.b))/3 {
			d.fail()
		} else if n > 0 {
			if log == nil {
				log = &algorithm.Log{}
			}
			bs := make([]algorithm.Bucket, n, algorithm.CounterSlots)
			for i := range bs {
				bs[i] = algorithm.Bucket{First: d.varint(), Last: d.varint(), Count: d.varint()}
			}
			log.SetBuckets(bs, exp)
		}
	}
	if len(d.b) > 0 {
		if n := d.uvarint(); n > uint64(len(d.b))/2 {
			d.fail()
		} else if n > 0 {
			if log == nil {
				log = &algorithm.Log{}
			}
			log.Slots = make([]algorithm.Slot, n)
			for i := range log.Slots {
				log.Slots[i] = algorithm.Slot{ID: string(d.bytes(d.uvarint())), Expiry: d.varint()}
			}
		}
	}
	if d.err != nil {
		return d.err
	}
	if e.idleAt > now {
		h := s.hashOf(k)
		stored := s.shards[h%numShards].acquire(k, h, true)
		stored.t, stored.v, stored.w, stored.idleAt, stored.log = e.t, e.v, e.w, e.idleAt, log
		stored.mu.Unlock()
	}
	return nil
}

func (s *Store) loadIdem(b []byte, now int64) error {
	d := decoder{b: b}
	k := d.bytes(d.uvarint())
	e := &idemEntry{idleAt: d.varint()}
	copy(e.fp[:], d.bytes(uint64(len(e.fp))))
	n := d.uvarint()
	if n > uint64(len(d.b))/6 {
		d.fail()
		n = 0
	}
	for range n {
		flags := d.bytes(2)
		if flags == nil {
			break
		}
		e.results = append(e.results, algorithm.Result{
			Allowed: flags[0] == 1, Reason: algorithm.Reason(flags[1]),
			Remaining: d.varint(), ResetAfter: d.varint(), RetryAfter: d.varint(), Delay: d.varint(),
		})
	}
	if d.err != nil {
		return d.err
	}
	if e.idleAt > now {
		is := &s.idem[s.shardOf(k)]
		is.mu.Lock()
		is.m[string(k)] = e
		is.mu.Unlock()
	}
	return nil
}
