// Package breaker guards a store: every call gets a deadline of a few milliseconds, and a
// circuit breaker (sony/gobreaker) opens on a run of failures or on the error rate, skips the
// store while open so no request waits on a dead store, probes it half-open and closes on
// success. While the store is skipped, the limiter decides by each rule's on_store_error.
//
// The deadline bounds a call only if the inner store returns by its context's deadline, as
// store.Store requires (the Redis store does so whatever its client library is doing). A
// timeout is a failure of the store; a call whose caller went away (its own context ended) is
// counted neither way.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Options tune the guard; zero values take the defaults.
type Options struct {
	// Timeout is every call's deadline (default 10 ms); with MaxTimeout, the least one.
	Timeout time.Duration
	// MaxTimeout, when above Timeout, makes the deadline adaptive (deadline.go): three times
	// the 99.9th percentile of the last 10 s of calls, between Timeout and MaxTimeout. 0 keeps
	// the fixed Timeout.
	MaxTimeout time.Duration
	// FailureRatio opens the breaker when at least this share of calls failed (default 0.5)...
	FailureRatio float64
	// ...among at least MinCalls in the last Interval (default 20). MinCalls failures in a
	// row open it too once they have gone on for FailingFor, however many calls succeeded
	// before: a store that stops answering fails every call, and must not wait for its
	// failures to outweigh the successes of the seconds before.
	MinCalls uint32
	// FailingFor is how long a run of failures must last to open the breaker (default
	// 200 ms): long enough that a burst of slow calls (a pause of the collector, a busy
	// moment of the store) does not skip the store for a whole OpenFor.
	FailingFor time.Duration
	// Interval is the rolling window the closed breaker counts calls over (default 10 s, in
	// ten steps).
	Interval time.Duration
	// OpenFor is how long the breaker stays open before it probes (default 1 s).
	OpenFor time.Duration
	// Probes is how many calls a half-open breaker lets through (default 5).
	Probes uint32
	// OnStateChange is told of every change (closed, half-open, open), for logs and metrics.
	OnStateChange func(from, to string)

	now func() time.Duration // the adaptive deadline's monotonic clock; tests set it
}

// Store is a guarded store.
type Store struct {
	inner    store.Store
	timeout  time.Duration
	adaptive *deadline // nil: the fixed timeout
	cb       *gobreaker.CircuitBreaker[bool]
}

// New guards inner.
func New(inner store.Store, o Options) *Store {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Millisecond
	}
	if o.FailureRatio <= 0 {
		o.FailureRatio = 0.5
	}
	if o.MinCalls == 0 {
		o.MinCalls = 20
	}
	if o.FailingFor <= 0 {
		o.FailingFor = 200 * time.Millisecond
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.OpenFor <= 0 {
		o.OpenFor = time.Second
	}
	if o.Probes == 0 {
		o.Probes = 5
	}
	// When the current run of failures began, in the breaker's own monotonic time. gobreaker
	// calls ReadyToTrip on every failure of a closed breaker, with the run's length so far.
	epoch := time.Now()
	var runStart atomic.Int64
	st := gobreaker.Settings{
		Name:        "store",
		MaxRequests: o.Probes,
		// A rolling window rather than a fixed one, which forgets everything at once and
		// then cannot open on the ratio until MinCalls calls came again.
		Interval:     o.Interval,
		BucketPeriod: max(o.Interval/10, time.Millisecond),
		Timeout:      o.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			now := int64(time.Since(epoch))
			if c.ConsecutiveFailures <= 1 {
				runStart.Store(now)
			}
			hung := c.ConsecutiveFailures >= o.MinCalls && now-runStart.Load() >= int64(o.FailingFor)
			// Requests counts calls still in flight: the ratio errs toward staying closed.
			return hung || c.Requests >= o.MinCalls && float64(c.TotalFailures) >= o.FailureRatio*float64(c.Requests)
		},
		// A store that refused a reused idempotency key answered: a success.
		IsSuccessful: func(err error) bool { return err == nil || errors.Is(err, store.ErrIdempotencyMismatch) },
		// A caller that gave up says nothing about the store; counted as a success, it could
		// close a half-open breaker on a probe that never heard from the store.
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerGone) },
	}
	if o.OnStateChange != nil {
		st.OnStateChange = func(_ string, from, to gobreaker.State) { o.OnStateChange(from.String(), to.String()) }
	}
	s := &Store{inner: inner, timeout: o.Timeout, cb: gobreaker.NewCircuitBreaker[bool](st)}
	if o.MaxTimeout > o.Timeout {
		if o.now == nil {
			o.now = func() time.Duration { return time.Since(epoch) }
		}
		s.adaptive = newDeadline(o.Timeout, o.MaxTimeout, o.now)
	}
	return s
}

