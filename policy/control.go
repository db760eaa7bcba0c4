package policy

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Version is the version of a policy compiled from files of version filesVersion and the
// control store at controlVersion: "<filesVersion>.<controlVersion>", such as "3f9a1c02b7e4.42".
// Nodes given the same files and the same control store report the same version; the part
// after the last dot is the control version, which only grows.
func Version(filesVersion string, controlVersion int64) string {
	return filesVersion + "." + strconv.FormatInt(controlVersion, 10)
}

// SkippedError is an entry of the control store that CompileWith left out, and why. The admin
// API validates what it stores as CompileWith does, so this happens only to entries that a
// later change made invalid (an override naming a rule since deleted) or that another version
// of Sluice accepted.
type SkippedError struct {
	// Kind is "rule", "override", "exemption", "identity" or "domain".
	Kind string
	// ID is the rule's or domain's name, the override's or exemption's id, or "KIND/VALUE".
	ID  string
	Err error
}

// Error says what was left out and why.
func (e *SkippedError) Error() string {
	return fmt.Sprintf("control store %s %s left out: %v", e.Kind, e.ID, e.Err)
}

// Unwrap returns the reason.
func (e *SkippedError) Unwrap() error { return e.Err }

// CompileWith compiles the policy files f together with the run-time state st (nil for
// none: the files alone) into one Snapshot, as of now, whose Version is
// Version(f.Version, st.Version).
//
// File rules come first, in file order, then the API rules by name; an API rule whose name a
// file rule has is left out (the file's applies). Overrides of the files come before those of
// the API at the same target. Exemptions that have expired by now are left out, and
// NextExpiry tells when the next one does: compile again then. Overrides keep their expiry,
// which Resolve checks on each request.
//
// Entries of st that do not compile are left out and returned as *SkippedError, so that one
// bad entry never stops a node from following the rest of the control store.
//
// Envoy domains of st join those of the files; a domain a file defines is left out (the
// file's applies), as is one whose configuration does not load or names another domain.
//
// Rules with adaptive: trust get their limits scaled for every identity of st with a trust
// score, lowered by the violation minutes that WithViolationMinutes reports.
func CompileWith(f *Files, st *State, now time.Time, opts ...CompileOption) (*Snapshot, []error) {
	var o compileOptions
	for _, opt := range opts {
		opt(&o)
	}
	var skipped []error
	skip := func(kind, id string, err error) {
		skipped = append(skipped, &SkippedError{Kind: kind, ID: id, Err: err})
	}
	if st == nil {
		st = &State{}
	}
	b := newBuilder()
	// The files' and the control store's Envoy domains come first: overrides may name
	// their limits.
	b.s.envoy = f.envoy
	if len(st.Domains) > 0 {
		api := make([]*envoyconf.Config, 0, len(st.Domains))
		for _, d := range st.Domains {
			if f.envoy != nil && f.envoy.HasDomain(d.Name) {
				skip("domain", strconv.Quote(d.Name), errors.New("a policy file defines this domain, which applies"))
				continue
			}
			if cfg, err := o.domains.load(d); err != nil {
				skip("domain", strconv.Quote(d.Name), err)
			} else {
				api = append(api, cfg)
			}
		}
		b.s.envoy = f.envoy.WithDomains(api...)
	}
	o.domains.keep(st.Domains)
	for _, cfg := range f.native {
		for i := range cfg.Rules {
			b.rule(&cfg.Rules[i]) // validated by ParseFiles
		}
	}
	for _, r := range st.Rules {
		if b.names[r.Name] {
			skip("rule", strconv.Quote(r.Name), errors.New("a policy file has a rule of this name, which applies"))
			continue
		}
		rule, err := ParseRule(r.Name, r.Body)
		if err == nil {
			err = errors.Join(b.rule(&rule)...)
		}
		if err != nil {
			skip("rule", strconv.Quote(r.Name), err)
		}
	}
	b.indexRules()
	var errs errorList
	for _, cfg := range f.native {
		b.fileTargets(cfg, &errs) // validated by ParseFiles
	}
	for i := range st.Overrides {
		o := &st.Overrides[i]
		po := o.Override
		if errs := b.overrideID(&po, controlSources, o.ID); len(errs) > 0 {
			skip("override", strconv.FormatInt(o.ID, 10), errors.Join(errs...))
		}
	}
	for i := range st.Exemptions {
		e := &st.Exemptions[i]
		if e.ExpiresAt != nil {
			if !now.Before(*e.ExpiresAt) {
				continue
			}
			if b.s.nextExpiry.IsZero() || e.ExpiresAt.Before(b.s.nextExpiry) {
				b.s.nextExpiry = *e.ExpiresAt
			}
		}
		if err := b.s.exemptions.add(&e.Exemption); err != nil {
			skip("exemption", strconv.FormatInt(e.ID, 10), err)
		}
	}
	for i := range st.Identities {
		id := &st.Identities[i]
		if err := b.s.ids.add(id); err != nil {
			skip("identity", string(id.Kind)+"/"+id.Value, err)
		}
	}
	b.trustScores(st.Identities, o.violationMinutes)
	b.adapt()
	b.finish()
	s := b.s
	s.filesVersion, s.controlVersion = f.Version, st.Version
	s.Version = Version(f.Version, st.Version)
	return s, skipped
}

