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

	"github.com/sluicehq/sluice/algorithm"
)

// The snapshot format is our own because it is the store's core: a header, then one record per
// key, each framed as uvarint(length) payload crc32c(payload), then an end record with the
// count. Per-record checksums let a reader keep every sound record before damage, which a
// single gob or JSON document would lose whole.
const snapshotMagic = "SLUICE-SNAPSHOT\x00\x01"

const (
	recBucket = 'b'
	// recIdem is an idempotency record bound to its batch's fingerprint. recIdemUnbound is
	// the record of earlier versions, without one: it is read and dropped, since it cannot
	// tell a retry from another request (a retry of one is decided afresh).
	recIdem        = 'f'
	recIdemUnbound = 'i'
	recEnd         = 'e'
	// maxRecord bounds a record's claimed length so a corrupt length cannot make us allocate
	// gigabytes.
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

// loadFile reads a snapshot into the store, logging what it could not read.
func (s *Store) loadFile(path string) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Error("memory store: open snapshot; starting empty", "path", path, "err", err)
		return
	}
	defer f.Close()
	n, err := s.ReadSnapshot(f)
	if err != nil {
		s.log.Error("memory store: snapshot damaged; kept the records before the damage", "path", path, "loaded", n, "err", err)
		return
	}
	s.log.Info("memory store: snapshot loaded", "path", path, "records", n)
}

// ErrSnapshotDamaged is wrapped by ReadSnapshot's errors about the file's content.
var ErrSnapshotDamaged = errors.New("snapshot damaged")

// ReadSnapshot loads the records of a snapshot into the store, skipping keys already idle, and
// returns how many it read. On a damaged or truncated file it keeps the records before the
// damage and returns an error saying where.
func (s *Store) ReadSnapshot(r io.Reader) (int, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	head := make([]byte, len(snapshotMagic))
	if _, err := io.ReadFull(br, head); err != nil || string(head) != snapshotMagic {
		return 0, fmt.Errorf("%w: not a Sluice snapshot (bad header)", ErrSnapshotDamaged)
	}
	now := s.clock()
	var buf bytes.Buffer
	for n := 0; ; n++ {
		size, err := binary.ReadUvarint(br)
		if err != nil {
			return n, fmt.Errorf("%w: truncated after %d records (no end record)", ErrSnapshotDamaged, n)
		}
		if size == 0 || size > maxRecord {
			return n, fmt.Errorf("%w: record %d claims %d bytes", ErrSnapshotDamaged, n, size)
		}
		// Grow with the bytes that really arrive, not with what a damaged length claims.
		buf.Reset()
		if _, err := io.CopyN(&buf, br, int64(size)); err != nil {
			return n, fmt.Errorf("%w: record %d truncated", ErrSnapshotDamaged, n)
		}
		payload := buf.Bytes()
		var sum [4]byte
		if _, err := io.ReadFull(br, sum[:]); err != nil {
			return n, fmt.Errorf("%w: record %d truncated", ErrSnapshotDamaged, n)
		}
		if binary.LittleEndian.Uint32(sum[:]) != crc32.Checksum(payload, crcTable) {
			return n, fmt.Errorf("%w: record %d fails its checksum", ErrSnapshotDamaged, n)
		}
		switch payload[0] {
		case recEnd:
			want, _ := binary.Uvarint(payload[1:])
			if want != uint64(n) {
				return n, fmt.Errorf("%w: end record counts %d records, read %d", ErrSnapshotDamaged, want, n)
			}
			return n, nil
		case recBucket:
			if err := s.loadBucket(payload[1:], now); err != nil {
				return n, fmt.Errorf("%w: record %d: %v", ErrSnapshotDamaged, n, err)
			}
		case recIdem:
			if err := s.loadIdem(payload[1:], now); err != nil {
				return n, fmt.Errorf("%w: record %d: %v", ErrSnapshotDamaged, n, err)
			}
		case recIdemUnbound: // sound, counted, dropped
		default:
			return n, fmt.Errorf("%w: record %d has unknown kind %q", ErrSnapshotDamaged, n, payload[0])
		}
	}
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
	if d.err != nil {
		return d.err
	}
	if e.idleAt > now {
		stored := s.shards[s.shardOf(k)].acquire(k, true)
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
