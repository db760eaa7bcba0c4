// Package breaker guards a store: every call gets a deadline of a few milliseconds, and a
// circuit breaker (sony/gobreaker) opens on the error rate, skips the store while open so no
// request waits on a dead store, probes it half-open and closes on success. While the store is
// skipped, the limiter decides by each rule's on_store_error.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Options tune the guard; zero values take the defaults.
type Options struct {
	// Timeout is every call's deadline (default 10 ms).
	Timeout time.Duration
	// FailureRatio opens the breaker when at least this share of calls failed (default 0.5)...
	FailureRatio float64
	// ...among at least MinCalls in the current interval (default 20).
	MinCalls uint32
	// Interval is how long the closed breaker counts before it starts over (default 10 s).
	Interval time.Duration
	// OpenFor is how long the breaker stays open before it probes (default 1 s).
	OpenFor time.Duration
	// Probes is how many calls a half-open breaker lets through (default 5).
	Probes uint32
	// OnStateChange is told of every change (closed, half-open, open), for logs and metrics.
	OnStateChange func(from, to string)
}

// Store is a guarded store.
type Store struct {
	inner   store.Store
	timeout time.Duration
	cb      *gobreaker.CircuitBreaker[bool]
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
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.OpenFor <= 0 {
		o.OpenFor = time.Second
	}
	if o.Probes == 0 {
		o.Probes = 5
	}
	st := gobreaker.Settings{
		Name:        "store",
		MaxRequests: o.Probes,
		Interval:    o.Interval,
		Timeout:     o.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= o.MinCalls && float64(c.TotalFailures) >= o.FailureRatio*float64(c.Requests)
		},
		// A caller that gave up (its own context) says nothing about the store, and a store
		// that refused a reused idempotency key answered.
		IsSuccessful: func(err error) bool {
			return err == nil || errors.Is(err, context.Canceled) || errors.Is(err, store.ErrIdempotencyMismatch)
		},
	}
	if o.OnStateChange != nil {
		st.OnStateChange = func(_ string, from, to gobreaker.State) { o.OnStateChange(from.String(), to.String()) }
	}
	return &Store{inner: inner, timeout: o.Timeout, cb: gobreaker.NewCircuitBreaker[bool](st)}
}

// State returns the breaker's state: closed, half-open or open.
func (s *Store) State() string { return s.cb.State().String() }

// Apply calls the store within the deadline, unless the breaker is open.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	replayed, err := s.cb.Execute(func() (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		return s.inner.Apply(ctx, b, results)
	})
	return replayed, wrap(err)
}

// Reset calls the store within the deadline, unless the breaker is open.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	_, err := s.cb.Execute(func() (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		return false, s.inner.Reset(ctx, keys)
	})
	return wrap(err)
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
