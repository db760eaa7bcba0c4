package policy

import (
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// EnvoyOverride is what an override does to one Envoy-format limit for a request
// (DESIGN.md, "Envoy requests get the whole product"): a ban, or other parameters.
type EnvoyOverride struct {
	Banned bool
	Until  time.Time // when a ban ends
	Reason string
	// Params are the limit's parameters under a multiplier or custom override.
	Params algorithm.Params
}

// Controls reports whether the control plane shapes any request of s: an exemption, an
// override or an identity assignment. An Envoy request of a snapshot without any is decided
// from its descriptors alone, with no attribute read.
func (s *Snapshot) Controls() bool {
	return len(s.shapes) > 0 || s.ids.some || s.exemptions.some
}

// MatchEnvoyOverrides looks up, into sc, the overrides whose target r matches, for
// EnvoyOverrideFor to read for each limit of the request. It reports whether there are any.
func (s *Snapshot) MatchEnvoyOverrides(r *Request, sc *Scratch) bool {
	sc.ovs, sc.secret = sc.ovs[:0], sc.secret[:0]
	if len(s.shapes) == 0 {
		return false
	}
	sc.ovs = s.matchOverrides(r, sc.ovs, sc.apiKeyPart)
	return len(sc.ovs) > 0
}

// EnvoyOverrideFor returns the override that applies to lim at now among those
// MatchEnvoyOverrides found: that of the most specific target, where one naming lim (by its
// rate_limit name, its stat key or its ID) beats one for every limit. A multiplier or custom
// override too large to count exactly leaves the limit as it is.
func (s *Snapshot) EnvoyOverrideFor(lim *envoyconf.Limit, now time.Time, sc *Scratch) (EnvoyOverride, bool) {
	o := findEnvoyOverride(sc.ovs, lim, now)
	if o == nil || lim.Unlimited {
		return EnvoyOverride{}, false
	}
	base := lim.Params
	switch o.kind {
	case overrideBan:
		return EnvoyOverride{Banned: true, Until: o.expiresAt, Reason: o.Reason}, true
	case overrideMultiplier, overrideCustom:
	default:
		return EnvoyOverride{}, false
	}
	limit, burst := o.reshape(base.Limit, base.Burst)
	p, err := algorithm.NewParams(base.Kind, limit, burst, lim.Period)
	if err != nil {
		return EnvoyOverride{}, false
	}
	return EnvoyOverride{Reason: o.Reason, Params: p}, true
}

// findEnvoyOverride is findOverride for an Envoy limit, which overrides name three ways.
func findEnvoyOverride(lists [][]*compiledOverride, lim *envoyconf.Limit, now time.Time) *compiledOverride {
	for _, list := range lists {
		var general *compiledOverride
		for _, o := range list {
			if o.kind == overrideWarn || !now.Before(o.expiresAt) {
				continue
			}
			if o.rule == "" {
				if general == nil {
					general = o
				}
				continue
			}
			if o.rule == lim.Name || o.rule == lim.StatKey || o.rule == lim.ID {
				return o
			}
		}
		if general != nil {
			return general
		}
	}
	return nil
}

// EnvoyAdapted returns lim's parameters scaled by the trust score of r's caller, as adaptive
// limits scale a native rule's (adaptive: trust): the burst by 1 + t, the rate by 1 + t/2,
// rounded down. ok is false when lim is not adaptive, the caller has no score, or the scaled
// limit could not be counted exactly: lim's own parameters then apply.
func (s *Snapshot) EnvoyAdapted(lim *envoyconf.Limit, r *Request) (algorithm.Params, bool) {
	if !lim.Adaptive || lim.Unlimited {
		return algorithm.Params{}, false
	}
	level := s.trust.of(r)
	if level < 0 {
		return algorithm.Params{}, false
	}
	t, base := s.trust.values[level], &lim.Params
	limit := base.Limit * (2*trustUnit + t) / (2 * trustUnit)
	burst := base.Burst * (trustUnit + t) / trustUnit
	p, err := algorithm.NewParams(base.Kind, limit, burst, lim.Period)
	if err != nil {
		return algorithm.Params{}, false
	}
	return p, true
}

// AppendEnvoyBurstKey appends to dst the key of the burst counter of lim (its escalation) for
// r's caller, and reports true; it reports false, appending nothing, when lim has no
// escalation or escalation cannot name the caller. As for native rules (AppendBurstKey) the
// caller is its API key, else its user with its tenant. The key is
// sl:@<domain>:<limit id>:!burst:{a=#<hash>} or ...:{u=<user>}:<tenant>: where a bucket's key
// names its algorithm, so the two never meet.
func AppendEnvoyBurstKey(dst []byte, lim *envoyconf.Limit, r *Request) ([]byte, bool) {
	if lim.Escalation == nil || r.APIKey == "" && r.User == "" {
		return dst, false
	}
	dst = AppendEnvoyHead(dst, lim)
	dst = append(dst, ":!burst"...)
	if r.APIKey != "" {
		return key.AppendTag(dst, 'a', r.APIKey), true
	}
	dst = key.AppendTag(dst, 'u', r.User)
	return key.AppendValue(dst, r.Tenant), true
}

// AppendEnvoyHead appends the start that every key of lim's buckets shares, sl:@<domain>:<id>:
// what a native rule's Head is to its keys, by which regions find a limit's keys.
func AppendEnvoyHead(dst []byte, lim *envoyconf.Limit) []byte {
	dst = append(dst, key.Prefix...)
	dst = append(dst, '@')
	dst = key.AppendPart(dst, lim.Domain)
	return key.AppendValue(dst, lim.ID)
}

// EnvoyRegionLimits returns the Envoy-format limits of s whose regions is global or
// home:NAME, in the order of their domains and files.
func (s *Snapshot) EnvoyRegionLimits() []*envoyconf.Limit {
	cfg := s.Envoy()
	if cfg == nil {
		return nil
	}
	var out []*envoyconf.Limit
	for _, d := range cfg.Domains() {
		for _, lim := range cfg.Limits(d) {
			if lim.Regions != "" {
				out = append(out, lim)
			}
		}
	}
	return out
}
