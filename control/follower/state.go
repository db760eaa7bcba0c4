package follower

import (
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// policyState turns the control store's records into the engine's input: the policy package
// compiles its own State and never the store's model, so the conversion lives here, with the
// one reader of the store that feeds the engine.
func policyState(st *control.State) *policy.State {
	ps := &policy.State{
		Version:    st.Version,
		Rules:      make([]policy.APIRule, len(st.Rules)),
		Overrides:  make([]policy.StateOverride, len(st.Overrides)),
		Exemptions: make([]policy.StateExemption, len(st.Exemptions)),
		Identities: make([]policy.Identity, len(st.Identities)),
		Domains:    make([]policy.APIDomain, len(st.Domains)),
	}
	for i, d := range st.Domains {
		ps.Domains[i] = policy.APIDomain{Name: d.Name, Body: d.Body}
	}
	for i, r := range st.Rules {
		ps.Rules[i] = policy.APIRule{Name: r.Name, Body: r.Body}
	}
	for i := range st.Overrides {
		ps.Overrides[i] = policy.StateOverride{ID: st.Overrides[i].ID, Override: PolicyOverride(&st.Overrides[i])}
	}
	for i := range st.Exemptions {
		e := &st.Exemptions[i]
		ps.Exemptions[i] = policy.StateExemption{ID: e.ID, Exemption: PolicyExemption(e), ExpiresAt: e.ExpiresAt}
	}
	for i := range st.Identities {
		id := &st.Identities[i]
		ps.Identities[i] = policy.Identity{
			Kind: policy.IdentityKind(id.Kind), Value: id.Value,
			Tier: id.Tier, Tenant: id.Tenant, User: id.User, Trust: id.Trust,
		}
	}
	return ps
}

// PolicyOverride returns the policy form of an override of the control store, for the admin
// API to check it as a compile would (policy.Snapshot.CheckOverride).
func PolicyOverride(o *control.Override) policy.Override {
	return policy.Override{
		Tenant: o.Tenant, User: o.User, APIKey: o.APIKey, APIKeyHash: o.APIKeyHash, IP: o.IP, Endpoint: o.Endpoint, Rule: o.Rule,
		Type: string(o.Type), Value: o.Value, Limit: o.Limit, Burst: o.Burst,
		ExpiresAt: o.ExpiresAt, Reason: o.Reason, Source: string(o.Source),
	}
}

// PolicyExemption returns the policy form of an exemption of the control store.
func PolicyExemption(e *control.Exemption) policy.Exemption {
	return policy.Exemption{APIKey: e.APIKey, User: e.User, Tenant: e.Tenant, IP: e.IP}
}
