package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// StoreErrorMode says what a rule decides when its store cannot be reached.
type StoreErrorMode uint8

// The on_store_error modes.
const (
	FailOpen   StoreErrorMode = iota // allow, marked degraded
	FailClosed                       // deny
	FailLocal                        // decide with an in-process limiter of the same parameters
)

func (m StoreErrorMode) String() string {
	return [...]string{"open", "closed", "local"}[m]
}

// Snapshot is a compiled policy: immutable, safe for any number of goroutines, and swapped
// whole when the policy changes so that a check never sees half of two policies.
type Snapshot struct {
	// Version identifies the policy's content: the same files give the same version.
	Version string

	rules      []*CompiledRule
	byName     map[string]*CompiledRule
	index      ruleIndex
	overrides  map[target][]*compiledOverride
	exemptions exemptions
	envoy      *envoyconf.Config
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
	// tagOnly is the index in key of the one identity attribute, which then is the tag; -1
	// when there are several and each request picks the most specific.
	tagOnly int
	match   []filter
	base    Spec
	tiers   map[string]*Spec
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

// newSpec derives the effective parameters: the hard threshold scales limit and burst.
func newSpec(kind algorithm.Kind, limit, burst int64, period time.Duration, soft, hard int64) (Spec, error) {
	if burst <= 0 || !kind.IsBucket() {
		burst = limit
	}
	p, err := algorithm.NewParams(kind, limit*hard/100, burst*hard/100, period)
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
// across all of them. Errors name the file, line and field.
func Compile(cfgs ...*Config) (*Snapshot, error) {
	s := &Snapshot{byName: map[string]*CompiledRule{}, overrides: map[target][]*compiledOverride{}}
	for _, cfg := range cfgs {
		for i := range cfg.Rules {
			r, err := compileRule(&cfg.Rules[i], len(s.rules))
			if err != nil {
				return nil, cfg.locate(err, "rules", i)
			}
			if s.byName[r.Name] != nil {
				return nil, cfg.locate(&FieldError{Field: "name", Msg: fmt.Sprintf("duplicate rule name %q", r.Name)}, "rules", i)
			}
			s.byName[r.Name] = r
			s.rules = append(s.rules, r)
		}
	}
	s.index = buildIndex(s.rules)
	h := sha256.New()
	for _, cfg := range cfgs {
		for i := range cfg.Overrides {
			o, err := s.compileOverride(&cfg.Overrides[i])
			if err != nil {
				return nil, cfg.locate(err, "overrides", i)
			}
			s.overrides[o.target] = append(s.overrides[o.target], o)
		}
		for i := range cfg.Exemptions {
			if err := s.exemptions.add(&cfg.Exemptions[i]); err != nil {
				return nil, cfg.locate(err, "exemptions", i)
			}
		}
		canonical, _ := json.Marshal(cfg)
		h.Write(canonical)
	}
	s.Version = hex.EncodeToString(h.Sum(nil)[:6])
	return s, nil
}

// locate adds the file, line and list position to an error found in entry i of list.
func (c *Config) locate(err error, list string, i int) error {
	fe, ok := err.(*FieldError)
	if !ok {
		fe = &FieldError{Msg: err.Error()}
	}
	fe.File = c.file
	lines := map[string][]int{"rules": c.ruleLines, "overrides": c.overrideLines, "exemptions": c.exemptionLines}[list]
	if i < len(lines) {
		fe.Line = lines[i]
	}
	fe.Field = fmt.Sprintf("%s[%d].%s", list, i, fe.Field)
	return fe
}

func compileRule(r *Rule, order int) (*CompiledRule, error) {
	if r.Name == "" {
		return nil, &FieldError{Field: "name", Msg: "required"}
	}
	if strings.HasPrefix(r.Name, "@") {
		return nil, &FieldError{Field: "name", Msg: "must not start with '@', which marks Envoy-format buckets"}
	}
	if len(r.Name) > 128 {
		return nil, &FieldError{Field: "name", Msg: "longer than 128 bytes"}
	}
	kindName := r.Algorithm
	if kindName == "" {
		kindName = "token_bucket"
	}
	kind, err := algorithm.ParseKind(kindName)
	if err != nil {
		return nil, &FieldError{Field: "algorithm", Msg: err.Error()}
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
		return nil, &FieldError{Field: "on_store_error", Msg: fmt.Sprintf("%q is not open, closed or local", r.OnStoreError)}
	}
	if r.Limit < 1 {
		return nil, &FieldError{Field: "limit", Msg: "must be >= 1"}
	}
	period := time.Duration(r.Period)
	if period <= 0 {
		return nil, &FieldError{Field: "period", Msg: "required (e.g. 1s, 1m, 1h, 1d)"}
	}
	if r.Burst < 0 {
		return nil, &FieldError{Field: "burst", Msg: "must be >= 1"}
	}
	if r.Burst > 0 && !kind.IsBucket() {
		return nil, &FieldError{Field: "burst", Msg: "applies only to token_bucket, gcra and leaky_bucket"}
	}
	hard := r.Hard
	if hard == 0 {
		hard = 100
	}
	if hard < 1 || hard > 1000 {
		return nil, &FieldError{Field: "hard", Msg: "must be a percentage from 1 to 1000"}
	}
	if r.Soft < 0 || (r.Soft > 0 && r.Soft >= hard) {
		return nil, &FieldError{Field: "soft", Msg: fmt.Sprintf("must be a percentage below hard (%d)", hard)}
	}
	if c.base, err = newSpec(kind, r.Limit, r.Burst, period, r.Soft, hard); err != nil {
		return nil, &FieldError{Field: "limit", Msg: err.Error()}
	}
	for name, t := range r.Tiers {
		if name == "" {
			return nil, &FieldError{Field: "tiers", Msg: "empty tier name"}
		}
		limit, burst, tp := r.Limit, r.Burst, period
		if t.Limit < 0 || t.Burst < 0 {
			return nil, &FieldError{Field: "tiers." + name, Msg: "limit and burst must be >= 1"}
		}
		if t.Limit > 0 {
			limit, burst = t.Limit, 0
		}
		if t.Burst > 0 {
			burst = t.Burst
		}
		if t.Period > 0 {
			tp = time.Duration(t.Period)
		}
		spec, err := newSpec(kind, limit, burst, tp, r.Soft, hard)
		if err != nil {
			return nil, &FieldError{Field: "tiers." + name, Msg: err.Error()}
		}
		if c.tiers == nil {
			c.tiers = map[string]*Spec{}
		}
		c.tiers[name] = &spec
	}
	seen := map[string]bool{}
	var scope []string
	for _, k := range r.Key {
		a, err := parseAttr(k)
		if err != nil {
			return nil, &FieldError{Field: "key", Msg: err.Error()}
		}
		if seen[k] {
			return nil, &FieldError{Field: "key", Msg: fmt.Sprintf("%q listed twice", k)}
		}
		seen[k] = true
		c.key = append(c.key, a)
		scope = append(scope, k)
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
	if c.match, err = compileMatch(&r.Match); err != nil {
		return nil, err
	}
	return c, nil
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

// target is where an override applies; lookups go from the most specific to the least.
type target struct{ tenant, user, endpoint string }

type compiledOverride struct {
	target
	rule      string
	kind      overrideKind
	value     float64
	limit     int64
	burst     int64
	expiresAt time.Time
	// Reason and source travel with decisions that an override shaped.
	Reason, Source string
}

type overrideKind uint8

const (
	overrideBan overrideKind = iota + 1
	overrideMultiplier
	overrideCustom
)

func (s *Snapshot) compileOverride(o *Override) (*compiledOverride, error) {
	c := &compiledOverride{
		target: target{o.Tenant, o.User, o.Endpoint}, rule: o.Rule,
		value: o.Value, limit: o.Limit, burst: o.Burst, expiresAt: o.ExpiresAt,
		Reason: o.Reason, Source: o.Source,
	}
	if o.Tenant == "" && o.User == "" && o.Endpoint == "" {
		return nil, &FieldError{Field: "tenant", Msg: "an override needs a target: tenant, user or endpoint"}
	}
	if strings.Contains(o.Endpoint, "*") {
		return nil, &FieldError{Field: "endpoint", Msg: "an override names one endpoint; wildcards belong in rules"}
	}
	if o.Rule != "" && s.byName[o.Rule] == nil {
		return nil, &FieldError{Field: "rule", Msg: fmt.Sprintf("no rule named %q", o.Rule)}
	}
	if o.ExpiresAt.IsZero() {
		return nil, &FieldError{Field: "expires_at", Msg: "required (RFC 3339, e.g. 2026-12-01T00:00:00Z)"}
	}
	switch c.Source {
	case "":
		c.Source = "operator"
	case "operator", "automatic":
	default:
		return nil, &FieldError{Field: "source", Msg: fmt.Sprintf("%q is not operator or automatic", o.Source)}
	}
	switch o.Type {
	case "ban":
		c.kind = overrideBan
	case "multiplier":
		c.kind = overrideMultiplier
		if !(o.Value > 0) || o.Value > 1000 || math.IsInf(o.Value, 0) {
			return nil, &FieldError{Field: "value", Msg: "a multiplier must be > 0 and <= 1000"}
		}
	case "custom":
		c.kind = overrideCustom
		if o.Limit < 0 || o.Burst < 0 {
			return nil, &FieldError{Field: "limit", Msg: "must be >= 0"}
		}
		if o.Limit == 0 && o.Burst == 0 && o.Value == 0 {
			return nil, &FieldError{Field: "limit", Msg: "a custom override sets limit (and optionally burst)"}
		}
		if c.limit == 0 && o.Value > 0 {
			c.limit = int64(o.Value)
		}
	default:
		return nil, &FieldError{Field: "type", Msg: fmt.Sprintf("%q is not ban, multiplier or custom", o.Type)}
	}
	return c, nil
}

type exemptions struct {
	apiKeys, users, tenants map[string]bool
	prefixes                []netip.Prefix
	some                    bool // any exemption at all: most policies have none
}

func (e *exemptions) add(x *Exemption) error {
	set := 0
	for _, v := range []string{x.APIKey, x.User, x.Tenant, x.IP} {
		if v != "" {
			set++
		}
	}
	if set != 1 {
		return &FieldError{Field: "api_key", Msg: "an exemption names exactly one of api_key, user, tenant, ip"}
	}
	e.some = true
	put := func(m *map[string]bool, v string) {
		if *m == nil {
			*m = map[string]bool{}
		}
		(*m)[v] = true
	}
	switch {
	case x.APIKey != "":
		put(&e.apiKeys, x.APIKey)
	case x.User != "":
		put(&e.users, x.User)
	case x.Tenant != "":
		put(&e.tenants, x.Tenant)
	default:
		p, err := parsePrefix(x.IP)
		if err != nil {
			return &FieldError{Field: "ip", Msg: err.Error()}
		}
		e.prefixes = append(e.prefixes, p)
	}
	return nil
}

func (e *exemptions) match(r *Request) bool {
	if !e.some {
		return false
	}
	if (r.APIKey != "" && e.apiKeys[r.APIKey]) || (r.User != "" && e.users[r.User]) || (r.Tenant != "" && e.tenants[r.Tenant]) {
		return true
	}
	if len(e.prefixes) == 0 || r.IP == "" {
		return false
	}
	addr, err := netip.ParseAddr(r.IP)
	if err != nil {
		return false
	}
	addr = addr.Unmap()
	for _, p := range e.prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// parsePrefix reads a CIDR or a single address.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("%q is not a CIDR: %v", s, err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
