package policy

import (
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
)

// Limit is one limit that applies to a request: its rule, effective parameters and bucket key.
// It points into the snapshot or the Scratch it was resolved in, so that resolving copies
// little.
type Limit struct {
	Rule   *CompiledRule
	Spec   *Spec             // the nominal numbers (after tier and override)
	Params *algorithm.Params // effective parameters (after the hard threshold): &Spec.Params
	Key    []byte

	// Override is the override that shaped this limit, if any.
	Override *compiledOverride
	// Banned is set when an override bans the target: the limit denies until BannedUntil.
	Banned bool
	// Warning is set when a warning override (escalation's first penalty) applies: the
	// limit's allowed decisions are soft, with this as X-RateLimit-Warning.
	Warning string

	keyStart, keyEnd int32
	specIndex        int32 // index+1 in Scratch.specs of an override's spec; 0 for none
}

// BannedUntil is when the ban on a Banned limit ends.
func (l *Limit) BannedUntil() time.Time {
	if !l.Banned {
		return time.Time{}
	}
	return l.Override.expiresAt
}

// OverrideReason returns the reason and source of the override that shaped l, if any.
func (l *Limit) OverrideReason() (reason, source string, ok bool) {
	if l.Override == nil {
		return "", "", false
	}
	return l.Override.Reason, l.Override.Source, true
}

// Scratch holds the buffers Resolve works in. A caller that keeps one per goroutine (or per
// reused decision) resolves without allocating.
type Scratch struct {
	Limits []Limit
	keys   []byte
	cands  []int32
	specs  []Spec // specs derived by overrides
	// secret is the request's API key in key form (hashed), made once per Resolve however
	// many rules key or tag by it: SHA-256 is the dearest step of building keys.
	secret []byte
	// ovs are the override lists whose target the request matches, most specific first:
	// looked up once per Resolve, then read for each rule.
	ovs [][]*compiledOverride
	// level is the request's trust level (trustLevels.of), looked up for the first adaptive
	// rule; levelUnknown before.
	level int32
	// warned is set when a limit of the last Resolve got a Warning: the next one clears
	// them first. Most snapshots have no warnings, and their checks clear nothing.
	warned bool
}

// levelUnknown marks Scratch.level not looked up yet.
const levelUnknown = -2

// appendIdentity is key.AppendIdentity with the API key's hash computed once per Resolve.
func (sc *Scratch) appendIdentity(dst []byte, kind byte, v string) []byte {
	if kind != 'a' || v == "" {
		return key.AppendIdentity(dst, kind, v)
	}
	return append(dst, sc.apiKeyPart(v)...)
}

// apiKeyPart returns the hashed form of the request's API key v.
func (sc *Scratch) apiKeyPart(v string) []byte {
	if len(sc.secret) == 0 {
		sc.secret = key.AppendSecret(sc.secret, v)
	}
	return sc.secret
}

// Exempt reports whether r comes from an exempt caller: allowed and not counted.
func (s *Snapshot) Exempt(r *Request) bool { return s.exemptions.match(r) }

// Resolve finds the limits that apply to r at now (for override expiry) and builds their keys.
// The result lives in sc and is valid until sc is used again.
//
// Each limit takes the live override of the most specific target that r matches (a target
// matches when r carries every value it names). More attributes named is more specific; between
// as many, the one naming the more specific attribute, in the order api_key, user, tenant,
// endpoint. In full: api_key+user+tenant+endpoint; api_key+user+tenant, api_key+user+endpoint,
// api_key+tenant+endpoint, user+tenant+endpoint; api_key+user, api_key+tenant,
// api_key+endpoint, user+tenant, user+endpoint, tenant+endpoint; api_key, user, tenant,
// endpoint. At one target, an override naming the limit's rule beats one for every rule.
func (s *Snapshot) Resolve(r *Request, now time.Time, sc *Scratch) []Limit {
	limits, _ := s.resolve(r, now, nil, sc)
	return limits
}

// ResolveNow is Resolve that reads the time from clock, and only when an override of the
// snapshot matches r: on some virtual machines reading the wall clock costs more than the rest
// of resolving, and most requests match no override however many there are. It returns the
// time it read, or the zero time when it needed none.
func (s *Snapshot) ResolveNow(r *Request, clock func() time.Time, sc *Scratch) ([]Limit, time.Time) {
	return s.resolve(r, time.Time{}, clock, sc)
}

