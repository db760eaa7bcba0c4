package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
	"unsafe"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/store"
)

// group splits the ops by hash slot; a single server takes them all in one call. Each group's
// args start with a place for batch.lua's head, which Apply fills. An op's log list goes in the
// keys only for sliding_window_log, the one algorithm that reads it.
func (s *Store) group(b *store.Batch, sc *scratch) []group {
	gs := sc.groups[:0]
	arena := sc.arena[:0]
	for i := range b.Ops {
		op := &b.Ops[i]
		gi := 0
		if s.cluster {
			slot := Slot(op.Key)
			gi = -1
			for j := range gs {
				if gs[j].slot == slot {
					gi = j
					break
				}
			}
			if gi < 0 {
				gs = addGroup(gs, slot)
				gi = len(gs) - 1
			}
		} else if len(gs) == 0 {
			gs = addGroup(gs, 0)
		}
		g := &gs[gi]
		g.ops = append(g.ops, i)
		var state, log string
		state, log, arena = redisKeys(arena, s.prefix, op.Key)
		g.keys = append(g.keys, state)
		if op.Params.Kind == algorithm.SlidingWindowLog || op.Params.Kind == algorithm.Concurrency {
			g.keys = append(g.keys, log) // a concurrency key's slots are a sorted set there
		}
		g.args = append(g.args, s.opString(op))
	}
	sc.groups, sc.arena = gs, arena
	return gs
}

// addGroup appends a group for slot to gs, reusing the slices of one an earlier call left
// beyond gs's length.
func addGroup(gs []group, slot uint16) []group {
	if len(gs) == cap(gs) {
		return append(gs, group{slot: slot, args: []string{""}})
	}
	gs = gs[:len(gs)+1]
	g := &gs[len(gs)-1]
	g.slot, g.record = slot, ""
	g.ops, g.keys, g.args = g.ops[:0], g.keys[:0], append(g.args[:0], "")
	return gs
}

// redisKeys appends a bucket key's Redis key, after the store's key prefix, and its log
// list's key to arena, as one string and its prefix (see redisKey).
func redisKeys(arena []byte, prefix string, k []byte) (state, log string, grown []byte) {
	start := len(arena)
	arena = append(arena, prefix...)
	tagged := len(key.HashTag(k)) < len(k)
	if !tagged {
		arena = append(arena, '{')
	}
	arena = append(arena, k...)
	if !tagged {
		arena = append(arena, '}')
	}
	arena = append(arena, ":log"...)
	// The bytes are never written again while the strings live: a call's scratch (and its
	// arena) is reused only once every round trip that read the strings has returned.
	log = unsafe.String(&arena[start], len(arena)-start)
	return log[:len(log)-len(":log")], log, arena
}

// scratch is what one Apply needs, pooled so that a request allocates next to nothing.
type scratch struct {
	groups   []group
	arena    []byte // the groups' key strings
	execs    []rueidis.LuaExec
	answers  []answer
	nows     []int64
	answered []bool
	fresh    []bool    // the group decided now
	decoded  [][]int64 // the uncoalesced path's replies, decoded (see decodeReply)
}

// vals returns group gi's buffer for a decoded reply, emptied.
func (sc *scratch) vals(gi int) []int64 {
	for len(sc.decoded) <= gi {
		sc.decoded = append(sc.decoded, nil)
	}
	return sc.decoded[gi][:0]
}

