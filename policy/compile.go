package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store"
)

// StoreErrorMode says what a rule decides when its store cannot be reached; native rules and
// Envoy limits share the one type.
type StoreErrorMode = store.ErrorMode

// The on_store_error modes.
const (
	FailOpen   = store.FailOpen
	FailClosed = store.FailClosed
	FailLocal  = store.FailLocal
)

// Snapshot is a compiled policy: immutable, safe for any number of goroutines, and swapped
// whole when the policy changes so that a check never sees half of two policies.
type Snapshot struct {
	// Version identifies the policy's content: the same files give the same version, a hash
	// of their contents; compiled with the control store (CompileWith) it is
	// Version(files version, control version).
	Version string

	rules     []*CompiledRule
	byName    map[string]*CompiledRule
	index     ruleIndex
	overrides map[target][]*compiledOverride // of the shapes of two or more attributes
	// single holds the overrides of one-attribute shapes (a tenant, a user, an API key or an
	// endpoint: most of them), by singleIndex and the attribute's value. A string key hashes
	// in about a third of the time of a target (docs/measurements.md), and every request
	// pays this lookup for every shape the policy uses.
	single     [4]map[string][]*compiledOverride
	exemptions exemptions
	ids        identities
	// trust is the callers whose adaptive limits differ from their rules' (adaptive.go).
	trust trustLevels
	// warns is set when an override is a warning, which Resolve then looks for besides the
	// override that sets a limit; escalates when a rule has an escalation.
	warns, escalates bool
	envoy            *envoyconf.Config
	shapes           []shape           // the target shapes overrides use, most specific first (see matchOverrides)
	ips              []ipOverrides     // the ip targets, longest prefix first (see matchIP)
	apiKeys          map[string]string // the hashed API keys overrides name, each to itself (see matchOverrides)

	filesVersion   string
	controlVersion int64
	// nextExpiry is the earliest expiry of an exemption in the snapshot (zero for none): the
	// snapshot is to be compiled again then (see CompileWith).
	nextExpiry time.Time
}

// CompiledRule is a Rule ready to apply.
type CompiledRule struct {
	Name         string
	Scope        string // the key attributes, "tenant+user", or "global"
	Algorithm    algorithm.Kind
	Shadow       bool
	OnStoreError StoreErrorMode

	order  int
	head   []byte // sl:<name>:<version>
	key    []attr
	tagged bool // the key holds an identity, which becomes the Redis hash tag
	// identityKeys has a bit per identity attribute in key (keyUser, keyAPIKey, keyIP,
	// keyIdentity), so a request missing one is told apart without walking the key.
	identityKeys uint8
	// tagOnly is the index in key of the one identity attribute, which then is the tag; -1
	// when there are several and each request picks the most specific.
	tagOnly int
	match   []filter
	base    Spec
	tiers   map[string]*Spec
	// esc is the rule's escalation, nil for none (escalation.go).
	esc *escalation
	// adaptive is set for adaptive: trust; adapted holds the rule's specs per trust level
	// (adaptive.go).
	adaptive bool
	adapted  []adaptedSpecs
	// regions is the rule's regions mode (regions.go).
	regions RegionMode
	home    string
}

// Spec is a limit's nominal numbers and the effective parameters derived from them.
type Spec struct {
	Limit, Burst int64 // nominal, before the hard threshold's tolerance
	Period       time.Duration
	Soft, Hard   int64 // percent; Soft 0 means none
	Params       algorithm.Params
}

// Nominal is the capacity that thresholds are measured against: Burst for the bucket
// algorithms, Limit for the windows.
func (s *Spec) Nominal() int64 {
	if s.Params.Kind.IsBucket() {
		return s.Burst
	}
	return s.Limit
}