// resolve is Resolve at now, or, when clock is set, at clock's time read on first need.
func (s *Snapshot) resolve(r *Request, now time.Time, clock func() time.Time, sc *Scratch) ([]Limit, time.Time) {
	if sc.warned {
		// The last Resolve gave limits a Warning; Limits are filled in place, field by field.
		for i := range sc.Limits {
			sc.Limits[i].Warning = ""
		}
		sc.warned = false
	}
	sc.Limits, sc.keys, sc.specs, sc.secret = sc.Limits[:0], sc.keys[:0], sc.specs[:0], sc.secret[:0]
	sc.level = levelUnknown
	sc.cands = s.index.candidates(r, sc.cands[:0])
	// Most policies have no overrides: then sc.ovs is neither read nor written.
	overrides := len(s.shapes) > 0
	if overrides && len(sc.cands) > 0 {
		sc.ovs = s.matchOverrides(r, sc.ovs[:0], sc.apiKeyPart)
	}
	if len(sc.cands) > 1 {
		slices.Sort(sc.cands)
	}
	prev := int32(-1)
	for _, i := range sc.cands {
		if i == prev { // a rule appears once, but stay safe against double filing
			continue
		}
		prev = i
		rule := s.rules[i]
		if !rule.matches(r) {
			continue
		}
		// Filled in place, field by field: a composite literal would be built on the stack and
		// copied, which stalls on store forwarding and costs a measurable part of a Check.
		n := len(sc.Limits)
		if n == cap(sc.Limits) {
			sc.Limits = slices.Grow(sc.Limits, 1)
		}
		sc.Limits = sc.Limits[:n+1]
		l := &sc.Limits[n]
		l.Rule, l.Spec, l.Params, l.Key, l.Override, l.Banned = rule, rule.spec(r.Tier), nil, nil, nil, false
		l.keyStart, l.specIndex = int32(len(sc.keys)), 0
		if rule.adaptive {
			s.adapt(l, r, sc)
		}
		if overrides && len(sc.ovs) > 0 {
			if clock != nil {
				now, clock = clock(), nil
			}
			s.applyOverride(l, sc.ovs, now, sc)
		}
		sc.keys = rule.appendKey(sc.keys, r, sc)
		l.keyEnd = int32(len(sc.keys))
	}
	// Keys and specs are pointed at only now: appending above may have moved the buffers.
	for i := range sc.Limits {
		l := &sc.Limits[i]
		l.Key = sc.keys[l.keyStart:l.keyEnd:l.keyEnd]
		if l.specIndex > 0 {
			l.Spec = &sc.specs[l.specIndex-1]
		}
		l.Params = &l.Spec.Params
	}
	return sc.Limits, now
}

// BanFor returns the ban that the most specific override for r sets at now when no rule
// matched r, so that a banned caller is denied even where no rule counts it.
func (s *Snapshot) BanFor(r *Request, now time.Time) (until time.Time, reason string, ok bool) {
	if len(s.shapes) == 0 {
		return time.Time{}, "", false
	}
	// On the stack: this runs for requests that no rule matched, with no Scratch to work in.
	var lists [16][]*compiledOverride
	var secret [64]byte
	hash := func(v string) []byte { return key.AppendSecret(secret[:0], v) }
	if o := findOverride(s.matchOverrides(r, lists[:0], hash), "", now); o != nil && o.kind == overrideBan {
		return o.expiresAt, o.Reason, true
	}
	return time.Time{}, "", false
}

// matchOverrides appends to dst the override lists whose target r matches, most specific
// target first. Only the shapes the policy uses are looked up. hash gives the key form of the
// request's API key (see Scratch.apiKeyPart); it is called only when an override names an API
// key, and only once.
func (s *Snapshot) matchOverrides(r *Request, dst [][]*compiledOverride, hash func(string) []byte) [][]*compiledOverride {
	apiKey, hashed := "", false
	for _, sh := range s.shapes {
		if sh == shapeIP {
			dst = s.matchIP(r.IP, dst)
			continue
		}
		var t target
		if sh&shapeTenant != 0 {
			if r.Tenant == "" {
				continue
			}
			t.tenant = r.Tenant
		}
		if sh&shapeUser != 0 {
			if r.User == "" {
				continue
			}
			t.user = r.User
		}
		if sh&shapeEndpoint != 0 {
			if r.Endpoint == "" {
				continue
			}
			t.endpoint = r.Endpoint
		}
		if sh&shapeAPIKey != 0 {
			if !hashed && r.APIKey != "" {
				// The lookup by string(bytes) does not allocate, and gives the key as the
				// targets hold it; a key no override names matches no API-key shape.
				apiKey, hashed = s.apiKeys[string(hash(r.APIKey))], true
			}
			if apiKey == "" {
				continue
			}
			t.apiKey = apiKey
		}
		var list []*compiledOverride
		if i := singleIndex(sh); i >= 0 {
			list = s.single[i][t.value(sh)]
		} else {
			list = s.overrides[t]
		}
		if len(list) > 0 {
			dst = append(dst, list)
		}
	}
	return dst
}

// findOverride returns the live override for rule from lists, the lists matchOverrides found
// for a request: the most specific target that has one (see shape.moreSpecific), and at one
// target an override naming rule before one for every rule, then the first listed. Warnings
// are not among them: see findWarning.
func findOverride(lists [][]*compiledOverride, rule string, now time.Time) *compiledOverride {
	return find(lists, rule, now, false)
}

// findWarning is findOverride for warning overrides alone. A warning changes no limit, so it
// is found apart: a user's warning must not hide its tenant's multiplier.
func findWarning(lists [][]*compiledOverride, rule string, now time.Time) *compiledOverride {
	return find(lists, rule, now, true)
}

