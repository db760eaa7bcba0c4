package policy

import (
	"fmt"
	"net/netip"
	"strings"
)

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
		return &FieldError{Msg: "an exemption names exactly one of api_key, user, tenant, ip"}
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
