package sluice

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// Reservations (DESIGN.md, Work of unknown cost): Reserve decides like Check with the
// estimated cost and, when allowed, issues a lease; settling it with what the work really used
// gives the difference back to every limit the reservation took from, or takes the excess
// even past the limit. A lease nobody settles stays committed at what it reserved.

// DefaultLeaseTTL is a lease's life when Reserve is given none; MaxLeaseTTL the longest.
const (
	DefaultLeaseTTL = time.Minute
	MaxLeaseTTL     = time.Hour
)

// ErrUnknownLease is returned by Commit and Release for a lease the store does not hold for
// the caller's tenant: never issued, another tenant's, or expired (and so committed at what
// it reserved). Servers answer it with 404 or NotFound; nothing changes.
var ErrUnknownLease = store.ErrUnknownLease

// ErrLeaseSettled is returned by Renew for a lease already settled. Servers answer it with
// 409 or FailedPrecondition.
var ErrLeaseSettled = store.ErrLeaseSettled

// Lease is a reservation Reserve granted. Settle it once with Commit or Release; a repeated
// settlement answers as the first.
type Lease struct {
	// ID names the lease: unguessable, and good only with the tenant that reserved it.
	ID string
	// Reserved is the estimated cost the reservation took from each of its limits.
	Reserved  int64
	ExpiresAt time.Time
	// Tenant is the tenant the lease was reserved for (after the control plane's assignment).
	Tenant string

	l *Limiter
}

// Commit settles the lease with what the work used (Limiter.Commit).
func (le *Lease) Commit(ctx context.Context, used int64) (Settlement, error) {
	return le.l.Commit(ctx, le.Tenant, le.ID, used)
}

// Release settles the lease with nothing used: everything reserved goes back.
func (le *Lease) Release(ctx context.Context) (Settlement, error) {
	return le.l.Commit(ctx, le.Tenant, le.ID, 0)
}

// Renew keeps the unsettled lease alive for ttl from now (Limiter.Renew).
func (le *Lease) Renew(ctx context.Context, ttl time.Duration) error {
	if err := le.l.Renew(ctx, le.Tenant, le.ID, ttl); err != nil {
		return err
	}
	le.ExpiresAt = le.l.now().Add(ttl)
	return nil
}

// Settlement is the answer to settling a lease.
type Settlement struct {
	Lease    string
	Reserved int64
	// Used is what the lease was settled with: this settlement's, or the first one's when
	// Repeated.
	Used int64
	// Repeated is set when the lease was settled before: nothing changed now, and the answer
	// is the first settlement's.
	Repeated bool
	// Slots is how many concurrency slots this settlement freed: those the lease held (some
	// may have returned by themselves already); 0 when Repeated.
	Slots int
}

// leaseIDPrefix starts every lease id, so that a malformed one is told from an unknown one.
const leaseIDPrefix = "ls_"

// Reserve decides r like Check, with r.Cost the estimate, and, when allowed, consumes it and
// returns a lease good for ttl (0 takes DefaultLeaseTTL; at most MaxLeaseTTL). A denial
// returns a nil lease and d says why, as Check's; nothing is consumed. r must carry no
// idempotency key: a lease is its own handle on the work. The store must keep leases (the
// memory and Redis stores do).
func (l *Limiter) Reserve(ctx context.Context, r *Request, ttl time.Duration, d *Decision) (*Lease, error) {
	switch {
	case ttl == 0:
		ttl = DefaultLeaseTTL
	case ttl < time.Millisecond:
		return nil, &policy.FieldError{Field: "ttl", Msg: "must be at least 1ms"}
	case ttl > MaxLeaseTTL:
		return nil, &policy.FieldError{Field: "ttl", Msg: fmt.Sprintf("must be at most %s", MaxLeaseTTL)}
	}
	if r.IdempotencyKey != "" {
		return nil, &policy.FieldError{Field: "idempotency_key", Msg: "not taken by a reservation: its lease is the handle on the work"}
	}
	leaser, err := store.AsLeaser(l.store)
	if err != nil {
		return nil, fmt.Errorf("reserve: %w", err)
	}
	cost := r.Cost
	if cost == 0 {
		cost = 1
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("reserve: lease id: %w", err)
	}
	id := leaseIDPrefix + hex.EncodeToString(raw[:])
	// The lease id names the slot each concurrency limit takes: its settlement frees it.
	if err := l.decideLease(ctx, r, d, cost, &leaseAsk{slot: []byte(id), ttl: ttl.Microseconds()}); err != nil {
		return nil, err
	}
	if !d.Allowed {
		return nil, nil
	}
	lease := &Lease{ID: id, Reserved: cost, ExpiresAt: l.now().Add(ttl), Tenant: d.tenant, l: l}
	// A degraded decision was not the store's: it took nothing there to give back.
	rec := d.leaseRecord(cost, d.Degraded || d.Exempt)
	if err := leaser.PutLease(ctx, storeLeaseID(d.tenant, id), rec, ttl); err != nil {
		// Consumed, but no lease to settle: as a lease that expired, committed at the
		// estimate.
		return nil, fmt.Errorf("reserve: keep the lease: %w", err)
	}
	return lease, nil
}