// size sizes the per-group slices for n groups, zeroed.
func (sc *scratch) size(n int) {
	sc.answers = resize(sc.answers, n)
	sc.nows = resize(sc.nows, n)
	sc.answered = resize(sc.answered, n)
	sc.fresh = resize(sc.fresh, n)
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// redisKey is the Redis key of a bucket key. A key without a hash tag gets its whole self as
// the tag, so its log list lands on the same slot.
func redisKey(k []byte) string {
	if tag := key.HashTag(k); len(tag) < len(k) {
		return string(k)
	}
	return "{" + string(k) + "}"
}

// key is the Redis key of a bucket key in this store: its key prefix, then redisKey.
func (s *Store) key(k []byte) string {
	if s.prefix == "" {
		return redisKey(k)
	}
	return s.prefix + redisKey(k)
}

// placeRecords names where each group remembers its part of an idempotent request's decision.
// A single server keeps one record per request. On a Cluster each slot of the request keeps its
// own part, so that a retry replays in one round trip; and the key's own slot (its caller's hash
// tag, usually a slot the request uses anyway) always takes part, with a group of no ops if
// need be: there any two requests with the key meet, so a reuse for another request is caught
// wherever its limits live. The name changes with the record's format ("idem2" came with
// fingerprints, "idem3" with batch.lua's compact op values): nodes of an earlier version,
// during a rolling upgrade, neither read nor misread these records.
func (s *Store) placeRecords(gs []group, id []byte) []group {
	sum := sha256.Sum256(id)
	name := key.Prefix + "idem3:" + hex.EncodeToString(sum[:16])
	if !s.cluster {
		gs[0].record = s.prefix + name
		return gs
	}
	tag := string(key.HashTag(id))
	if len(tag) == len(id) {
		tag = hex.EncodeToString(sum[:16]) // no caller: no attribute in plain in the name
	}
	own := s.prefix + "{" + tag + "}:" + name
	slot := Slot([]byte(own))
	found := false
	for gi := range gs {
		if gs[gi].slot == slot {
			gs[gi].record, found = own, true
		} else {
			gs[gi].record = s.prefix + "{" + string(key.HashTag([]byte(gs[gi].keys[0]))) + "}:" + name
		}
	}
	if !found {
		gs = addGroup(gs, slot)
		gs[len(gs)-1].record = own
	}
	return gs
}

// opCacheSize is how many op strings the store keeps, in a table of sets of two indexed by a
// hash of the op: a policy has few distinct limits and most requests cost 1, so nearly every
// op finds its string; per-request limits (Envoy's descriptor limit, a region's lowered global
// limits) and costs can make any number, and each new one takes the place of the older of its
// set rather than fill a map for good. Two to a set, so that two busy ops whose hashes meet
// do not evict each other on every request. A table rather than a sync.Map: hashing a whole
// opKey through an interface cost a tenth of the store's CPU per request (docs/measurements.md).
const opCacheSize = 1 << 10

// opKey is what an op string is made of.
type opKey struct {
	params algorithm.Params
	cost   int64
	mode   int8
	// bounds is a calendar window's table (nil for others): a new one each window, so the
	// string of the window before is not reused.
	bounds *algorithm.CalendarBounds
}

// opEntry is an op string and the op it was made of.
type opEntry struct {
	key opKey
	str string
}

// set is the first of the two slots where k's string may be kept: a mix of the fields that
// tell ops apart (the derived ones follow from them).
func (k *opKey) set() int {
	p := &k.params
	h := uint64(p.Kind)*0x9e3779b97f4a7c15 ^ uint64(p.Limit)*0xbf58476d1ce4e5b9 ^ uint64(p.Burst)*0x94d049bb133111eb ^
		uint64(p.Period)*0xd6e8feb86659fd93 ^ uint64(k.cost)*0xff51afd7ed558ccd ^ uint64(k.mode)
	return int((h ^ h>>29) & (opCacheSize - 2))
}

// nodeNow is the clock calendar bounds are computed around: the test clock when there is one,
// else this node's wall clock. Redis TIME decides; the bounds only need to hold it, and they
// span a whole window either side (algorithm.CalendarBounds).
func (s *Store) nodeNow() int64 {
	switch {
	case s.calClock != nil:
		return s.calClock()
	case s.now != nil:
		return s.now()
	}
	return time.Now().UnixMicro()
}

// opString is op as the scripts read it (see parse_op): the limit's parameters, its cost and
// its mode (0 binding, 1 shadow, 2 counter, 3 binding that drains on deny) in one string, formatted once per distinct op;
// then, for a calendar window, the four bounds of its table (algorithm.CalendarBounds); then,
// for a concurrency op that names a lease, "|ttl|id".
// One string rather than three: each ARGV value costs Redis a string object and a Lua string,
// and the script one more conversion.
func (s *Store) opString(op *store.Op) string {
	str := s.limitString(op)
	if op.Slot != nil && op.Params.Kind == algorithm.Concurrency {
		// The lease whose slot the op takes, renews or frees (see parse_op_slot): never
		// cached, as lease ids never repeat.
		return str + "|" + strconv.FormatInt(max(0, op.SlotTTL), 10) + "|" + string(op.Slot)
	}
	return str
}

// limitString is opString without a lease's slot.
func (s *Store) limitString(op *store.Op) string {
	k := opKey{params: *op.Params, cost: op.Cost}
	if cal := op.Params.Calendar(); cal != nil {
		k.bounds = cal.Bounds(s.nodeNow())
	}
	switch {
	case op.Counter:
		k.mode = 2
	case op.Shadow:
		k.mode = 1
	case op.Params.Drains():
		k.mode = 3 // binding, and drains on deny
	}
	set := s.ops[k.set():][:2]
	for i := range set {
		if e := set[i].Load(); e != nil && e.key == k {
			return e.str
		}
	}
	p := op.Params
	tick, tickExp, periodTicks, scale, rate, capacity := p.Derived()
	b := make([]byte, 0, 112)
	for i, v := range [...]int64{int64(p.Kind), p.Limit, p.Burst, p.Period, tick, tickExp, periodTicks, scale, rate, capacity, k.cost, int64(k.mode)} {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	if k.bounds != nil {
		for _, v := range k.bounds.B {
			b = append(b, ',')
			b = strconv.AppendInt(b, v, 10)
		}
	}
	str := string(b)
	set[1].Store(set[0].Load()) // the newest first; racing stores lose an entry, never mix one
	set[0].Store(&opEntry{key: k, str: str})
	return str
}
