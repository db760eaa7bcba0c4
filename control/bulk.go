package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Bundle is a whole control store's worth of resources to load in one change: what
// `sluice admin export` writes and `sluice admin import` reads (docs/architecture.md, Bulk
// export and import).
type Bundle struct {
	Rules      []Rule
	Overrides  []Override
	Exemptions []Exemption
	Identities []Identity
	Domains    []Domain
}

// Len is how many entries b has.
func (b *Bundle) Len() int {
	return len(b.Rules) + len(b.Overrides) + len(b.Exemptions) + len(b.Identities) + len(b.Domains)
}

// ImportResult counts what an import changed; entries equal to the stored ones change nothing.
type ImportResult struct {
	Created, Updated, Unchanged int
	// Version is the control version of the import; 0 when it changed nothing or was a dry run.
	Version int64
	// Changes lists what was created or updated, in the bundle's order.
	Changes []ImportChange
}

// ImportChange is one entry an import creates or updates.
type ImportChange struct {
	Action Action `json:"action"` // create or update
	Kind   Kind   `json:"kind"`
	// Key names the entry as the bundle keys it: a name, an override's target, "KIND/VALUE".
	Key string `json:"key"`
}

// Importer is implemented by a Store that loads a Bundle in one transaction, audited as one
// event per resource it creates or changes. control/sqlite and control/postgres implement it.
//
// An entry is keyed as the API keys it: a rule or a domain by name, an override by its
// target (tenant, user, api_key, endpoint, rule: the active override of that target is
// replaced), an exemption by the caller it names (an active one is kept), an assignment by
// kind and value. Nothing absent from the bundle is deleted. A bad entry fails the whole
// import with an *InvalidError whose Field names it ("overrides[3].expires_at"), and nothing
// is written.
type Importer interface {
	// Import loads b; with apply false it only reports what it would change, and writes
	// nothing.
	Import(ctx context.Context, ch Change, b *Bundle, apply bool) (ImportResult, error)
}

// Validate checks every entry of b as the store checks it, and that no two entries have one
// key; the error is an *InvalidError naming the first bad entry by list and index.
func (b *Bundle) Validate() error {
	at := func(list string, i int, err error) error {
		var ie *InvalidError
		if errors.As(err, &ie) {
			return &InvalidError{Field: fmt.Sprintf("%s[%d].%s", list, i, ie.Field), Msg: ie.Msg}
		}
		return &InvalidError{Field: fmt.Sprintf("%s[%d]", list, i), Msg: err.Error()}
	}
	dup := func(list string, i, first int) error {
		return &InvalidError{Field: fmt.Sprintf("%s[%d]", list, i), Msg: fmt.Sprintf("the same key as %s[%d]", list, first)}
	}
	names := map[string]int{}
	for i, r := range b.Rules {
		if err := ValidateRule(r.Name, r.Body); err != nil {
			return at("rules", i, err)
		}
		if j, ok := names[r.Name]; ok {
			return dup("rules", i, j)
		}
		names[r.Name] = i
	}
	targets := map[string]int{}
	for i, o := range b.Overrides {
		if err := o.Validate(); err != nil {
			return at("overrides", i, err)
		}
		k, _ := json.Marshal(o.TargetTuple())
		if j, ok := targets[string(k)]; ok {
			return dup("overrides", i, j)
		}
		targets[string(k)] = i
	}
	callers := map[[4]string]int{}
	for i, e := range b.Exemptions {
		if err := e.Validate(); err != nil {
			return at("exemptions", i, err)
		}
		k := [4]string{e.APIKey, e.User, e.Tenant, e.IP}
		if j, ok := callers[k]; ok {
			return dup("exemptions", i, j)
		}
		callers[k] = i
	}
	ids := map[IdentityRef]int{}
	for i, id := range b.Identities {
		if err := id.Validate(); err != nil {
			return at("identities", i, err)
		}
		k := IdentityRef{id.Kind, id.Value}
		if j, ok := ids[k]; ok {
			return dup("identities", i, j)
		}
		ids[k] = i
	}
	domains := map[string]int{}
	for i, d := range b.Domains {
		if err := ValidateDomain(d.Name, d.Body); err != nil {
			return at("domains", i, err)
		}
		if j, ok := domains[d.Name]; ok {
			return dup("domains", i, j)
		}
		domains[d.Name] = i
	}
	return nil
}
