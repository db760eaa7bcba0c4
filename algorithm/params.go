// Package algorithm holds Sluice's six rate-limiting algorithms as pure state transitions: a
// function of (state, parameters, cost, now) with no clock, lock or I/O of its own.
//
// All arithmetic is on integers. Time is in microseconds; the bucket algorithms keep tokens in
// sub-units of 1/scale token so that refilling over any whole number of ticks is exact. Every
// intermediate value stays below 2^50, so the Redis Lua scripts, whose numbers are doubles,
// reproduce each decision exactly (docs/architecture.md, Lua twins: the memory store and Redis decide identically).
package algorithm

import (
	"errors"
	"fmt"
	"time"
)

// Kind names one of the six algorithms.
type Kind uint8

// The algorithms (docs/architecture.md, Algorithms).
const (
	TokenBucket Kind = iota + 1
	GCRA
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	// Concurrency limits leases in flight rather than a rate: nothing refills with time
	// (see TakeSlot).
	Concurrency
)

var kindNames = [...]string{
	TokenBucket:          "token_bucket",
	GCRA:                 "gcra",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	Concurrency:          "concurrency",
}

// Kinds lists every rate algorithm, in a stable order: Concurrency, which limits leases in
// flight rather than a rate, is not one of them.
var Kinds = []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// String returns the configuration name of k, such as "token_bucket".
func (k Kind) String() string {
	if k == 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("algorithm(%d)", uint8(k))
	}
	return kindNames[k]
}

// IsBucket reports whether k is one of the three equivalent bucket algorithms, which take a burst.
func (k Kind) IsBucket() bool { return k == TokenBucket || k == GCRA || k == LeakyBucket }

// ParseKind returns the Kind named s.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if kindNames[k] == s {
			return k, nil
		}
	}
	if s == kindNames[Concurrency] {
		return Concurrency, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter, concurrency)", s)
}

// Bounds on parameters. exactBound keeps every intermediate product exact in a float64 (2^53)
// with room for the sums the algorithms form from it.
const (
	MaxLimit   = 1 << 40
	MinPeriod  = time.Millisecond
	MaxPeriod  = 400 * 24 * time.Hour
	exactBound = 1 << 50
)

// ErrParams is wrapped by every error NewParams returns.
var ErrParams = errors.New("invalid limit parameters")

// Params are the effective parameters of one limit, with the derived integers its algorithm
// runs on. Build them with NewParams; the zero value is not usable.
type Params struct {
	Kind   Kind
	Limit  int64 // N per Period; 0 denies every request that costs something
	Burst  int64 // B, capacity of the bucket algorithms (equals Limit for windows)
	Period int64 // microseconds

	tick        int64 // microseconds per tick: the unit the algorithm counts time in
	tickExp     int64 // tick = 10^tickExp
	periodTicks int64
	scale       int64 // s: sub-units per token (bucket algorithms)
	rate        int64 // q: sub-units refilled per tick (bucket algorithms)
	capacity    int64 // Burst * scale
	// cal, when set, aligns a fixed_window to a time zone's calendar (WithCalendar); Period
	// is then the unit's nominal length, used for nothing the decision depends on.
	cal *Calendar
	// drain empties what is left of the limit when it denies a request (on_deny: drain).
	drain bool
}

// WithDrain returns p set to drain on deny (Gubernator's DRAIN_OVER_LIMIT): a request this
// limit denies empties what is left of it (Drain), so a client that bursts past the limit
// waits for a full refill. The bucket algorithms, fixed_window and sliding_window_log take it.
func (p Params) WithDrain() (Params, error) {
	if p.Kind == SlidingWindowCounter || p.Kind == Concurrency || p.Kind == 0 || int(p.Kind) >= len(kindNames) {
		return Params{}, fmt.Errorf("%w: on_deny drain applies to token_bucket, gcra, leaky_bucket, fixed_window and sliding_window_log, not %s", ErrParams, p.Kind)
	}
	p.drain = true
	return p, nil
}

// Drains reports whether p drains on deny (WithDrain).
func (p *Params) Drains() bool { return p.drain }

// WithCalendar returns p, a fixed_window, with its windows aligned to cal rather than to the
// Unix epoch; Period becomes the unit's nominal length (1d, 7d, 30d, 365d).
func (p Params) WithCalendar(cal *Calendar) (Params, error) {
	if p.Kind != FixedWindow {
		return Params{}, fmt.Errorf("%w: calendar windows apply only to fixed_window, not %s", ErrParams, p.Kind)
	}
	if cal == nil {
		return Params{}, fmt.Errorf("%w: nil calendar", ErrParams)
	}
	p.cal, p.Period = cal, cal.unit.Nominal().Microseconds()
	p.periodTicks = p.Period / p.tick
	return p, nil
}

