package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Length limits, in characters, that the schemas enforce too. They keep every indexed value
// inside PostgreSQL's B-tree entry limit (about 2700 bytes) even at 4 bytes per character.
const (
	MaxNameLen     = 128      // rule and token names
	MaxValueLen    = 512      // tenant, user, api_key, endpoint, ip, tier, identity values
	MaxReasonLen   = 1024     // reasons
	MaxActorLen    = 256      // actors, node ids and addresses
	MaxTargetLen   = 1024     // audit targets
	MaxRuleBodyLen = 64 << 10 // a rule's JSON, in bytes
	// MaxDomainBodyLen bounds an Envoy domain's JSON, in bytes: a domain holds a whole tree
	// of descriptors, as a file of the reference service does.
	MaxDomainBodyLen = 1 << 20
	// MaxNodeStatsLen bounds a heartbeat's stats, in bytes; the schema checks it too.
	MaxNodeStatsLen = 1 << 20
)

// CheckText validates a string the store keeps: between min and max characters, valid UTF-8,
// no NUL. The last two are what the databases would treat differently (PostgreSQL's text
// refuses them, SQLite keeps them); refusing them everywhere keeps the drivers' semantics
// equal and every stored string returned verbatim.
func CheckText(field, s string, min, max int) error {
	if !utf8.ValidString(s) {
		return &InvalidError{Field: field, Msg: "not valid UTF-8"}
	}
	if strings.IndexByte(s, 0) >= 0 {
		return &InvalidError{Field: field, Msg: "contains a NUL character"}
	}
	n := utf8.RuneCountInString(s)
	if n < min {
		return &InvalidError{Field: field, Msg: "required"}
	}
	if n > max {
		return &InvalidError{Field: field, Msg: fmt.Sprintf("longer than %d characters", max)}
	}
	return nil
}

// CheckName validates a rule or token name.
func CheckName(field, name string) error { return CheckText(field, name, 1, MaxNameLen) }

// Validate checks c before a change is made.
func (c Change) Validate() error {
	if err := CheckText("actor", c.Actor, 1, MaxActorLen); err != nil {
		return err
	}
	if err := CheckText("reason", c.Reason, 0, MaxReasonLen); err != nil {
		return err
	}
	if c.Action != "" && !c.Action.Valid() {
		return &InvalidError{Field: "action", Msg: fmt.Sprintf("%q is not an audit action", c.Action)}
	}
	return CheckText("if_match", c.IfMatch, 0, MaxNameLen)
}

// ValidateRule checks a rule's name and that its body is one JSON object of bounded size; the
// rule's meaning is the caller's to validate (policy compiles it).
func ValidateRule(name string, body json.RawMessage) error {
	if err := CheckName("name", name); err != nil {
		return err
	}
	if len(body) > MaxRuleBodyLen {
		return &InvalidError{Field: "rule", Msg: fmt.Sprintf("larger than %d bytes", MaxRuleBodyLen)}
	}
	if err := CheckText("rule", string(body), 2, MaxRuleBodyLen); err != nil {
		return err
	}
	if !json.Valid(body) || !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return &InvalidError{Field: "rule", Msg: "not a JSON object"}
	}
	return nil
}

// ValidateDomain checks a domain's name and that its body is one JSON object of bounded size;
// its meaning is the caller's to validate (policy/envoyconf reads it as it reads a file).
func ValidateDomain(name string, body json.RawMessage) error {
	if err := CheckText("domain", name, 1, MaxNameLen); err != nil {
		return err
	}
	if len(body) > MaxDomainBodyLen {
		return &InvalidError{Field: "body", Msg: fmt.Sprintf("larger than %d bytes", MaxDomainBodyLen)}
	}
	if err := CheckText("body", string(body), 2, MaxDomainBodyLen); err != nil {
		return err
	}
	if !json.Valid(body) || !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return &InvalidError{Field: "body", Msg: "not a JSON object"}
	}
	return nil
}

// Validate checks an override's fields, except that ExpiresAt is in the future (the store
// checks that against its clock). It does not check that Rule names an existing rule.
func (o Override) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"tenant", o.Tenant}, {"user", o.User}, {"api_key", o.APIKey}, {"endpoint", o.Endpoint},
	} {
		if err := CheckText(f.name, f.v, 0, MaxValueLen); err != nil {
			return err
		}
	}
	if err := o.validateIdentityTarget(); err != nil {
		return err
	}
	if o.Tenant == "" && o.User == "" && o.APIKey == "" && o.APIKeyHash == "" && o.Endpoint == "" && o.IP == "" {
		return &InvalidError{Field: "tenant", Msg: "an override needs a target: tenant, user, api_key, api_key_hash, endpoint or ip"}
	}
	if err := CheckText("rule", o.Rule, 0, MaxNameLen); err != nil {
		return err
	}
	if math.IsNaN(o.Value) || math.IsInf(o.Value, 0) || o.Value < 0 {
		return &InvalidError{Field: "value", Msg: "must be a finite number >= 0"}
	}
	if o.Limit < 0 {
		return &InvalidError{Field: "limit", Msg: "must be >= 0"}
	}
	if o.Burst < 0 {
		return &InvalidError{Field: "burst", Msg: "must be >= 0"}
	}
	switch o.Type {
	case OverrideBan, OverrideCustom, OverrideWarn:
	case OverrideMultiplier:
		if o.Value <= 0 {
			return &InvalidError{Field: "value", Msg: "a multiplier must be > 0"}
		}
	default:
		return &InvalidError{Field: "type", Msg: fmt.Sprintf("%q is not ban, multiplier, custom or warn", o.Type)}
	}
	if o.ExpiresAt.IsZero() {
		return &InvalidError{Field: "expires_at", Msg: "required"}
	}
	if err := CheckText("reason", o.Reason, 0, MaxReasonLen); err != nil {
		return err
	}
	if o.Source != SourceAPI && o.Source != SourceAutomatic {
		return &InvalidError{Field: "source", Msg: fmt.Sprintf("%q is not api or automatic", o.Source)}
	}
	return nil
}

