// Package policy turns rules into the limits a request must pass: it reads policy files (the
// native YAML and the format of Envoy's reference service, through envoyconf), compiles them
// with the run-time State that operators change through the admin API (overrides, exemptions,
// identity assignments, API rules) into an immutable Snapshot, and resolves each Request
// against that Snapshot: identity assignments, exemptions, bans, multipliers and custom
// limits, tiers and adaptive trust, down to the []Limit that a store decides in one step.
//
// A Snapshot is swapped whole when anything changes (sluice.Limiter.SetPolicy), so the hot
// path never waits on a file or a database and never sees half of two policies. See
// docs/architecture.md, "Policy snapshot" and "Control plane".
package policy