// newSpec derives the effective parameters: the hard threshold scales limit and burst. limit
// and burst are at most algorithm.MaxLimit and hard at most maxHard, so the products stay far
// inside int64; newSpec checks it again because overrides reach it at run time.
// A calendar (nil for none) aligns a fixed_window's windows to it; period is then its nominal
// length.
// drain sets on_deny: drain.
func newSpec(kind algorithm.Kind, limit, burst int64, period time.Duration, soft, hard int64, cal *algorithm.Calendar, drain bool) (Spec, error) {
	if burst <= 0 || !kind.IsBucket() {
		burst = limit
	}
	if limit < 0 || limit > algorithm.MaxLimit || burst > algorithm.MaxLimit || hard < 1 || hard > maxHard {
		return Spec{}, fmt.Errorf("%w: limit %d, burst %d, hard %d out of range", algorithm.ErrParams, limit, burst, hard)
	}
	p, err := algorithm.NewParams(kind, limit*hard/100, burst*hard/100, period)
	if err == nil && cal != nil {
		p, err = p.WithCalendar(cal)
	}
	if err == nil && drain {
		p, err = p.WithDrain()
	}
	return Spec{Limit: limit, Burst: burst, Period: period, Soft: soft, Hard: hard, Params: p}, err
}

// Rules returns the compiled rules in policy order.
func (s *Snapshot) Rules() []*CompiledRule { return s.rules }

// Rule returns the rule named name, or nil.
func (s *Snapshot) Rule(name string) *CompiledRule { return s.byName[name] }

// Envoy returns the Envoy-format configuration of the snapshot, or nil.
func (s *Snapshot) Envoy() *envoyconf.Config { return s.envoy }

// WithEnvoy returns a copy of s that also answers Envoy-style descriptor requests from cfg,
// with version as its version. Both kinds of policy live in one Snapshot so they swap together.
func (s *Snapshot) WithEnvoy(cfg *envoyconf.Config, version string) *Snapshot {
	c := *s
	c.envoy = cfg
	if version != "" {
		c.Version = version
	}
	return &c
}