// Commit settles the lease id of tenant with used (>= 0): what was reserved and not used goes
// back to every limit the reservation took from; used past the reservation is taken even past
// the limits. Settling is idempotent: a repeated settlement changes nothing and answers as
// the first (Settlement.Repeated). An unknown, expired or other tenant's lease is
// ErrUnknownLease; a malformed id or a bad used is policy.ErrInvalid.
func (l *Limiter) Commit(ctx context.Context, tenant, id string, used int64) (Settlement, error) {
	if used < 0 {
		return Settlement{}, &policy.FieldError{Field: "used", Msg: "must be >= 0"}
	}
	if used > policy.MaxCost {
		return Settlement{}, &policy.FieldError{Field: "used", Msg: fmt.Sprintf("must be <= %d", policy.MaxCost)}
	}
	if !validLeaseID(id) {
		return Settlement{}, &policy.FieldError{Field: "lease", Msg: "not a lease id (want " + leaseIDPrefix + " and 32 hex digits)"}
	}
	if err := (&policy.Request{Tenant: tenant}).Validate(); err != nil {
		return Settlement{}, err
	}
	leaser, err := store.AsLeaser(l.store)
	if err != nil {
		return Settlement{}, fmt.Errorf("commit: %w", err)
	}
	raw, firstUsed, first, err := leaser.SettleLease(ctx, storeLeaseID(tenant, id), used)
	if err != nil {
		if errors.Is(err, store.ErrUnknownLease) {
			return Settlement{}, fmt.Errorf("lease %s of tenant %q: %w", id, tenant, err)
		}
		return Settlement{}, fmt.Errorf("commit: %w", err)
	}
	rec, err := decodeLeaseRecord(raw)
	if err != nil {
		return Settlement{}, fmt.Errorf("commit: lease %s: %w", id, err)
	}
	s := Settlement{Lease: id, Reserved: rec.reserved, Used: firstUsed, Repeated: !first}
	if !first || len(rec.ops) == 0 {
		return s, nil
	}
	// The slots are freed whatever was used.
	ops, at, slots := rec.settleOps(id, rec.reserved-used, 0)
	s.Slots = slots
	if len(ops) == 0 {
		return s, nil
	}
	if err := leaser.Adjust(ctx, ops, at); err != nil {
		// The lease is settled: a retry answers as this one and adjusts nothing, so what
		// this one should have given back stays taken (quota lost, never double granted).
		return s, fmt.Errorf("commit: lease %s settled, limits not adjusted: %w", id, err)
	}
	return s, nil
}

// Renew sets the expiry of tenant's unsettled lease id to ttl from now (at most MaxLeaseTTL):
// long work keeps its reservation from being committed at the estimate by expiry. An unknown,
// expired or other tenant's lease is ErrUnknownLease, a settled one ErrLeaseSettled; nothing
// changes then.
func (l *Limiter) Renew(ctx context.Context, tenant, id string, ttl time.Duration) error {
	switch {
	case ttl < time.Millisecond:
		return &policy.FieldError{Field: "ttl", Msg: "must be at least 1ms"}
	case ttl > MaxLeaseTTL:
		return &policy.FieldError{Field: "ttl", Msg: fmt.Sprintf("must be at most %s", MaxLeaseTTL)}
	case !validLeaseID(id):
		return &policy.FieldError{Field: "lease", Msg: "not a lease id (want " + leaseIDPrefix + " and 32 hex digits)"}
	}
	if err := (&policy.Request{Tenant: tenant}).Validate(); err != nil {
		return err
	}
	leaser, err := store.AsLeaser(l.store)
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	raw, err := leaser.RenewLease(ctx, storeLeaseID(tenant, id), ttl)
	if err != nil {
		if errors.Is(err, store.ErrUnknownLease) || errors.Is(err, store.ErrLeaseSettled) {
			return fmt.Errorf("lease %s of tenant %q: %w", id, tenant, err)
		}
		return fmt.Errorf("renew: %w", err)
	}
	rec, err := decodeLeaseRecord(raw)
	if err != nil {
		return fmt.Errorf("renew: lease %s: %w", id, err)
	}
	// The slots the lease holds live on as long as it does; nothing else changes.
	ops, at, _ := rec.settleOps(id, 0, ttl.Microseconds())
	if len(ops) == 0 {
		return nil
	}
	if err := leaser.Adjust(ctx, ops, at); err != nil {
		return fmt.Errorf("renew: lease %s renewed, its slots not: %w", id, err)
	}
	return nil
}

// storeLeaseID binds a lease id to its tenant: a commit naming another tenant finds nothing.
func storeLeaseID(tenant, id string) []byte {
	b := make([]byte, 0, 8+len(tenant)+len(id))
	b = strconv.AppendInt(b, int64(len(tenant)), 10)
	b = append(b, ':')
	b = append(b, tenant...)
	b = append(b, ':')
	return append(b, id...)
}

