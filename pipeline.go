package sluice

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// One decision pipeline, two ways in (docs/architecture.md, "Data flow"). A native check
// (Check, Quota: sluice.go) and an Envoy request (CheckDescriptors: descriptors.go) go through
// the same stages, each form filling its own answer:
//
//  1. caller: who asks. A native request names its attributes; an Envoy request's are read
//     from its descriptors' entries (descriptors_control.go).
//  2. admit: the control plane's identity assignments and exemptions (admit).
//  3. limits: the limits that apply, shaped by overrides: policy.Snapshot.Resolve for native
//     rules; the domain's descriptor tree and Snapshot.EnvoyOverrideFor for Envoy's. A ban
//     turns every limit into a look that consumes nothing.
//  4. store: the limits' ops in one batch, decided atomically by the store behind its
//     decorators (breaker, hot keys, regions); when it cannot, each limit's on_store_error
//     (storeStep, degradeOps).
//  5. answer: Decision for a native request, DescriptorDecision for Envoy's.

// admit applies the control plane's identity assignments to r (into assigned when one
// changes it) and reports the caller they make and whether an exemption covers it.
func admit(snap *policy.Snapshot, r, assigned *policy.Request) (caller *policy.Request, exempt bool) {
	caller = snap.Assign(r, assigned)
	return caller, snap.Exempt(caller)
}

// batchForm is a request form's part in the store step: how its batch is applied, and how
// its limits are decided when the store cannot.
type batchForm interface {
	apply(ctx context.Context, st store.Store) (replayed bool, err error)
	degrade(ctx context.Context, l *Limiter, cause error) error
}

// storeStep applies f's batch to the Limiter's store. A store failure is reported to the
// error hook and the limits are decided by their on_store_error; an idempotency key reused
// for another request is the caller's mistake and returned as it is.
func (l *Limiter) storeStep(ctx context.Context, f batchForm) (replayed bool, err error) {
	replayed, err = f.apply(ctx, l.store)
	if err == nil {
		return replayed, nil
	}
	if errors.Is(err, store.ErrIdempotencyMismatch) {
		return false, err
	}
	if l.onError != nil {
		l.onError(err)
	}
	return false, f.degrade(ctx, l, err)
}
