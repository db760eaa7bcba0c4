package sluice

import (
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store"
)

// envoyAttributeCount is len(envoyconf.Attributes).
const envoyAttributeCount = 7

// defaultAttributeKeys are the entry keys of envoyconf.Attributes when nothing maps them.
var defaultAttributeKeys = [envoyAttributeCount]string{"tenant", "user", "api_key", "ip", "endpoint", "method", "tier"}

// attributeKeys returns the entry key of each attribute for domain, and whether Envoy's
// remote_address still sets ip: a domain's attributes: mapping first, then the Limiter's.
func (l *Limiter) attributeKeys(domainMap envoyconf.AttributeMap) (keys [envoyAttributeCount]string, remote bool) {
	keys = defaultAttributeKeys
	if len(domainMap) == 0 && len(l.envoyAttrs) == 0 {
		return keys, true
	}
	for i, a := range envoyconf.Attributes {
		if k, ok := domainMap[a]; ok {
			keys[i] = k
		} else if k, ok := l.envoyAttrs[a]; ok {
			keys[i] = k
		}
	}
	return keys, keys[3] == "ip"
}

// readAttributes fills r with the attributes of descs' entries: for each attribute the first
// entry of its key, in descriptor order, and Envoy's remote_address for ip when no entry of
// ip's key came first. keys nil reads each attribute from the entry of its own name.
func readAttributes(r *policy.Request, descs []Descriptor, keys *[envoyAttributeCount]string, remote bool) {
	*r = policy.Request{}
	fields := [envoyAttributeCount]*string{&r.Tenant, &r.User, &r.APIKey, &r.IP, &r.Endpoint, &r.Method, &r.Tier}
	for i := range descs {
		for _, e := range descs[i].Entries {
			j := -1
			if keys == nil {
				j = defaultAttribute(e.Key)
			} else {
				for k := range keys {
					if e.Key == keys[k] {
						j = k
						break
					}
				}
				if j < 0 && remote && e.Key == "remote_address" {
					j = 3
				}
			}
			if j >= 0 && *fields[j] == "" {
				*fields[j] = e.Value
			}
		}
	}
}

// defaultAttribute is the index in envoyconf.Attributes of the attribute entry key k sets when
// nothing maps them, or -1.
func defaultAttribute(k string) int {
	switch k {
	case "tenant":
		return 0
	case "user":
		return 1
	case "api_key":
		return 2
	case "ip", "remote_address":
		return 3
	case "endpoint":
		return 4
	case "method":
		return 5
	case "tier":
		return 6
	}
	return -1
}

// control applies the control plane to an Envoy request before its descriptors are matched
// (DESIGN.md, "Envoy requests get the whole product"): it reads the request's attributes,
// applies the identity assignments (an assigned tier replaces the value of the tier entry)
// and the exemptions, and looks up the overrides whose target the request matches. It returns
// the descriptors to match, and whether the caller is exempt.
//
// With nothing of the control plane in the snapshot it only notes where the attributes are,
// for Caller to read them if asked: the Envoy path then pays nothing for the control plane.
func (l *Limiter) control(snap *policy.Snapshot, cfg *envoyconf.Config, r *DescriptorRequest, d *DescriptorDecision) ([]Descriptor, bool) {
	d.from, d.cfg, d.domain, d.limiter, d.caller, d.overridden = r.Descriptors, cfg, r.Domain, l, nil, false
	if !snap.Controls() {
		return r.Descriptors, false
	}
	d.readCaller()
	keys := d.attrKeys
	claimed := d.req.Tier
	var exempt bool
	if d.caller, exempt = admit(snap, &d.req, &d.assigned); exempt {
		return r.Descriptors, true
	}
	d.overridden = snap.MatchEnvoyOverrides(d.caller, &d.scratch)
	tier := d.caller.Tier
	if tier == claimed {
		return r.Descriptors, false
	}
	// The assigned tier replaces the value of every tier entry: a client cannot claim a better
	// tier through a descriptor. The request's descriptors are the caller's: rewritten copies.
	d.descs = append(d.descs[:0], r.Descriptors...)
	d.entries, d.rewritten = d.entries[:0], d.rewritten[:0]
	for i := range d.descs {
		if !slices.ContainsFunc(d.descs[i].Entries, func(e envoyconf.Entry) bool { return e.Key == keys[6] }) {
			continue
		}
		d.rewritten = append(d.rewritten, i)
		for _, e := range d.descs[i].Entries {
			if e.Key == keys[6] {
				e.Value = tier
			}
			d.entries = append(d.entries, e)
		}
	}
	pos := 0
	for _, i := range d.rewritten {
		n := len(d.descs[i].Entries)
		d.descs[i].Entries = d.entries[pos : pos+n : pos+n]
		pos += n
	}
	return d.descs, false
}

