package follower

import (
	"context"
	"maps"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
)

// DefaultTrustInterval is how often the violation minutes that lower trust scores are counted
// again (adaptive limits); they are counted at once too when the identities change.
const DefaultTrustInterval = time.Minute

// trustID is an identity with a trust score.
type trustID struct {
	kind  policy.IdentityKind
	value string
}

// violationMinutes is what compileLocked hands policy.CompileWith: the counts r.violations
// holds. r.mu is held by the compile, which is when it runs.
func (r *Runtime) violationMinutes(kind policy.IdentityKind, value string) int {
	return r.violations[trustID{kind, value}]
}

// trusted returns the identities of the state held that have a trust score above 0: the ones
// whose violations lower their adaptive limits.
func (r *Runtime) trusted() []trustID {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil {
		return nil
	}
	var ids []trustID
	for _, id := range r.held.identities {
		if id.Trust != nil && *id.Trust > 0 {
			ids = append(ids, trustID{id.Kind, id.Value})
		}
	}
	return ids
}

// trust counts, every TrustInterval and whenever the identities may have changed, each
// trusted identity's minutes with denied requests over the last 30 days, from the fleet's
// violation counts, and compiles the policy again when a count changed. It runs off the hot
// path: checks read the scores compiled into the snapshot.
func (r *Runtime) trust(ctx context.Context) {
	t := time.NewTicker(r.o.TrustInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.trustNow:
		}
		if r.up.Load() {
			r.RefreshTrust(ctx)
		}
	}
}

// RefreshTrust counts the trusted identities' violation minutes now, and compiles and swaps a
// new snapshot in if they changed. The Runtime does it every TrustInterval and after the
// identities may have changed.
func (r *Runtime) RefreshTrust(ctx context.Context) {
	ids := r.trusted()
	counts := make(map[trustID]int, len(ids))
	since := r.now().Add(-policy.ViolationWindow)
	for _, id := range ids {
		n, err := r.countViolationMinutes(ctx, id, since)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("control store: counting violations for adaptive limits failed; keeping the last counts", "err", err)
			}
			return
		}
		if n > 0 {
			counts[id] = n
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if maps.Equal(counts, r.violations) {
		return
	}
	r.violations = counts
	r.compileLocked("violations")
}

// countViolationMinutes counts the distinct minutes since since in which id was denied, up to
// policy.MaxViolationMinutes (more lower its score no further). An API key is looked up in the
// form the counts keep it, hashed as in bucket keys.
func (r *Runtime) countViolationMinutes(ctx context.Context, id trustID, since time.Time) (int, error) {
	f := control.ViolationFilter{Since: since, Limit: control.MaxAuditLimit}
	switch id.kind {
	case policy.IdentityAPIKey:
		f.APIKey = string(key.AppendSecret(nil, id.value))
	case policy.IdentityUser:
		f.User = id.value
	default:
		f.Tenant = id.value
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	vs, err := r.o.Store.Violations(ctx, f)
	if err != nil {
		return 0, err
	}
	minutes := map[int64]bool{}
	for _, v := range vs {
		if v.Denied > 0 {
			minutes[v.Minute.Unix()] = true
			if len(minutes) >= policy.MaxViolationMinutes {
				break
			}
		}
	}
	return len(minutes), nil
}