func validLeaseID(id string) bool {
	if len(id) != len(leaseIDPrefix)+32 || id[:len(leaseIDPrefix)] != leaseIDPrefix {
		return false
	}
	_, err := hex.DecodeString(id[len(leaseIDPrefix):])
	return err == nil
}

// leaseRecordVersion starts a lease record: records live in Redis across versions of Sluice.
const leaseRecordVersion = 1

// leaseRecord encodes what settling needs: the estimate and, for each limit the reservation
// consumed from, its key, effective parameters and the instant it was decided at. Parameters
// travel with the lease, so a policy changed in between settles on the limits that were
// taken from. none records no limits (nothing the store took).
func (d *Decision) leaseRecord(reserved int64, none bool) []byte {
	b := []byte{leaseRecordVersion}
	b = binary.AppendVarint(b, reserved)
	n := 0
	if !none {
		for i := range d.ops {
			if d.leaseOp(i) {
				n++
			}
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for i := range d.ops {
		if n == 0 || !d.leaseOp(i) {
			continue
		}
		op := &d.ops[i]
		p := op.Params
		b = binary.AppendUvarint(b, uint64(len(op.Key)))
		b = append(b, op.Key...)
		b = append(b, byte(p.Kind))
		b = binary.AppendVarint(b, p.Limit)
		b = binary.AppendVarint(b, p.Burst)
		b = binary.AppendVarint(b, p.Period)
		b = binary.AppendVarint(b, d.opAt[i])
		zone, unit := "", byte(0)
		if cal := p.Calendar(); cal != nil {
			zone, unit = cal.Zone(), byte(cal.Unit())
		}
		b = append(b, unit)
		b = binary.AppendUvarint(b, uint64(len(zone)))
		b = append(b, zone...)
	}
	return b
}

// leaseOp reports whether op i consumed for the reservation: allowed, costing something, and
// a limit rather than an escalation counter (which counts requests, not cost).
func (d *Decision) leaseOp(i int) bool {
	return !d.ops[i].Counter && d.ops[i].Cost > 0 && d.algo[i].Allowed && i < len(d.opAt)
}

// decodedLease is a lease record read back.
type decodedLease struct {
	reserved int64
	ops      []store.Op
	at       []int64
}

// settleOps returns the ops of rec that settling lease id changes, in place of rec's, with
// their instants: every concurrency op names the lease's slot, renewed to slotTTL µs from
// now or freed at 0 (Op.Slot), and the others, when delta is not 0, give delta back (> 0)
// or take -delta more; slots counts the concurrency ops.
func (rec *decodedLease) settleOps(id string, delta, slotTTL int64) (ops []store.Op, at []int64, slots int) {
	slot := []byte(id)
	ops, at = rec.ops[:0], rec.at[:0]
	for i, op := range rec.ops {
		if op.Params.Kind == algorithm.Concurrency {
			op.Slot, op.SlotTTL = slot, slotTTL
			slots++
		} else if op.Cost = delta; delta == 0 {
			continue
		}
		ops, at = append(ops, op), append(at, rec.at[i])
	}
	return ops, at, slots
}

var errLeaseRecord = errors.New("malformed lease record")

func decodeLeaseRecord(b []byte) (*decodedLease, error) {
	if len(b) == 0 || b[0] != leaseRecordVersion {
		return nil, errLeaseRecord
	}
	b = b[1:]
	bad := false
	varint := func() int64 {
		v, n := binary.Varint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	bytesOf := func() []byte {
		v, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < v {
			bad = true
			return nil
		}
		out := b[n : n+int(v)]
		b = b[n+int(v):]
		return out
	}
	rec := &decodedLease{reserved: varint()}
	count, n := binary.Uvarint(b)
	if n <= 0 || count > 1024 {
		return nil, errLeaseRecord
	}
	b = b[n:]
	for range count {
		k := bytesOf()
		if bad || len(b) == 0 {
			return nil, errLeaseRecord
		}
		kind := algorithm.Kind(b[0])
		b = b[1:]
		limit, burst, period, at := varint(), varint(), varint(), varint()
		if bad || len(b) == 0 {
			return nil, errLeaseRecord
		}
		unit := algorithm.CalendarUnit(b[0])
		b = b[1:]
		zone := bytesOf()
		if bad {
			return nil, errLeaseRecord
		}
		p, err := algorithm.NewParams(kind, limit, burst, time.Duration(period)*time.Microsecond)
		if err == nil && len(zone) > 0 {
			var cal *algorithm.Calendar
			if cal, err = algorithm.NewCalendar(unit, string(zone)); err == nil {
				p, err = p.WithCalendar(cal)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errLeaseRecord, err)
		}
		rec.ops = append(rec.ops, store.Op{Key: append([]byte(nil), k...), Params: &p})
		rec.at = append(rec.at, at)
	}
	return rec, nil
}