// Deadline returns the deadline the next call gets.
func (s *Store) Deadline() time.Duration {
	if s.adaptive == nil {
		return s.timeout
	}
	return s.adaptive.get()
}

// call runs f under the guard's deadline and, when it is adaptive, counts how long f took,
// unless its caller gave up (which says nothing of the store).
func (s *Store) call(ctx context.Context, f func(context.Context) (bool, error)) (bool, error) {
	timeout, start := s.timeout, time.Duration(0)
	if s.adaptive != nil {
		timeout, start = s.adaptive.get(), s.adaptive.now()
	}
	call, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	replayed, err := f(call)
	err = gone(ctx, err)
	if s.adaptive != nil && !errors.Is(err, errCallerGone) {
		s.adaptive.record(s.adaptive.now() - start)
	}
	return replayed, err
}

// State returns the breaker's state: closed, half-open or open.
func (s *Store) State() string { return s.cb.State().String() }

// boundedApplier is a store that returns by a deadline it is given, whatever its backend does,
// without a context made for it (the Redis store): the guard then makes none per call.
type boundedApplier interface {
	ApplyBy(ctx context.Context, deadline time.Time, b *store.Batch, results []algorithm.Result) (bool, error)
}

// Apply calls the store within the deadline, unless the breaker is open.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	if ba, ok := s.inner.(boundedApplier); ok {
		replayed, err := s.cb.Execute(func() (bool, error) { return s.applyBy(ctx, ba, b, results) })
		return replayed, wrap(err)
	}
	replayed, err := s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) { return s.inner.Apply(call, b, results) })
	})
	return replayed, wrap(err)
}

// applyBy is call for a boundedApplier's Apply.
func (s *Store) applyBy(ctx context.Context, ba boundedApplier, b *store.Batch, results []algorithm.Result) (bool, error) {
	timeout, start := s.timeout, time.Duration(0)
	if s.adaptive != nil {
		timeout, start = s.adaptive.get(), s.adaptive.now()
	}
	replayed, err := ba.ApplyBy(ctx, time.Now().Add(timeout), b, results)
	err = gone(ctx, err)
	if s.adaptive != nil && !errors.Is(err, errCallerGone) {
		s.adaptive.record(s.adaptive.now() - start)
	}
	return replayed, err
}

// Reset calls the store within the deadline, unless the breaker is open.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	_, err := s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) { return false, s.inner.Reset(call, keys) })
	})
	return wrap(err)
}

// errCallerGone marks a failed call whose caller's own context ended (canceled, or a deadline
// sooner than the guard's), which the breaker does not count.
var errCallerGone = errors.New("caller gone")

// gone marks err with errCallerGone when the caller's context ended: the store may have been
// fine, only not given its time.
func gone(caller context.Context, err error) error {
	if err == nil {
		return nil
	}
	// A caller whose deadline has passed is gone though its context may not say so yet: its
	// timer and the store's, set to the same instant, race.
	if d, ok := caller.Deadline(); caller.Err() != nil || ok && !time.Now().Before(d) {
		return fmt.Errorf("%w (%w)", err, errCallerGone)
	}
	return err
}

// Close closes the store.
func (s *Store) Close() error { return s.inner.Close() }

func wrap(err error) error {
	switch {
	case err == nil || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrIdempotencyMismatch):
		return err
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		return fmt.Errorf("%w: circuit breaker %v", store.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
}