func find(lists [][]*compiledOverride, rule string, now time.Time, warning bool) *compiledOverride {
	for _, list := range lists {
		var general *compiledOverride
		for _, o := range list {
			if (o.kind == overrideWarn) != warning || !now.Before(o.expiresAt) {
				continue
			}
			if o.rule == rule && rule != "" {
				return o
			}
			if o.rule == "" && general == nil {
				general = o
			}
		}
		if general != nil {
			return general
		}
	}
	return nil
}

func (s *Snapshot) applyOverride(l *Limit, lists [][]*compiledOverride, now time.Time, sc *Scratch) {
	if s.warns {
		if w := findWarning(lists, l.Rule.Name, now); w != nil {
			l.Warning, sc.warned = w.warning, true
		}
	}
	o := findOverride(lists, l.Rule.Name, now)
	if o == nil {
		return
	}
	l.Override = o
	base := l.Spec
	if o.kind == overrideBan {
		l.Banned = true
		return
	}
	limit, burst := o.reshape(base.Limit, base.Burst)
	spec, err := newSpec(base.Params.Kind, limit, burst, base.Period, base.Soft, base.Hard, base.Params.Calendar(), base.Params.Drains())
	if err != nil {
		// An override too large to count exactly keeps the rule's own limit rather than failing
		// every request; Compile cannot see this because it depends on the tier.
		return
	}
	sc.specs = append(sc.specs, spec)
	l.specIndex = int32(len(sc.specs))
}

// reshape returns the limit and burst that a multiplier or custom override o makes of a
// limit's.
func (o *compiledOverride) reshape(limit, burst int64) (int64, int64) {
	switch o.kind {
	case overrideMultiplier:
		// Compile bounds both factors (MaxLimit, maxMultiplier), so the products are exact.
		// At least 1: a multiplier throttles; rounded down to 0 it would deny every request
		// as a cost the limit can never admit, a ban under a misleading reason.
		return max(1, int64(math.Floor(float64(limit)*o.value))), max(1, int64(math.Floor(float64(burst)*o.value)))
	case overrideCustom:
		if o.burst == 0 {
			return o.limit, o.limit
		}
		return o.limit, o.burst
	}
	return limit, burst
}

// appendKey appends the bucket key of c for r.
func (c *CompiledRule) appendKey(dst []byte, r *Request, sc *Scratch) []byte {
	dst = append(dst, c.head...)
	if c.tagged {
		if kind, v := c.tag(r); kind == 'a' && v != "" {
			dst = key.AppendTagPart(dst, kind, sc.apiKeyPart(v))
		} else {
			dst = key.AppendTag(dst, kind, v)
		}
	}
	for i := range c.key {
		switch a := &c.key[i]; a.kind {
		case attrIdentity:
			// The kind is part of the value: user "x" and api key "x" are different callers.
			kind, v := r.Identity()
			dst = append(dst, ':', identityByte(kind), '=')
			dst = sc.appendIdentity(dst, kind, v)
		case attrAPIKey:
			dst = sc.appendIdentity(append(dst, ':'), 'a', r.APIKey)
		case attrMethod:
			// Methods match without letter case, so they key without it too: "get" is GET's
			// bucket, not a fresh one.
			dst = key.AppendValue(dst, upperASCII(r.Method))
		default:
			dst = key.AppendValue(dst, a.value(r))
		}
	}
	return dst
}

// tag picks the most specific identity among c's key attributes: api_key, then user, then ip.
func (c *CompiledRule) tag(r *Request) (byte, string) {
	if c.tagOnly >= 0 {
		switch a := c.key[c.tagOnly]; a.kind {
		case attrAPIKey:
			return 'a', r.APIKey
		case attrUser:
			return 'u', r.User
		case attrIP:
			return 'i', r.IP
		}
		kind, v := r.Identity()
		return identityByte(kind), v
	}
	best, kind, v := 99, byte(0), ""
	for _, a := range c.key {
		var k byte
		var val string
		switch a.kind {
		case attrAPIKey:
			k, val = 'a', r.APIKey
		case attrUser:
			k, val = 'u', r.User
		case attrIP:
			k, val = 'i', r.IP
		case attrIdentity:
			k, val = r.Identity()
		default:
			continue
		}
		if rank := identityRank(k); rank < best {
			best, kind, v = rank, k, val
		}
	}
	return identityByte(kind), v
}

func identityRank(kind byte) int {
	switch kind {
	case 'a':
		return 0
	case 'u':
		return 1
	case 'i':
		return 2
	}
	return 3
}

// identityByte spells "no identity" as '-' so that keys stay printable.
func identityByte(kind byte) byte {
	if kind == 0 {
		return '-'
	}
	return kind
}

// HasOverrides reports whether the policy has overrides, so a caller can skip reading the
// clock that only their expiry needs.
func (s *Snapshot) HasOverrides() bool { return len(s.shapes) > 0 }