// loadDomain loads an Envoy domain of the control store, which must name itself.
func loadDomain(d APIDomain) (*envoyconf.Config, error) {
	cfg, err := envoyconf.Load(map[string][]byte{"domain " + d.Name: d.Body}, false)
	if err != nil {
		return nil, err
	}
	if !cfg.HasDomain(d.Name) {
		return nil, fmt.Errorf("its configuration is for domain %q", cfg.Domains()[0])
	}
	return cfg, nil
}

// DomainCache keeps the Envoy domains CompileWith loaded from the control store, by name and
// body, so that a compile after a change parses only the domains that changed: a fleet with a
// hundred domains would otherwise parse them all again for every ban (BenchmarkCompileWithDomains).
// The zero value is ready; it is safe for concurrent use, and holds only the domains of the
// last State compiled with it.
type DomainCache struct {
	mu sync.Mutex
	m  map[string]cachedDomain
}

type cachedDomain struct {
	body string
	cfg  *envoyconf.Config
	err  error
}

// WithDomainCache makes CompileWith load the control store's Envoy domains through c.
func WithDomainCache(c *DomainCache) CompileOption {
	return func(o *compileOptions) { o.domains = c }
}

// load returns d loaded, from the cache when its body is the one loaded before; a nil cache
// loads it.
func (c *DomainCache) load(d APIDomain) (*envoyconf.Config, error) {
	if c == nil {
		return loadDomain(d)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[d.Name]; ok && e.body == string(d.Body) {
		return e.cfg, e.err
	}
	cfg, err := loadDomain(d)
	if c.m == nil {
		c.m = map[string]cachedDomain{}
	}
	c.m[d.Name] = cachedDomain{body: string(d.Body), cfg: cfg, err: err}
	return cfg, err
}

// keep forgets the domains that are not in domains.
func (c *DomainCache) keep(domains []APIDomain) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make(map[string]bool, len(domains))
	for _, d := range domains {
		names[d.Name] = true
	}
	for n := range c.m {
		if !names[n] {
			delete(c.m, n)
		}
	}
}

// FilesVersion returns the version of the policy files the snapshot was compiled from.
func (s *Snapshot) FilesVersion() string { return s.filesVersion }

// ControlVersion returns the control version the snapshot was compiled from; 0 for a snapshot
// of files alone.
func (s *Snapshot) ControlVersion() int64 { return s.controlVersion }

// NextExpiry returns when the earliest exemption of the snapshot expires, or the zero time:
// the snapshot must be compiled again then, which leaves it out.
func (s *Snapshot) NextExpiry() time.Time { return s.nextExpiry }

