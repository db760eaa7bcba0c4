package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// scanCount is how many keys a SCAN step asks each server to look at: a few thousand keeps a
// step short on the server and the steps few.
const scanCount = 2000

// Keys calls f with every key held that starts with prefix (store.KeyDirectory), by SCAN on
// every server (each primary of a Cluster). A key whose bucket key has no hash tag is stored
// braced whole ({sl:...}), so both spellings are matched; f receives the bucket key.
func (s *Store) Keys(ctx context.Context, prefix []byte, f func(key []byte)) error {
	p := globEscape(s.prefix)
	patterns := []string{p + globEscape(string(prefix)) + "*", p + "{" + globEscape(string(prefix)) + "*"}
	for addr, node := range s.client.Nodes() {
		for _, pat := range patterns {
			cursor := uint64(0)
			for {
				entry, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pat).Count(scanCount).Build()).AsScanEntry()
				if err != nil {
					return fmt.Errorf("%w: redis scan %s: %w", store.ErrUnavailable, addr, err)
				}
				for _, k := range entry.Elements {
					k = strings.TrimPrefix(k, s.prefix)
					if strings.HasSuffix(k, ":log") {
						continue // a sliding_window_log's list, beside its state
					}
					if strings.HasPrefix(k, "{") && strings.HasSuffix(k, "}") {
						k = k[1 : len(k)-1]
					}
					f([]byte(k))
				}
				if cursor = entry.Cursor; cursor == 0 {
					break
				}
			}
		}
	}
	return nil
}

// globEscape escapes the characters SCAN's MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ReadStates sets states[i] to the state of keys[i] (store.StateReader) with one GET per key,
// pipelined: zero for a key not held. A fixed_window's state is a hash of window counts (see
// lua/prelude.lua, load_fixed), read with HGETALL: the latest window it holds.
func (s *Store) ReadStates(ctx context.Context, kind algorithm.Kind, keys [][]byte, states []algorithm.State) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	fixed := kind == algorithm.FixedWindow
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		if fixed {
			cmds = append(cmds, s.client.B().Hgetall().Key(s.key(k)).Build())
		} else {
			cmds = append(cmds, s.client.B().Get().Key(s.key(k)).Build())
		}
	}
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		states[i] = algorithm.State{}
		if fixed {
			counts, err := r.AsStrMap()
			if err == nil {
				states[i] = latestWindow(counts)
				continue
			}
			if !strings.Contains(err.Error(), "WRONGTYPE") {
				return fmt.Errorf("%w: redis read state: %w", store.ErrUnavailable, err)
			}
			// The "t:v:w" string of an earlier version.
			r = s.client.Do(ctx, s.client.B().Get().Key(s.key(keys[i])).Build())
		}
		raw, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: redis read state: %w", store.ErrUnavailable, err)
		}
		st, ok := parseState(raw)
		if !ok {
			return fmt.Errorf("redis read state of %q: %q is not t:v:w", keys[i], raw)
		}
		states[i] = st
	}
	return nil
}

// latestWindow is the fixed_window state of a hash of counts by window start: its latest
// window's. Fields that are not two integers are skipped.
func latestWindow(counts map[string]string) algorithm.State {
	var st algorithm.State
	for field, count := range counts {
		start, err1 := strconv.ParseInt(field, 10, 64)
		n, err2 := strconv.ParseInt(count, 10, 64)
		if err1 == nil && err2 == nil && start >= st.T {
			st = algorithm.State{T: start, V: n}
		}
	}
	return st
}

// parseState reads the "t:v:w" string the scripts store (lua/prelude.lua, save_state); a
// sliding_window_counter's buckets, after a fourth colon, are not part of what it returns.
func parseState(raw string) (algorithm.State, bool) {
	parts := strings.SplitN(raw, ":", 4)
	if len(parts) == 4 {
		parts = parts[:3]
	}
	if len(parts) != 3 {
		return algorithm.State{}, false
	}
	var n [3]int64
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return algorithm.State{}, false
		}
		n[i] = v
	}
	return algorithm.State{T: n[0], V: n[1], W: n[2]}, true
}

// The region inbox (region.Inbox): a stream of the Syncs from other regions that reached any
// node of this region, so that every node learns them. Its key starts like Sluice's other keys
// but cannot be a bucket key, whose second part is a rule version of 8 hex digits; on a Cluster
// the stream is one key, on one slot.
const (
	inboxKey = "sl:region:!inbox"
	// inboxMaxLen bounds the stream, trimmed approximately (whole macro nodes, cheaply) as
	// records are added: at ten Syncs a second from each of a few nodes of each other region,
	// minutes of them. A node that falls further behind reads what is left, and the other
	// regions' full sends (every 30 s) give it the rest.
	inboxMaxLen = 10000
	// inboxReadCount is the most records one read returns: a node that starts reads the
	// stream's backlog over a few syncs rather than in one large reply.
	inboxReadCount = 1000
	inboxField     = "m"
)

var inboxMaxLenArg = strconv.Itoa(inboxMaxLen)

// AppendInbox adds msgs to the region inbox in order, pipelined: one round trip
// (region.Inbox).
func (s *Store) AppendInbox(ctx context.Context, msgs [][]byte) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(msgs))
	for _, m := range msgs {
		cmds = append(cmds, s.client.B().Xadd().Key(s.inbox).Maxlen().Almost().Threshold(inboxMaxLenArg).
			Id("*").FieldValue().FieldValue(inboxField, rueidis.BinaryString(m)).Build())
	}
	for _, r := range s.client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("%w: redis append to region inbox: %w", store.ErrUnavailable, err)
		}
	}
	return nil
}

// ReadInbox returns up to inboxReadCount records of the region inbox added after cursor, a
// stream ID ("" reads from the oldest held), and the ID of the last one (region.Inbox). A
// record without the expected field is returned empty, for the caller to skip.
func (s *Store) ReadInbox(ctx context.Context, cursor string) ([][]byte, string, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	start := "-"
	if cursor != "" {
		start = "(" + cursor // exclusive (Redis 6.2)
	}
	entries, err := s.client.Do(ctx, s.client.B().Xrange().Key(s.inbox).Start(start).End("+").Count(inboxReadCount).Build()).AsXRange()
	if err != nil {
		return nil, cursor, fmt.Errorf("%w: redis read region inbox after %q: %w", store.ErrUnavailable, cursor, err)
	}
	if len(entries) == 0 {
		return nil, cursor, nil
	}
	msgs := make([][]byte, len(entries))
	for i, e := range entries {
		msgs[i] = []byte(e.FieldValues[inboxField])
	}
	return msgs, entries[len(entries)-1].ID, nil
}
