package control

import (
	"context"
	"time"
)

// ChangeReader is implemented by a Store that can read what changed since a control version,
// so that a node follows a change by reading the change rather than the whole store
// (docs/architecture.md, Changes in proportion to their size). control/sqlite and
// control/postgres implement it; a Store that does not is read whole (Load) at every change.
type ChangeReader interface {
	// Changes returns what changed after control version since, in one consistent read. A
	// Delta with Full set carries nothing to apply: read the store whole with Load (a rule,
	// an exemption or a domain changed, the changes are too many, or the audit log that
	// records them was pruned).
	Changes(ctx context.Context, since int64) (*Delta, error)
}

// MaxDeltaVersions is how many control versions a Delta spans at most; a node further behind
// reads the store whole.
const MaxDeltaVersions = 10000

// Delta is what changed in a control store between two versions: the overrides and identity
// assignments written since, and the ones gone. An entry both gone and written (an override
// replaced under the same id, an assignment deleted and put again) is in both lists: apply
// the removals first.
type Delta struct {
	// Since is the version the delta starts after; Version the one it brings the reader to.
	Since, Version int64
	// At is the store's clock when it was read.
	At time.Time
	// Full says that the delta cannot be applied: read the store whole.
	Full bool
	// Overrides are the overrides created since, by version; expired ones among them too.
	Overrides []Override
	// RemovedOverrides are the ids of overrides changed since: deleted, expired or replaced.
	RemovedOverrides []int64
	// Identities are the assignments put since, by version.
	Identities []Identity
	// RemovedIdentities are the assignments changed since: deleted or put again.
	RemovedIdentities []IdentityRef
}

// IdentityRef names an identity assignment.
type IdentityRef struct {
	Kind  IdentityKind
	Value string
}