// CheckOverride reports whether an override made at run time compiles in s: the checks
// CompileWith makes, for the admin API to refuse what would be left out. Its Source must be
// SourceAPI or SourceAutomatic.
func (s *Snapshot) CheckOverride(o *Override) error {
	po := *o
	_, errs := s.compileOverride(&po, controlSources)
	return errors.Join(errs...)
}

// CheckExemption reports whether an exemption made at run time compiles.
func CheckExemption(e *Exemption) error {
	var x exemptions
	return x.add(e)
}

// ruleDecodeOptions read a rule's JSON as strictly as ParseConfig reads YAML: an unknown
// field, a name given twice or in another letter case is an error, not a guess.
var ruleDecodeOptions = jsonv2.JoinOptions(
	jsontext.AllowDuplicateNames(false),
	jsonv2.MatchCaseInsensitiveNames(false),
	jsonv2.RejectUnknownMembers(true),
)

// ParseRule reads an API rule: body is the rule as JSON with the fields of the native YAML
// (name, match, key, algorithm, limit, period, burst, soft, hard, tiers, shadow,
// on_store_error, escalation, adaptive, regions, calendar, on_deny). The name is name; a "name"
// in body must be the same.
// It validates the rule as Compile validates a file's, and returns every mistake as a
// *FieldError naming the field (joined with errors.Join).
func ParseRule(name string, body []byte) (Rule, error) {
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return Rule{}, &FieldError{Field: "rule", Msg: "must be a JSON object"}
	}
	var r Rule
	if err := jsonv2.Unmarshal(body, &r, ruleDecodeOptions); err != nil {
		return Rule{}, ruleJSONError(err)
	}
	switch {
	case r.Name == "":
		r.Name = name
	case r.Name != name:
		return Rule{}, &FieldError{Field: "name", Msg: fmt.Sprintf("%q differs from the rule's name %q", r.Name, name)}
	}
	if _, errs := compileRule(&r, 0); len(errs) > 0 {
		var top map[string]jsontext.Value
		if jsonv2.Unmarshal(body, &top) == nil {
			for _, err := range errs {
				if fe, ok := err.(*FieldError); ok && top[fe.Field] != nil {
					fe.given()
				}
			}
		}
		return Rule{}, errors.Join(errs...)
	}
	return r, nil
}

// ruleJSONError names the field of a JSON decoding error.
func ruleJSONError(err error) error {
	var fe *FieldError
	var semErr *jsonv2.SemanticError
	var synErr *jsontext.SyntacticError
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.As(err, &synErr) && errors.Is(err, jsontext.ErrDuplicateName):
		return &FieldError{Field: pointerField(synErr.JSONPointer), Msg: "given twice"}
	case errors.As(err, &semErr) && errors.Is(err, jsonv2.ErrUnknownName):
		return &FieldError{Field: pointerField(semErr.JSONPointer), Msg: "unknown field"}
	case errors.As(err, &semErr):
		field := pointerField(semErr.JSONPointer)
		if semErr.GoType == reflect.TypeFor[Duration]() && semErr.JSONKind == '"' && semErr.Err != nil {
			return &FieldError{Field: field, Msg: semErr.Err.Error()} // Duration's own message
		}
		want := "valid"
		if semErr.GoType == reflect.TypeFor[Duration]() {
			want = `a duration such as "1m"`
		} else if semErr.GoType != nil {
			switch semErr.GoType.Kind() {
			case reflect.Int64, reflect.Int:
				want = "a whole number"
			case reflect.String:
				want = "a string"
			case reflect.Bool:
				want = "true or false"
			case reflect.Slice:
				want = "a list"
			case reflect.Map, reflect.Struct:
				want = "an object"
			}
		}
		return &FieldError{Field: field, Msg: "must be " + want}
	case errors.As(err, &synErr):
		return &FieldError{Field: "rule", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", synErr.ByteOffset, synErr.Err)}
	}
	return &FieldError{Field: "rule", Msg: "invalid JSON: " + err.Error()}
}

// pointerField spells a JSON pointer as the field paths of policy errors: /tiers/free/limit
// is tiers.free.limit, /key/0 is key[0].
func pointerField(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			fmt.Fprintf(&b, "[%s]", tok)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	if b.Len() == 0 {
		return "rule"
	}
	return b.String()
}

