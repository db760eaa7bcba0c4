package policy

import (
	"math"
	"time"
)

// Adaptive limits (docs/architecture.md, Escalation and adaptive limits): a rule with adaptive: trust
// scales each caller's limits by its trust score t in [0, 1]: the burst (a bucket's capacity)
// by 1 + t, the rate by 1 + t/2. A window algorithm's limit is its rate (it has no burst), so it
// takes the rate's factor. t is the score assigned to the caller's API key, else its user's,
// else its tenant's (as tiers are), less 0.05 for each minute with violations in the last 30
// days, at most 0.2 less; a caller without a score has t = 0, its rule's own limits.
//
// Scores are counted in fixed point (trustUnit), so the scaled limits are exact integer
// products, rounded down, whatever binary fraction 0.3 is as a float.
const (
	// AdaptiveTrust is the value of Rule.Adaptive that scales limits by trust.
	AdaptiveTrust = "trust"

	trustUnit = 10_000
	// violationCost is what one minute with violations takes off a score, and maxViolationCost
	// the most that violations take off.
	violationCost    = trustUnit / 20 // 0.05
	maxViolationCost = trustUnit / 5  // 0.2
	// ViolationWindow is how far back violation minutes lower a score.
	ViolationWindow = 30 * 24 * time.Hour
	// MaxViolationMinutes is the number of violation minutes past which more lower nothing:
	// a caller of WithViolationMinutes need not count further.
	MaxViolationMinutes = maxViolationCost / violationCost
)

// EffectiveTrust returns the score that adaptive limits use for an identity assigned trust
// and with violationMinutes minutes with violations in the last 30 days: trust less 0.05 per
// minute, at most 0.2 less, and never below 0.
func EffectiveTrust(trust float64, violationMinutes int) float64 {
	return float64(effectiveTrust(trust, violationMinutes)) / trustUnit
}

func effectiveTrust(trust float64, violationMinutes int) int64 {
	if !(trust > 0) { // NaN included: Identity.validate refuses it, but stay safe
		return 0
	}
	t := int64(math.Round(min(trust, 1) * trustUnit))
	return max(0, t-violationCost*int64(min(max(violationMinutes, 0), MaxViolationMinutes)))
}

// trustLevels are the callers whose adaptive limits differ from their rules': each identity
// with an effective score above 0 points at its level, an index into values (the distinct
// scores), and each adaptive rule holds its specs per level.
type trustLevels struct {
	apiKeys, users, tenants map[string]int32
	values                  []int64         // in trustUnit
	index                   map[int64]int32 // values' indexes, while compiling
}

// add gives the identity its level for score t (in trustUnit, above 0).
func (tl *trustLevels) add(kind IdentityKind, value string, t int64) {
	if tl.index == nil {
		tl.index = map[int64]int32{}
	}
	level, ok := tl.index[t]
	if !ok {
		tl.values = append(tl.values, t)
		level = int32(len(tl.values) - 1)
		tl.index[t] = level
	}
	m := &tl.tenants
	switch kind {
	case IdentityAPIKey:
		m = &tl.apiKeys
	case IdentityUser:
		m = &tl.users
	}
	if *m == nil {
		*m = map[string]int32{}
	}
	(*m)[value] = level
}

// of returns r's level, or -1 when r's limits are its rules': by its API key, else its user,
// else its tenant. At most three map lookups, made only for requests an adaptive rule matched.
func (tl *trustLevels) of(r *Request) int32 {
	if r.APIKey != "" && tl.apiKeys != nil {
		if l, ok := tl.apiKeys[r.APIKey]; ok {
			return l
		}
	}
	if r.User != "" && tl.users != nil {
		if l, ok := tl.users[r.User]; ok {
			return l
		}
	}
	if r.Tenant != "" && tl.tenants != nil {
		if l, ok := tl.tenants[r.Tenant]; ok {
			return l
		}
	}
	return -1
}