// overrideLimit applies to st the override for lim in the request control looked up,
// reading the clock once per request, on first need. A ban denies st (unless a shadow limit
// or global shadow mode only reports it); a multiplier or custom override appends the limit's
// new parameters to d.params, which current_limit shows. It reports whether an override
// applied that replaces lim's parameters or denies.
func (l *Limiter) overrideLimit(snap *policy.Snapshot, lim *envoyconf.Limit, now *time.Time, st *DescriptorStatus, d *DescriptorDecision) bool {
	if now.IsZero() {
		*now = l.now()
	}
	o, ok := snap.EnvoyOverrideFor(lim, *now, &d.scratch)
	switch {
	case !ok:
		return false
	case o.Banned && (l.shadow || lim.Shadow):
		st.Shadow = true // reported, not enforced: counted as usual
		return false
	case o.Banned:
		st.OK, st.ResetAfter = false, max(0, o.Until.Sub(*now))
		d.OK, d.Banned = false, true
		return true
	}
	d.params = append(d.params, o.Params)
	st.RequestsPerUnit = uint32(min(o.Params.Limit, math.MaxUint32))
	return true
}

// readCaller reads the attributes of the request's descriptors into d.req, with the entry
// keys of the domain's mapping and the limiter's.
func (d *DescriptorDecision) readCaller() {
	var domainMap envoyconf.AttributeMap
	if d.cfg != nil {
		domainMap = d.cfg.Attributes(d.domain)
	}
	d.mapped = len(domainMap) > 0 || (d.limiter != nil && len(d.limiter.envoyAttrs) > 0)
	if d.limiter != nil {
		d.attrKeys, d.remote = d.limiter.attributeKeys(domainMap)
	} else {
		d.attrKeys, d.remote = defaultAttributeKeys, true
	}
	if d.mapped {
		readAttributes(&d.req, d.from, &d.attrKeys, d.remote)
	} else {
		readAttributes(&d.req, d.from, nil, true)
	}
	d.caller = &d.req
}

// adaptLimit gives lim, when adaptive, its parameters at the trust score of the request's
// caller (policy.Snapshot.EnvoyAdapted), appended to d.params; current_limit shows the scaled
// limit. It reports whether it did.
func (l *Limiter) adaptLimit(snap *policy.Snapshot, lim *envoyconf.Limit, st *DescriptorStatus, d *DescriptorDecision) bool {
	p, ok := snap.EnvoyAdapted(lim, d.Caller())
	if !ok {
		return false
	}
	d.params = append(d.params, p)
	st.RequestsPerUnit = uint32(min(p.Limit, math.MaxUint32))
	return true
}

// burstCounter is the burst counter op of a limit with an escalation: counted is set when the
// request consumed (a look counts nothing, as for native rules).
type burstCounter struct {
	lim     *envoyconf.Limit
	end     int // where its key ends in DescriptorDecision.burstKeys
	counted bool
}

// burstCounters appends to d.ops, after the limits' ops, a counter op for each limit of the
// request with an escalation that can name its caller (by API key, else user): escalation's
// burst counters, as Check sends them for native rules. A limit that two descriptors reach
// counts the request once.
func (l *Limiter) burstCounters(d *DescriptorDecision) {
	d.bursts, d.burstKeys = d.bursts[:0], d.burstKeys[:0]
	caller := d.Caller()
	limitOps := len(d.ops)
	for i := range limitOps {
		lim := d.limits[d.opOf[i]]
		if lim == nil || lim.Escalation == nil || slices.ContainsFunc(d.bursts, func(b burstCounter) bool { return b.lim == lim }) {
			continue
		}
		var ok bool
		if d.burstKeys, ok = policy.AppendEnvoyBurstKey(d.burstKeys, lim, caller); ok {
			d.bursts = append(d.bursts, burstCounter{lim: lim, end: len(d.burstKeys), counted: d.ops[i].Cost > 0})
		}
	}
	start := 0
	for _, b := range d.bursts {
		cost := int64(0)
		if b.counted {
			cost = 1
		}
		d.ops = append(d.ops, store.Op{Key: d.burstKeys[start:b.end:b.end], Params: &b.lim.Escalation.Params, Cost: cost, Counter: true})
		d.kinds = append(d.kinds, opCounter)
		start = b.end
	}
}

// reportEnvoyBursts hands the burst hook every burst that the counter ops after the first
// limitOps ops found, naming the limit by its stat key, which overrides match.
func (l *Limiter) reportEnvoyBursts(d *DescriptorDecision, limitOps int) {
	for j, b := range d.bursts {
		a := &d.algo[limitOps+j]
		if !b.counted || !policy.BurstOver(a.Allowed, a.Remaining, 1) {
			continue
		}
		caller, esc := d.Caller(), b.lim.Escalation
		burst := Burst{Rule: b.lim.StatKey, Window: esc.Window, Threshold: esc.Threshold, Penalty: esc.Penalty}
		if caller.APIKey != "" {
			burst.APIKey = caller.APIKey
		} else {
			burst.Tenant, burst.User = caller.Tenant, caller.User
		}
		l.onBurst(burst)
	}
}