// identities are the control store's identity assignments, as the hot path reads them: only
// the assignments that change a request, so a snapshot without any skips them with one test.
type identities struct {
	some        bool
	apiKeys     map[string]keyAssignment // by API key
	userTiers   map[string]string        // user -> tier
	tenantTiers map[string]string        // tenant -> tier
	// trust holds the assigned trust scores (docs/architecture.md, Escalation and adaptive limits), by kind and value.
	trust map[trustKey]float64
}

// keyAssignment is what an API key is assigned; empty fields assign nothing.
type keyAssignment struct{ tier, tenant, user string }

type trustKey struct {
	kind  IdentityKind
	value string
}

func (ids *identities) add(id *Identity) error {
	if err := id.validate(); err != nil {
		return err
	}
	if id.Trust != nil {
		if ids.trust == nil {
			ids.trust = map[trustKey]float64{}
		}
		ids.trust[trustKey{id.Kind, id.Value}] = *id.Trust
	}
	switch {
	case id.Kind == IdentityAPIKey && (id.Tier != "" || id.Tenant != "" || id.User != ""):
		if ids.apiKeys == nil {
			ids.apiKeys = map[string]keyAssignment{}
		}
		ids.apiKeys[id.Value] = keyAssignment{tier: id.Tier, tenant: id.Tenant, user: id.User}
	case id.Kind == IdentityUser && id.Tier != "":
		if ids.userTiers == nil {
			ids.userTiers = map[string]string{}
		}
		ids.userTiers[id.Value] = id.Tier
	case id.Kind == IdentityTenant && id.Tier != "":
		if ids.tenantTiers == nil {
			ids.tenantTiers = map[string]string{}
		}
		ids.tenantTiers[id.Value] = id.Tier
	default:
		return nil
	}
	ids.some = true
	return nil
}

// Assign returns the request as the policy decides it: r with the tenant, user and tier that
// identity assignments give it, or r itself when none applies. Assigned values win over the
// request's own, so a client cannot claim a better tier. An API key's tenant and user come
// first, and the tier is the API key's, else the user's, else the tenant's (the assigned
// ones), else the request's own.
//
// A changed request is written to *scratch, so Assign allocates nothing; it costs one test
// when the snapshot has no assignments, and otherwise at most one map lookup per attribute.
func (s *Snapshot) Assign(r, scratch *Request) *Request {
	if !s.ids.some {
		return r
	}
	return s.ids.assign(r, scratch)
}

func (ids *identities) assign(r, scratch *Request) *Request {
	tenant, user, tier := r.Tenant, r.User, ""
	if r.APIKey != "" && len(ids.apiKeys) > 0 {
		if a, ok := ids.apiKeys[r.APIKey]; ok {
			if a.tenant != "" {
				tenant = a.tenant
			}
			if a.user != "" {
				user = a.user
			}
			tier = a.tier
		}
	}
	if tier == "" && user != "" && len(ids.userTiers) > 0 {
		tier = ids.userTiers[user]
	}
	if tier == "" && tenant != "" && len(ids.tenantTiers) > 0 {
		tier = ids.tenantTiers[tenant]
	}
	if tier == "" {
		tier = r.Tier
	}
	if tenant == r.Tenant && user == r.User && tier == r.Tier {
		return r
	}
	*scratch = *r
	scratch.Tenant, scratch.User, scratch.Tier = tenant, user, tier
	return scratch
}

// Trust returns the trust score assigned to an API key, a user or a tenant, if any (adaptive
// limits, docs/architecture.md, Escalation and adaptive limits).
func (s *Snapshot) Trust(kind IdentityKind, value string) (float64, bool) {
	t, ok := s.ids.trust[trustKey{kind, value}]
	return t, ok
}

// Identities returns how many identity assignments change requests.
func (s *Snapshot) Identities() int {
	return len(s.ids.apiKeys) + len(s.ids.userTiers) + len(s.ids.tenantTiers)
}