// Compile validates configs, one per file, and builds their Snapshot. Rule names are unique
// across all of them. It reports every mistake it finds, each a *FieldError naming the file,
// the line of the field and the field, joined with errors.Join (at most maxErrors of them).
func Compile(cfgs ...*Config) (*Snapshot, error) {
	var errs errorList
	s := compile(cfgs, nil, &errs)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// compile builds the snapshot of cfgs, with the Envoy-format configuration envoy (nil for
// none) whose limits overrides may name, adding every mistake to errs; the snapshot is
// meaningless when errs is not empty.
func compile(cfgs []*Config, envoy *envoyconf.Config, errs *errorList) *Snapshot {
	b := newBuilder()
	b.s.envoy = envoy
	for _, cfg := range cfgs {
		for i := range cfg.Rules {
			for _, err := range b.rule(&cfg.Rules[i]) {
				errs.add(cfg.locate(err, "rules", i))
			}
		}
	}
	b.indexRules()
	h := sha256.New()
	for _, cfg := range cfgs {
		b.fileTargets(cfg, errs)
		canonical, _ := json.Marshal(cfg)
		h.Write(canonical)
	}
	b.finish()
	b.s.Version = hex.EncodeToString(h.Sum(nil)[:6])
	return b.s
}

// builder assembles a Snapshot: every rule first (overrides name them), then the index, then
// overrides, exemptions and identity assignments, then finish.
type builder struct {
	s     *Snapshot
	names map[string]bool // of rules with mistakes too, so that a duplicate is still one
	seen  map[shape]bool
}

func newBuilder() *builder {
	return &builder{
		s:     &Snapshot{byName: map[string]*CompiledRule{}, overrides: map[target][]*compiledOverride{}},
		names: map[string]bool{},
		seen:  map[shape]bool{},
	}
}

// rule compiles r and adds it, or returns its mistakes; a name taken already is one of them.
func (b *builder) rule(r *Rule) []error {
	c, errs := compileRule(r, len(b.s.rules))
	if name := r.Name; name != "" {
		if b.names[name] {
			return append(errs, &FieldError{Field: "name", Msg: fmt.Sprintf("duplicate rule name %q", name)})
		}
		b.names[name] = true
	}
	if c == nil {
		return errs
	}
	b.s.byName[c.Name] = c
	b.s.rules = append(b.s.rules, c)
	b.s.escalates = b.s.escalates || c.esc != nil
	return errs
}

func (b *builder) indexRules() { b.s.index = buildIndex(b.s.rules) }

// fileTargets adds the overrides and exemptions of cfg.
func (b *builder) fileTargets(cfg *Config, errs *errorList) {
	for i := range cfg.Overrides {
		for _, err := range b.override(&cfg.Overrides[i], fileSources) {
			errs.add(cfg.locate(err, "overrides", i))
		}
	}
	for i := range cfg.Exemptions {
		if err := b.s.exemptions.add(&cfg.Exemptions[i]); err != nil {
			errs.add(cfg.locate(err, "exemptions", i))
		}
	}
}

// override compiles o and adds it, or returns its mistakes. sources are the values its
// Source may take.
func (b *builder) override(o *Override, sources []string) []error {
	return b.overrideID(o, sources, 0)
}

// overrideID is override for the control store's override of that id.
func (b *builder) overrideID(o *Override, sources []string, id int64) []error {
	c, errs := b.s.compileOverride(o, sources)
	if c == nil {
		return errs
	}
	c.id = id
	s := b.s
	if c.shape == shapeIP {
		s.addIP(c)
	} else if i := singleIndex(c.shape); i >= 0 {
		if s.single[i] == nil {
			s.single[i] = map[string][]*compiledOverride{}
		}
		v := c.target.value(c.shape)
		s.single[i][v] = append(s.single[i][v], c)
	} else {
		s.overrides[c.target] = append(s.overrides[c.target], c)
	}
	if c.apiKey != "" {
		if s.apiKeys == nil {
			s.apiKeys = map[string]string{}
		}
		s.apiKeys[c.apiKey] = c.apiKey
	}
	if !b.seen[c.shape] {
		b.seen[c.shape] = true
		s.shapes = append(s.shapes, c.shape)
	}
	if c.kind == overrideWarn {
		s.warns = true
	}
	return nil
}

// finish orders the override shapes, most specific first (see matchOverrides).
func (b *builder) finish() {
	slices.SortFunc(b.s.shapes, func(a, b shape) int {
		if a.moreSpecific(b) {
			return -1
		}
		return 1
	})
}

// errorList collects the mistakes of a policy, up to maxErrors.
type errorList struct {
	errs    []error
	dropped int
}

func (l *errorList) add(err error) {
	if err == nil {
		return
	}
	if len(l.errs) >= maxErrors {
		l.dropped++
		return
	}
	l.errs = append(l.errs, err)
}

// err joins the mistakes in file and line order, or returns nil when there are none.
func (l *errorList) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(l.errs, func(a, b error) int {
		fa, _ := a.(*FieldError)
		fb, _ := b.(*FieldError)
		if fa == nil || fb == nil {
			return 0
		}
		if c := strings.Compare(fa.File, fb.File); c != 0 {
			return c
		}
		return fa.Line - fb.Line
	})
	if l.dropped > 0 {
		l.errs = append(l.errs, &FieldError{Field: "policy", Msg: fmt.Sprintf("%d more mistakes not shown", l.dropped)})
	}
	return errors.Join(l.errs...)
}

// locate adds the file, the line and the list position to an error found in entry i of list.
// The line is the field's own, or that of the nearest enclosing part that was written (the
// entry itself for a missing field). It returns nil for a mistake ParseConfig already reported
// on that field or one enclosing it, which Compile sees again only as its consequence.
func (c *Config) locate(err error, list string, i int) error {
	fe, ok := err.(*FieldError)
	if !ok {
		fe = &FieldError{Msg: err.Error()}
	}
	fe.File = c.file
	entry := fmt.Sprintf("%s[%d]", list, i)
	if fe.Field == "" {
		fe.Field = entry
	} else {
		fe.Field = join(entry, fe.Field)
	}
	for path := fe.Field; ; {
		if c.bad[path] {
			return nil
		}
		if line, ok := c.lines[path]; ok && fe.Line == 0 {
			if path == fe.Field {
				fe.given()
			}
			fe.Line = line
		}
		cut := max(strings.LastIndexByte(path, '.'), strings.LastIndexByte(path, '['))
		if cut <= 0 {
			break
		}
		path = path[:cut]
	}
	return fe
}

