package policy

import (
	"fmt"
	"time"
)

// State is the run-time part of a policy: the rules, overrides, exemptions, identity
// assignments and Envoy domains that operators change through the admin API. CompileWith compiles it together
// with the policy files. The control plane's policy follower turns its store's records into a
// State, so that the engine never compiles the control store's model.
type State struct {
	// Version is the control store's version of this state; it only grows.
	Version    int64
	Rules      []APIRule
	Overrides  []StateOverride
	Exemptions []StateExemption
	Identities []Identity
	Domains    []APIDomain
}

// APIDomain is an Envoy-format domain created at run time: its name and its configuration in
// the reference service's format, as JSON (which envoyconf reads as it reads a file).
type APIDomain struct {
	Name string
	Body []byte
}

// APIRule is a rule created at run time: its name and its body as JSON, the form ParseRule
// reads.
type APIRule struct {
	Name string
	Body []byte
}

// StateOverride is an override created at run time, with the id the admin API gave it. Its
// Source is SourceAPI or SourceAutomatic.
type StateOverride struct {
	ID int64
	Override
}

// StateExemption is an exemption created at run time, with the id the admin API gave it and
// its expiry (nil: none).
type StateExemption struct {
	ID int64
	Exemption
	ExpiresAt *time.Time
}

// IdentityKind is the kind of caller an identity assignment names.
type IdentityKind string

// The kinds of identity an assignment names.
const (
	IdentityAPIKey IdentityKind = "api_key"
	IdentityUser   IdentityKind = "user"
	IdentityTenant IdentityKind = "tenant"
)

// Identity is an identity assignment: what the caller Kind=Value is given. An API key may be
// given a tier, a tenant and a user; a user or a tenant only a tier. Trust, in [0, 1], scales
// the limits of rules with adaptive: trust.
type Identity struct {
	Kind   IdentityKind
	Value  string
	Tier   string
	Tenant string
	User   string
	Trust  *float64
}

// validate checks what the hot path relies on; the admin API checks lengths and text before
// it stores an assignment.
func (id *Identity) validate() error {
	switch id.Kind {
	case IdentityAPIKey, IdentityUser, IdentityTenant:
	default:
		return &FieldError{Field: "kind", Msg: fmt.Sprintf("%q is not api_key, user or tenant", id.Kind)}
	}
	if id.Value == "" {
		return &FieldError{Field: "value", Msg: "required"}
	}
	if id.Kind != IdentityAPIKey && (id.Tenant != "" || id.User != "") {
		field := "tenant"
		if id.Tenant == "" {
			field = "user"
		}
		return &FieldError{Field: field, Msg: "only an api_key is assigned a tenant and a user"}
	}
	if id.Trust != nil && !(*id.Trust >= 0 && *id.Trust <= 1) {
		return &FieldError{Field: "trust", Msg: "must be between 0 and 1"}
	}
	return nil
}

// The types of Override.
const (
	OverrideBan        = "ban"        // deny until it expires
	OverrideMultiplier = "multiplier" // limit and burst times Value
	OverrideCustom     = "custom"     // Limit and Burst replace the rule's
	// OverrideWarn turns the caller's allowed requests soft (escalation's first step).
	OverrideWarn = "warn"
)
