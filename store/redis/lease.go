package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// leaseKey is the Redis key of a lease record: its own hash tag, so records spread over a
// Cluster's slots.
func (s *Store) leaseKey(id []byte) string {
	return s.prefix + "lease:{" + string(id) + "}"
}

// PutLease keeps rec under id until ttl has passed (store.Leaser), as "U|" + rec (see
// lua/lease.lua).
func (s *Store) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	val := make([]byte, 0, 2+len(rec))
	val = append(append(val, "U|"...), rec...)
	cmd := s.client.B().Set().Key(s.leaseKey(id)).Value(rueidis.BinaryString(val)).Px(max(time.Millisecond, ttl)).Build()
	replies, err := s.do(ctx, nil, "", nil, rueidis.Commands{cmd})
	if err == nil {
		err = replies[0].Error()
	}
	if err != nil {
		return fmt.Errorf("%w: redis put lease: %w", store.ErrUnavailable, err)
	}
	return nil
}

// SettleLease settles the lease id once (store.Leaser), in one script call on the record's
// slot.
func (s *Store) SettleLease(ctx context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	exec := rueidis.LuaExec{Keys: []string{s.leaseKey(id)}, Args: []string{strconv.FormatInt(used, 10)}}
	replies, err := s.do(ctx, leaseScript, leaseFunction, []rueidis.LuaExec{exec}, nil)
	if err != nil {
		return nil, 0, false, fmt.Errorf("%w: redis settle lease: %w", store.ErrUnavailable, err)
	}
	msgs, err := replies[0].ToArray()
	if err != nil || len(msgs) == 0 {
		return nil, 0, false, fmt.Errorf("%w: redis settle lease: %v", store.ErrUnavailable, err)
	}
	status, err := msgs[0].AsInt64()
	if err != nil {
		return nil, 0, false, fmt.Errorf("%w: redis settle lease: %w", store.ErrUnavailable, err)
	}
	switch {
	case status == 0:
		return nil, 0, false, store.ErrUnknownLease
	case status == 1 && len(msgs) == 2:
		rec, err := msgs[1].ToString()
		if err != nil {
			return nil, 0, false, fmt.Errorf("%w: redis settle lease: %w", store.ErrUnavailable, err)
		}
		return []byte(rec), used, true, nil
	case status == 2 && len(msgs) == 3:
		first, err1 := msgs[1].ToString()
		rec, err2 := msgs[2].ToString()
		n, err3 := strconv.ParseInt(first, 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, 0, false, fmt.Errorf("%w: redis settle lease: malformed record", store.ErrUnavailable)
		}
		return []byte(rec), n, false, nil
	}
	return nil, 0, false, fmt.Errorf("%w: redis settle lease: script answered %d values, status %d", store.ErrUnavailable, len(msgs), status)
}

// RenewLease sets an unsettled lease's expiry to ttl from now (store.Leaser), in one script
// call on the record's slot.
func (s *Store) RenewLease(ctx context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	exec := rueidis.LuaExec{Keys: []string{s.leaseKey(id)}, Args: []string{strconv.FormatInt(max(1, ttl.Milliseconds()), 10)}}
	replies, err := s.do(ctx, renewScript, renewFunction, []rueidis.LuaExec{exec}, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: redis renew lease: %w", store.ErrUnavailable, err)
	}
	msgs, err := replies[0].ToArray()
	if err != nil || len(msgs) == 0 {
		return nil, fmt.Errorf("%w: redis renew lease: %v", store.ErrUnavailable, err)
	}
	status, err := msgs[0].AsInt64()
	if err != nil {
		return nil, fmt.Errorf("%w: redis renew lease: %w", store.ErrUnavailable, err)
	}
	switch {
	case status == 0:
		return nil, store.ErrUnknownLease
	case status == 2:
		return nil, store.ErrLeaseSettled
	case len(msgs) != 2:
		return nil, fmt.Errorf("%w: redis renew lease: script answered %d values", store.ErrUnavailable, len(msgs))
	}
	rec, err := msgs[1].ToString()
	if err != nil {
		return nil, fmt.Errorf("%w: redis renew lease: %w", store.ErrUnavailable, err)
	}
	return []byte(rec), nil
}

// Adjust settles a reservation on its limits (store.Leaser): the ops of each hash slot in one
// script call (lua/adjust.lua), all calls in one pipeline; on a single server one call, all
// or nothing. The time is Redis's, as for a batch.
func (s *Store) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	if len(ops) == 0 {
		return nil
	}
	if len(at) != len(ops) {
		return fmt.Errorf("redis adjust: %d instants for %d ops", len(at), len(ops))
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	now := ""
	if s.now != nil {
		now = strconv.FormatInt(s.now(), 10)
	}
	type slotCall struct {
		slot uint16
		at   int64
		keys []string
		args []string
	}
	var calls []slotCall
	for i := range ops {
		op := &ops[i]
		var ci int
		slot := uint16(0)
		if s.cluster {
			slot = Slot(op.Key)
		}
		// One call per slot and instant: a Cluster's slots decided at their own nodes' TIME.
		ci = -1
		for j := range calls {
			if calls[j].slot == slot && calls[j].at == at[i] {
				ci = j
				break
			}
		}
		if ci < 0 {
			calls = append(calls, slotCall{slot: slot, at: at[i], args: []string{now, strconv.FormatInt(at[i], 10), ""}})
			ci = len(calls) - 1
		}
		c := &calls[ci]
		state := s.key(op.Key)
		look := *op
		look.Cost = 0 // the op string's cost is not read: the delta follows it
		c.keys = append(c.keys, state, state+":log")
		c.args = append(c.args, s.opString(&look), strconv.FormatInt(op.Cost, 10))
	}
	execs := make([]rueidis.LuaExec, len(calls))
	for ci := range calls {
		calls[ci].args[2] = strconv.Itoa(len(calls[ci].keys) / 2)
		execs[ci] = rueidis.LuaExec{Keys: calls[ci].keys, Args: calls[ci].args}
	}
	replies, err := s.do(ctx, adjustScript, adjustFunction, execs, nil)
	if err != nil {
		return fmt.Errorf("%w: redis adjust: %w", store.ErrUnavailable, err)
	}
	for _, r := range replies {
		if err := r.Error(); err != nil {
			return fmt.Errorf("%w: redis adjust: %w", store.ErrUnavailable, err)
		}
	}
	return nil
}

var _ store.Leaser = (*Store)(nil)