// Bounds of the numeric fields of a rule (algorithm.MaxLimit, MinPeriod and MaxPeriod bound
// limits, bursts and periods).
const (
	maxHard    = 1000 // percent: a tolerance of up to 10 times the limit
	maxNameLen = 128
)

// checkCount reports a limit or burst outside [1, algorithm.MaxLimit].
func checkCount(field string, v int64) error {
	if v < 1 || v > algorithm.MaxLimit {
		return &FieldError{Field: field, Msg: fmt.Sprintf("must be from 1 to %d, got %d", int64(algorithm.MaxLimit), v)}
	}
	return nil
}

// errCalendar marks a period that compileCalendar or calendars.period already reported.
var errCalendar = errors.New("calendar period")

// checkPeriod reports a period outside [algorithm.MinPeriod, algorithm.MaxPeriod] or not a
// whole number of microseconds, the unit the algorithms count in.
func checkPeriod(field string, d time.Duration) error {
	if d == PeriodMonth || d == PeriodYear {
		text, _ := Duration(d).MarshalText()
		return &FieldError{Field: field, Msg: fmt.Sprintf("%s is a calendar period: it needs calendar (a time zone) on a fixed_window rule", text)}
	}
	if d < algorithm.MinPeriod || d > algorithm.MaxPeriod {
		return &FieldError{Field: field, Msg: fmt.Sprintf("must be from %s to %dd (e.g. 1s, 1m, 1h, 1d), got %s", algorithm.MinPeriod, algorithm.MaxPeriod/(24*time.Hour), d)}
	}
	if d%time.Microsecond != 0 {
		return &FieldError{Field: field, Msg: fmt.Sprintf("must be a whole number of microseconds, got %s", d)}
	}
	return nil
}

