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
	patterns := []string{globEscape(string(prefix)) + "*", "{" + globEscape(string(prefix)) + "*"}
	for addr, node := range s.client.Nodes() {
		for _, pat := range patterns {
			cursor := uint64(0)
			for {
				entry, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pat).Count(scanCount).Build()).AsScanEntry()
				if err != nil {
					return fmt.Errorf("%w: redis scan %s: %w", store.ErrUnavailable, addr, err)
				}
				for _, k := range entry.Elements {
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
// pipelined: zero for a key not held.
func (s *Store) ReadStates(ctx context.Context, _ algorithm.Kind, keys [][]byte, states []algorithm.State) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		cmds = append(cmds, s.client.B().Get().Key(redisKey(k)).Build())
	}
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		states[i] = algorithm.State{}
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

// parseState reads the "t:v:w" string the scripts store (lua/prelude.lua, save_state).
func parseState(raw string) (algorithm.State, bool) {
	parts := strings.Split(raw, ":")
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