// adaptedSpecs are a rule's limits at one trust level: its own and its tiers'. A nil entry
// keeps the unscaled limit (scaled, it could not be counted exactly).
type adaptedSpecs struct {
	base  *Spec
	tiers map[string]*Spec
}

// adaptSpec scales s by the score t (in trustUnit): the burst by 1 + t, the rate (limit per
// period) by 1 + t/2, both rounded down. Limits are at most 2^40, so the products fit.
func adaptSpec(s *Spec, t int64) *Spec {
	limit := s.Limit * (2*trustUnit + t) / (2 * trustUnit)
	burst := s.Burst * (trustUnit + t) / trustUnit
	spec, err := newSpec(s.Params.Kind, limit, burst, s.Period, s.Soft, s.Hard, s.Params.Calendar(), s.Params.Drains())
	if err != nil {
		return nil
	}
	return &spec
}

// adapt compiles every adaptive rule's specs at each trust level.
func (b *builder) adapt() {
	tl := &b.s.trust
	tl.index = nil
	if len(tl.values) == 0 {
		return
	}
	for _, c := range b.s.rules {
		if !c.adaptive {
			continue
		}
		c.adapted = make([]adaptedSpecs, len(tl.values))
		for i, t := range tl.values {
			a := &c.adapted[i]
			a.base = adaptSpec(&c.base, t)
			for name, spec := range c.tiers {
				if a.tiers == nil {
					a.tiers = make(map[string]*Spec, len(c.tiers))
				}
				a.tiers[name] = adaptSpec(spec, t)
			}
		}
	}
}

// adapt gives l its spec at r's trust level, if it has one. Kept out of line: most rules are
// not adaptive, and inlined into Resolve's loop its lookups slowed every check.
//
//go:noinline
func (s *Snapshot) adapt(l *Limit, r *Request, sc *Scratch) {
	if sc.level == levelUnknown {
		sc.level = s.trust.of(r)
	}
	if spec := l.Rule.adaptedSpec(sc.level, r.Tier); spec != nil {
		l.Spec = spec
	}
}

// adaptedSpec returns c's limit for tier at trust level (see trustLevels.of), or nil to keep
// the rule's own.
func (c *CompiledRule) adaptedSpec(level int32, tier string) *Spec {
	if level < 0 || int(level) >= len(c.adapted) {
		return nil
	}
	a := &c.adapted[level]
	if tier != "" && a.tiers != nil {
		if s, ok := a.tiers[tier]; ok {
			return s
		}
	}
	return a.base
}

// trustScores gives every identity of st with a trust score its level: the compile step of
// adaptive limits, given the violation minutes of each identity (nil for none).
func (b *builder) trustScores(ids []Identity, violations func(IdentityKind, string) int) {
	for i := range ids {
		id := &ids[i]
		if id.Trust == nil || id.validate() != nil {
			continue
		}
		minutes := 0
		if violations != nil {
			minutes = violations(id.Kind, id.Value)
		}
		if t := effectiveTrust(*id.Trust, minutes); t > 0 {
			b.s.trust.add(id.Kind, id.Value, t)
		}
	}
}

// CompileOption adjusts CompileWith.
type CompileOption func(*compileOptions)

type compileOptions struct {
	violationMinutes func(IdentityKind, string) int
	domains          *DomainCache
}

// WithViolationMinutes gives CompileWith, for an identity with a trust score, the number of
// minutes with violations it had in the last 30 days (counting past MaxViolationMinutes
// changes nothing). Adaptive limits lower its score by 0.05 per minute, at most 0.2.
func WithViolationMinutes(f func(kind IdentityKind, value string) int) CompileOption {
	return func(o *compileOptions) { o.violationMinutes = f }
}

// TrustOf returns the effective trust score that adaptive limits give r's caller, 0 for none.
func (s *Snapshot) TrustOf(r *Request) float64 {
	if l := s.trust.of(r); l >= 0 {
		return float64(s.trust.values[l]) / trustUnit
	}
	return 0
}