// Validate checks that an exemption names exactly one caller.
func (e Exemption) Validate() error {
	set := 0
	for _, f := range []struct{ name, v string }{
		{"api_key", e.APIKey}, {"user", e.User}, {"tenant", e.Tenant}, {"ip", e.IP},
	} {
		if err := CheckText(f.name, f.v, 0, MaxValueLen); err != nil {
			return err
		}
		if f.v != "" {
			set++
		}
	}
	if set != 1 {
		return &InvalidError{Field: "api_key", Msg: "an exemption names exactly one of api_key, user, tenant, ip"}
	}
	if e.ExpiresAt != nil && e.ExpiresAt.IsZero() {
		return &InvalidError{Field: "expires_at", Msg: "must be a time when given"}
	}
	return CheckText("reason", e.Reason, 0, MaxReasonLen)
}

// Validate checks an identity assignment.
func (i Identity) Validate() error {
	switch i.Kind {
	case IdentityAPIKey, IdentityUser, IdentityTenant:
	default:
		return &InvalidError{Field: "kind", Msg: fmt.Sprintf("%q is not api_key, user or tenant", i.Kind)}
	}
	if err := CheckText("value", i.Value, 1, MaxValueLen); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"tier", i.Tier}, {"tenant", i.Tenant}, {"user", i.User}} {
		if err := CheckText(f.name, f.v, 0, MaxValueLen); err != nil {
			return err
		}
	}
	if i.Kind != IdentityAPIKey && (i.Tenant != "" || i.User != "") {
		field := "tenant"
		if i.Tenant == "" {
			field = "user"
		}
		return &InvalidError{Field: field, Msg: "only an api_key is assigned a tenant and a user"}
	}
	if i.Trust != nil && !(*i.Trust >= 0 && *i.Trust <= 1) {
		return &InvalidError{Field: "trust", Msg: "must be between 0 and 1"}
	}
	return nil
}

// Validate checks a token's name and role.
func (t Token) Validate() error {
	if err := CheckName("name", t.Name); err != nil {
		return err
	}
	if t.Role.rank() == 0 {
		return &InvalidError{Field: "role", Msg: fmt.Sprintf("%q is not read, write or admin", t.Role)}
	}
	if t.Hash == (TokenHash{}) {
		return &InvalidError{Field: "token", Msg: "hash required"}
	}
	return nil
}

// Validate checks an event for AppendAudit.
func (e AuditEvent) Validate() error {
	if err := CheckText("actor", e.Actor, 1, MaxActorLen); err != nil {
		return err
	}
	if !e.Action.Valid() {
		return &InvalidError{Field: "action", Msg: fmt.Sprintf("%q is not an audit action", e.Action)}
	}
	switch e.Kind {
	case KindRule, KindOverride, KindExemption, KindIdentity, KindToken, KindPolicyFiles, KindPenalty, KindDomain:
	default:
		return &InvalidError{Field: "kind", Msg: fmt.Sprintf("%q is not an audit kind", e.Kind)}
	}
	if err := CheckText("target", e.Target, 0, MaxTargetLen); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"before", e.Before}, {"after", e.After}} {
		if f.v == nil {
			continue
		}
		if !json.Valid(f.v) {
			return &InvalidError{Field: f.name, Msg: "not valid JSON"}
		}
		if err := CheckText(f.name, string(f.v), 0, MaxRuleBodyLen*2); err != nil {
			return err
		}
	}
	return CheckText("reason", e.Reason, 0, MaxReasonLen)
}

// Validate checks a heartbeat.
func (n Node) Validate() error {
	if err := CheckText("id", n.ID, 1, MaxActorLen); err != nil {
		return err
	}
	if err := CheckText("addr", n.Addr, 0, MaxActorLen); err != nil {
		return err
	}
	if n.PolicyVersion < 0 {
		return &InvalidError{Field: "policy_version", Msg: "must be >= 0"}
	}
	if len(n.Stats) > MaxNodeStatsLen {
		return &InvalidError{Field: "stats", Msg: fmt.Sprintf("%d bytes; at most %d", len(n.Stats), MaxNodeStatsLen)}
	}
	if len(n.Stats) > 0 && !json.Valid(n.Stats) {
		return &InvalidError{Field: "stats", Msg: "not JSON"}
	}
	return nil
}

// Validate checks one usage count; Rule may be DecisionRule.
func (u UsageCount) Validate() error {
	if u.Rule != DecisionRule {
		if err := CheckName("rule", u.Rule); err != nil {
			return err
		}
	}
	if err := CheckText("tenant", u.Tenant, 0, MaxValueLen); err != nil {
		return err
	}
	if u.Allowed < 0 || u.Denied < 0 || u.Soft < 0 {
		return &InvalidError{Field: "allowed", Msg: "counts must be >= 0"}
	}
	return nil
}

// Validate checks one violation count.
func (v ViolationCount) Validate() error {
	if err := CheckName("rule", v.Rule); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"tenant", v.Tenant}, {"user", v.User}, {"api_key", v.APIKey}, {"ip", v.IP}, {"endpoint", v.Endpoint},
	} {
		if err := CheckText(f.name, f.v, 0, MaxValueLen); err != nil {
			return err
		}
	}
	if v.Denied < 0 || v.Soft < 0 || v.Limit < 0 {
		return &InvalidError{Field: "denied", Msg: "counts must be >= 0"}
	}
	return nil
}