// Calendar returns the calendar p's windows are aligned to, or nil for epoch-aligned windows.
func (p *Params) Calendar() *Calendar { return p.cal }

// NewParams validates and derives the parameters of a limit of n per period with burst b (b <= 0
// takes n). Time is counted in the finest tick (1 µs, else 10 µs, ...) that keeps the
// algorithm's arithmetic exact; an error says when no tick does.
func NewParams(kind Kind, n, b int64, period time.Duration) (Params, error) {
	if kind == 0 || int(kind) >= len(kindNames) {
		return Params{}, fmt.Errorf("%w: unknown algorithm %d", ErrParams, kind)
	}
	if n < 0 || n > MaxLimit {
		return Params{}, fmt.Errorf("%w: limit %d out of range [0, %d]", ErrParams, n, int64(MaxLimit))
	}
	if kind == Concurrency {
		// Leases in flight: no period, nothing refilling, counted in µs.
		if period != 0 {
			return Params{}, fmt.Errorf("%w: concurrency takes no period (nothing refills with time), got %s", ErrParams, period)
		}
		return Params{Kind: kind, Limit: n, Burst: n, tick: 1}, nil
	}
	if period < MinPeriod || period > MaxPeriod {
		return Params{}, fmt.Errorf("%w: period %s out of range [%s, %s]", ErrParams, period, MinPeriod, MaxPeriod)
	}
	if b <= 0 || !kind.IsBucket() || n == 0 {
		b = n
	}
	if b > MaxLimit {
		return Params{}, fmt.Errorf("%w: burst %d exceeds %d", ErrParams, b, int64(MaxLimit))
	}
	p := Params{Kind: kind, Limit: n, Burst: b, Period: period.Microseconds()}
	if p.Period*1000 != period.Nanoseconds() {
		return Params{}, fmt.Errorf("%w: period %s is not a whole number of microseconds", ErrParams, period)
	}
	for exp, tick := int64(0), int64(1); exp <= 6; exp, tick = exp+1, tick*10 {
		if p.Period%tick != 0 {
			break
		}
		p.tick, p.tickExp, p.periodTicks = tick, exp, p.Period/tick
		if p.fits() {
			return p, nil
		}
	}
	return Params{}, fmt.Errorf("%w: limit %d and burst %d per %s are too fine to count exactly; use a rounder limit or a shorter period", ErrParams, n, b, period)
}

// fits derives the bucket integers for the current tick and reports whether they stay exact.
func (p *Params) fits() bool {
	switch p.Kind {
	case TokenBucket, GCRA, LeakyBucket:
		if p.Limit == 0 {
			p.scale, p.rate, p.capacity = 1, 0, 0
			return true
		}
		g := gcd(p.Limit, p.periodTicks)
		p.scale, p.rate = p.periodTicks/g, p.Limit/g
		if p.scale > exactBound/p.Burst {
			return false
		}
		p.capacity = p.Burst * p.scale
		return true
	case SlidingWindowCounter:
		return p.Limit == 0 || p.periodTicks <= exactBound/(2*p.Limit)
	default:
		return true
	}
}

// fingerprint identifies the unit the bucket state of p is written in: tokens in 1/scale
// (token and leaky bucket) or TAT fractions in 1/rate tick (GCRA), counted in ticks of 10^tickExp µs.
// It is never 0, so a zero State is recognisably fresh.
func (p *Params) fingerprint() int64 {
	unit := p.scale
	if p.Kind == GCRA {
		unit = p.rate
		if unit == 0 {
			unit = 1
		}
	}
	return unit<<3 | p.tickExp
}

// Capacity is the most that a single request may cost: Burst for the bucket algorithms, Limit
// for the windows.
func (p *Params) Capacity() int64 {
	if p.Kind.IsBucket() {
		return p.Burst
	}
	return p.Limit
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv is ⌈a/b⌉ for a >= 0, b > 0. A rate of one sub-unit per tick is common (any limit
// that divides its period in ticks, such as 100 per minute), and skipping the division for it
// is measurable on the hot path.
func ceilDiv(a, b int64) int64 {
	if b == 1 {
		return a
	}
	return (a + b - 1) / b
}

// Derived returns the integers the algorithm runs on, for stores that run it elsewhere (the
// Redis scripts): the tick in µs and its exponent, the period in ticks, and for the bucket
// algorithms the sub-units per token (scale), refilled per tick (rate), and the capacity.
func (p *Params) Derived() (tick, tickExp, periodTicks, scale, rate, capacity int64) {
	return p.tick, p.tickExp, p.periodTicks, p.scale, p.rate, p.capacity
}
