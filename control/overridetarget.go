package control

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/internal/key"
)

// TargetTuple is the target an override names, as the store keys it (one live override per
// target): tenant, user, api_key, endpoint and rule, then ip and api_key_hash only when set,
// so that the keys of overrides written before those two targets existed do not change.
func (o Override) TargetTuple() []string {
	t := []string{o.Tenant, o.User, o.APIKey, o.Endpoint, o.Rule}
	if o.IP != "" || o.APIKeyHash != "" {
		t = append(t, o.IP, o.APIKeyHash)
	}
	return t
}

// validateIdentityTarget checks the targets the abuse detector names callers by when it has
// no tenant or user: an API key by its hash (with tenant, user and endpoint as api_key may
// be, never with api_key itself) and an IP address or CIDR (alone, in canonical form so that
// one network is one target).
func (o Override) validateIdentityTarget() error {
	if o.APIKeyHash != "" {
		switch {
		case !key.IsHashedAPIKey(o.APIKeyHash):
			return &InvalidError{Field: "api_key_hash", Msg: "must be '#' and 32 lowercase hex digits, as violations and usage show an API key"}
		case o.APIKey != "":
			return &InvalidError{Field: "api_key_hash", Msg: "names the same target as api_key: give one of them"}
		}
	}
	if o.IP == "" {
		return nil
	}
	if err := CheckText("ip", o.IP, 0, MaxValueLen); err != nil {
		return err
	}
	canon, err := canonicalIP(o.IP)
	switch {
	case err != nil:
		return &InvalidError{Field: "ip", Msg: err.Error()}
	case canon != o.IP:
		return &InvalidError{Field: "ip", Msg: fmt.Sprintf("%q is not in canonical form: write %q", o.IP, canon)}
	case o.Tenant != "" || o.User != "" || o.APIKey != "" || o.APIKeyHash != "" || o.Endpoint != "":
		return &InvalidError{Field: "ip", Msg: "an ip override names no other target (tenant, user, api_key, api_key_hash, endpoint)"}
	}
	return nil
}

// canonicalIP returns an address or CIDR in the form overrides store it: an address
// unmapped from IPv4-in-IPv6, a CIDR with its host bits cleared.
func canonicalIP(s string) (string, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return "", fmt.Errorf("%q is not a CIDR: %v", s, err)
		}
		return p.Masked().String(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("%q is not an IP address or CIDR", s)
	}
	return a.Unmap().String(), nil
}

// CanonicalIP returns an ip target in canonical form (see Override.IP), or s unchanged when
// it does not parse, for Validate to name: callers normalize what a person typed with it.
func CanonicalIP(s string) string {
	if c, err := canonicalIP(s); err == nil {
		return c
	}
	return s
}
