// Package abuse is the abuse detector (docs/architecture.md, Escalation and adaptive limits). Every
// interval the one node of a fleet that holds the control store's "abuse-detector" lease sums
// the per-minute decision counts every node wrote over the last window, and penalizes each
// tenant whose requests were mostly throttled (and, for requests without a tenant, each user)
// with an automatic multiplier override, audited with actor "abuse-detector", that every node
// enforces within a second.
//
// How a share is computed, and why:
//
//   - Per tenant and rule, from the usage counts: throttled = denied + soft, requests =
//     allowed + denied + soft. The counts are exact: every node's flushes add up.
//   - A request that several rules match is counted once under each of them, so shares are
//     never summed across rules: a generous catch-all rule that nobody reaches would dilute the
//     share of the rule being hammered, and each request would count several times. A
//     target's share is the largest share of any one rule that has at least MinRequests
//     requests: exact for that rule, and the question an operator asks ("is this tenant
//     hammering one of its limits?").
//   - Requests without a tenant are judged per identity from the violation counts, which keep
//     the user, API key and IP of denied and soft decisions only. An identity's allowed
//     requests are not recorded; the allowed requests of all tenant-less callers of the rule
//     bound them from above. So the identity's share is taken as throttled / (throttled +
//     those allowed) and its requests as throttled: lower bounds, exact when it is the rule's
//     only tenant-less caller. An identity is penalized only when every reading of the counts
//     says it should be.
//   - Only a tenant or a user can be named by an override: an API key override takes the
//     secret, which violations never keep, and overrides have no IP. Such identities are
//     flagged (metric and log) but not penalized.
//
// Severity: "high" above Threshold (an override is created), "medium" from MediumShare up to
// the threshold (counted and logged only: the design creates overrides above the threshold
// alone). A target is skipped, neither flagged nor penalized, while an active override names
// it (whoever made it) and while the window still overlaps its last automatic penalty: the
// requests a penalty throttled are not held against it, or a caller busy at 90% of its normal
// limit would be throttled by its own penalty into the next one, for ever.
package abuse

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Defaults of Config (docs/architecture.md, Abuse detector).
const (
	DefaultInterval    = 60 * time.Second
	DefaultWindow      = 5 * time.Minute
	DefaultThreshold   = 0.8
	DefaultMinRequests = 100
	DefaultMultiplier  = 0.1
	DefaultPenalty     = 5 * time.Minute
	// DefaultMaxPenalties caps the overrides one run creates (issue 27: a probe of made-up
	// tenant names drove one run to write 200).
	DefaultMaxPenalties = 50
)

// MediumShare is where severity "medium" starts.
const MediumShare = 0.6

// Bounds of Config's values.
const (
	// MinInterval keeps the detector from hammering the control store with a fleet-wide scan.
	MinInterval = time.Second
	MaxInterval = 24 * time.Hour
	// MinWindow is the counts' resolution: they are kept per minute.
	MinWindow = time.Minute
	// MaxWindow bounds the minutes one run sums.
	MaxWindow = 24 * time.Hour
	// MinPenalty and MaxPenalty bound an automatic override's life: a penalty is meant to be
	// a pause, not a decision a person should take.
	MinPenalty = time.Second
	MaxPenalty = 30 * 24 * time.Hour
	// MaxMaxPenalties bounds MaxPenalties: more automatic overrides per run than this is not
	// a cap any more.
	MaxMaxPenalties = 10000
)

// Config is what the detector does; the flags --abuse-* set it.
type Config struct {
	// Interval is how often the detector runs.
	Interval time.Duration
	// Window is how far back it looks: the minutes that overlap the last Window, the current
	// one included.
	Window time.Duration
	// Threshold is the share of throttled requests above which a target is penalized.
	Threshold float64
	// MinRequests is how many requests a target must have sent under one rule within the
	// window to be judged on it.
	MinRequests int64
	// Multiplier is the penalty override's value: the target's limits are multiplied by it.
	Multiplier float64
	// Penalty is how long the override lasts.
	Penalty time.Duration
	// MaxPenalties caps the overrides one run creates, so that the detector never becomes a
	// way to fill the control store: the worst offenders (largest share, then most throttled
	// requests) are penalized first, and the rest are counted in
	// sluice_abuse_penalties_skipped_total and judged again at the next run.
	MaxPenalties int
}

// DefaultConfig returns the documented defaults (docs/architecture.md, Abuse detector).
func DefaultConfig() Config {
	return Config{
		Interval: DefaultInterval, Window: DefaultWindow, Threshold: DefaultThreshold,
		MinRequests: DefaultMinRequests, Multiplier: DefaultMultiplier, Penalty: DefaultPenalty,
		MaxPenalties: DefaultMaxPenalties,
	}
}

// Validate reports the first bad value as a *policy.FieldError whose Field is the flag's name
// without "--abuse-" (interval, window, threshold, min-requests, multiplier, penalty,
// max-penalties).
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &policy.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	between := func(field string, d, lo, hi time.Duration) error {
		if d < lo || d > hi {
			return bad(field, "%v: want %s to %s", d, fmtDuration(lo), fmtDuration(hi))
		}
		return nil
	}
	if err := between("interval", c.Interval, MinInterval, MaxInterval); err != nil {
		return err
	}
	if err := between("window", c.Window, MinWindow, MaxWindow); err != nil {
		return err
	}
	// The negated comparisons also refuse NaN.
	if !(c.Threshold > 0 && c.Threshold < 1) {
		return bad("threshold", "%v: want a share above 0 and below 1, e.g. 0.8", c.Threshold)
	}
	if c.MinRequests < 1 {
		return bad("min-requests", "%d: want at least 1", c.MinRequests)
	}
	if !(c.Multiplier > 0 && c.Multiplier < 1) {
		return bad("multiplier", "%v: want a factor above 0 and below 1, e.g. 0.1", c.Multiplier)
	}
	if err := between("penalty", c.Penalty, MinPenalty, MaxPenalty); err != nil {
		return err
	}
	if c.MaxPenalties < 1 || c.MaxPenalties > MaxMaxPenalties {
		return bad("max-penalties", "%d: want 1 to %d", c.MaxPenalties, MaxMaxPenalties)
	}
	return nil
}

// fmtDuration writes d as people write periods ("5m", not "5m0s").
func fmtDuration(d time.Duration) string {
	b, _ := policy.Duration(d).MarshalText()
	return string(b)
}