// compileRule compiles r, or returns every mistake it finds in it. The rule is nil when there
// is any.
func compileRule(r *Rule, order int) (*CompiledRule, []error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case r.Name == "":
		bad("name", "required")
	case strings.HasPrefix(r.Name, "@"):
		bad("name", "must not start with '@', which marks Envoy-format buckets")
	case len(r.Name) > maxNameLen:
		bad("name", "longer than %d bytes", maxNameLen)
	}
	kindName := r.Algorithm
	if kindName == "" {
		kindName = "token_bucket"
	}
	kind, err := algorithm.ParseKind(kindName)
	if err != nil {
		bad("algorithm", "%v", err)
	}
	c := &CompiledRule{Name: r.Name, Algorithm: kind, Shadow: r.Shadow, order: order}
	switch r.OnStoreError {
	case "", "open":
		c.OnStoreError = FailOpen
	case "closed":
		c.OnStoreError = FailClosed
	case "local":
		c.OnStoreError = FailLocal
	default:
		bad("on_store_error", "%q is not open, closed or local", r.OnStoreError)
	}
	switch r.Adaptive {
	case "":
	case AdaptiveTrust:
		c.adaptive = true
	default:
		bad("adaptive", "%q is not trust", r.Adaptive)
	}
	c.regions, c.home = compileRegions(r.Name, r.Regions, kind, bad)
	drain := false
	switch r.OnDeny {
	case "":
	case "drain":
		drain = true
		if kind == algorithm.SlidingWindowCounter || kind == algorithm.Concurrency {
			bad("on_deny", "drain applies to token_bucket, gcra, leaky_bucket, fixed_window and sliding_window_log, not %s", kind)
			drain = false
		}
	default:
		bad("on_deny", "%q is not drain", r.OnDeny)
	}
	if r.Escalation != nil {
		esc, eerrs := compileEscalation(r.Name, r.Escalation)
		errs = append(errs, eerrs...)
		c.esc = esc
	}

	limitOK := checkCount("limit", r.Limit)
	if r.Limit == 0 {
		limitOK = &FieldError{Field: "limit", Msg: fmt.Sprintf("required: a whole number from 1 to %d", int64(algorithm.MaxLimit)),
			ifGiven: checkCount("limit", 0).(*FieldError).Msg}
	}
	check(limitOK)
	period := time.Duration(r.Period)
	periodOK := error(nil)
	cals := compileCalendar(r, kind, bad)
	var cal *algorithm.Calendar
	switch {
	case kind == algorithm.Concurrency:
		// Leases in flight: nothing refills with time.
		if period != 0 {
			periodOK = &FieldError{Field: "period", Msg: "not taken by concurrency: it limits leases in flight, and nothing refills with time"}
		}
	case period == 0:
		periodOK = &FieldError{Field: "period", Msg: "required (e.g. 1s, 1m, 1h, 1d)", ifGiven: checkPeriod("period", 0).(*FieldError).Msg}
	case cals != nil:
		var ok bool
		if cal, period, ok = cals.period("period", period, bad); !ok {
			periodOK = errCalendar
		}
	case r.Calendar.Zone() != "":
		periodOK = errCalendar // compileCalendar reported it
	default:
		periodOK = checkPeriod("period", period)
	}
	if periodOK != errCalendar {
		check(periodOK)
	}
	var burst int64
	burstOK := error(nil)
	if r.Burst != nil {
		burst = *r.Burst
		burstOK = checkCount("burst", burst)
		if burstOK == nil && kind != 0 && !kind.IsBucket() {
			burstOK = &FieldError{Field: "burst", Msg: "applies only to token_bucket, gcra and leaky_bucket"}
		}
		check(burstOK)
	}
	hard := int64(100)
	if r.Hard != nil {
		hard = *r.Hard
		if hard < 1 || hard > maxHard {
			bad("hard", "must be a percentage from 1 to %d, got %d", maxHard, hard)
			hard = 100
		}
	}
	var soft int64
	if r.Soft != nil {
		soft = *r.Soft
		if soft < 1 || soft >= hard {
			bad("soft", "must be a percentage from 1 to %d (below hard, %d), got %d", hard-1, hard, soft)
		}
	}
	// The spec needs every number above; a mistake in one is reported once, where it is.
	numbersOK := kind != 0 && limitOK == nil && periodOK == nil && burstOK == nil
	if numbersOK {
		spec, err := newSpec(kind, r.Limit, burst, period, soft, hard, cal, drain)
		if err != nil {
			check(specError(err, r.Limit, burst, hard, ""))
		}
		c.base = spec
	}
	names := make([]string, 0, len(r.Tiers))
	for name := range r.Tiers {
		names = append(names, name)
	}
	slices.Sort(names) // a stable order of errors
	for _, name := range names {
		t := r.Tiers[name]
		path := "tiers." + name
		if name == "" {
			bad("tiers", "empty tier name")
			continue
		}
		if t.Limit == nil && t.Burst == nil && t.Period == nil {
			bad(path, "sets none of limit, burst and period")
			continue
		}
		limit, tburst, tp, tcal := r.Limit, burst, period, cal
		tierOK := true
		if t.Limit != nil {
			// A tier's own limit takes its own burst: the rule's burst was sized for its limit.
			limit, tburst = *t.Limit, 0
			if err := checkCount(path+".limit", limit); err != nil {
				check(err)
				tierOK = false
			}
		}
		if t.Burst != nil {
			tburst = *t.Burst
			if err := checkCount(path+".burst", tburst); err != nil {
				check(err)
				tierOK = false
			} else if kind != 0 && !kind.IsBucket() {
				bad(path+".burst", "applies only to token_bucket, gcra and leaky_bucket")
				tierOK = false
			}
		}
		if t.Period != nil {
			tp = time.Duration(*t.Period)
			if kind == algorithm.Concurrency {
				bad(path+".period", "not taken by concurrency: it limits leases in flight")
				tierOK = false
			} else if cals != nil {
				var ok bool
				tcal, tp, ok = cals.period(path+".period", tp, bad)
				tierOK = tierOK && ok
			} else if err := checkPeriod(path+".period", tp); err != nil {
				check(err)
				tierOK = false
			}
		}
		if !tierOK || !numbersOK {
			continue
		}
		spec, err := newSpec(kind, limit, tburst, tp, soft, hard, tcal, drain)
		if err != nil {
			check(specError(err, limit, tburst, hard, path+"."))
			continue
		}
		if c.tiers == nil {
			c.tiers = map[string]*Spec{}
		}
		c.tiers[name] = &spec
	}
	seen := map[string]bool{}
	var scope []string
	for i, k := range r.Key {
		field := fmt.Sprintf("key[%d]", i)
		a, err := parseAttr(k)
		if err != nil {
			bad(field, "%v", err)
			continue
		}
		if seen[k] {
			bad(field, "%q listed twice", k)
			continue
		}
		seen[k] = true
		c.key = append(c.key, a)
		scope = append(scope, k)
		switch a.kind {
		case attrUser:
			c.identityKeys |= keyUser
		case attrAPIKey:
			c.identityKeys |= keyAPIKey
		case attrIP:
			c.identityKeys |= keyIP
		case attrIdentity:
			c.identityKeys |= keyIdentity
		}
		if a.kind == attrUser || a.kind == attrAPIKey || a.kind == attrIP || a.kind == attrIdentity {
			c.tagOnly = -1
			if !c.tagged {
				c.tagOnly = len(c.key) - 1
			}
			c.tagged = true
		}
	}
	c.Scope = strings.Join(scope, "+")
	if c.Scope == "" {
		c.Scope = "global"
	}
	// The version changes only with what the stored state means (algorithm and key), so that
	// editing a limit keeps every caller's state instead of resetting it.
	h := fnv.New32a()
	fmt.Fprintf(h, "%s|%s", kind, c.Scope)
	c.head = key.AppendHead(nil, r.Name, fmt.Sprintf("%08x", h.Sum32()))
	match, merrs := compileMatch(&r.Match)
	errs = append(errs, merrs...)
	c.match = match
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// specError names the field of a limit that cannot be counted: past the range once the hard
// threshold scales it, or too fine for exact arithmetic. prefix is "tiers.NAME." for a tier.
func specError(err error, limit, burst, hard int64, prefix string) error {
	switch {
	case limit*hard/100 > algorithm.MaxLimit:
		return &FieldError{Field: prefix + "limit", Msg: fmt.Sprintf("%d at hard %d%% is %d, above the maximum %d", limit, hard, limit*hard/100, int64(algorithm.MaxLimit))}
	case burst*hard/100 > algorithm.MaxLimit:
		return &FieldError{Field: prefix + "burst", Msg: fmt.Sprintf("%d at hard %d%% is %d, above the maximum %d", burst, hard, burst*hard/100, int64(algorithm.MaxLimit))}
	case burst > 0:
		return &FieldError{Field: prefix + "burst", Msg: err.Error()}
	}
	return &FieldError{Field: prefix + "limit", Msg: err.Error()}
}

// spec returns the limit of tier, or the rule's own.
func (c *CompiledRule) spec(tier string) *Spec {
	if tier != "" && c.tiers != nil {
		if s := c.tiers[tier]; s != nil {
			return s
		}
	}
	return &c.base
}

// The bits of CompiledRule.identityKeys.
const (
	keyUser uint8 = 1 << iota
	keyAPIKey
	keyIP
	keyIdentity
)

// MissesIdentity reports whether r lacks an identity attribute that c keys on (user, api_key,
// ip, or all three for identity). Such a request is counted in c's bucket for "no value", which
// it shares with every request that lacks the same attribute: docs/architecture.md, Identity.
func (c *CompiledRule) MissesIdentity(r *Request) bool {
	k := c.identityKeys
	if k == 0 {
		return false
	}
	return k&keyUser != 0 && r.User == "" || k&keyAPIKey != 0 && r.APIKey == "" || k&keyIP != 0 && r.IP == "" ||
		k&keyIdentity != 0 && r.User == "" && r.APIKey == "" && r.IP == ""
}
