package policy

import (
	"net/netip"
	"slices"
)

// ipOverrides are the overrides of one ip target (an address or CIDR).
type ipOverrides struct {
	prefix netip.Prefix
	list   []*compiledOverride
}

// addIP files an override of shapeIP under its prefix, keeping s.ips longest prefix first
// so that an address's most specific target is found first.
func (s *Snapshot) addIP(c *compiledOverride) {
	for i := range s.ips {
		if s.ips[i].prefix == c.ip {
			s.ips[i].list = append(s.ips[i].list, c)
			return
		}
	}
	s.ips = append(s.ips, ipOverrides{prefix: c.ip, list: []*compiledOverride{c}})
	slices.SortStableFunc(s.ips, func(a, b ipOverrides) int { return b.prefix.Bits() - a.prefix.Bits() })
}

// ipIndex returns the index in s.ips of prefix p, or -1.
func (s *Snapshot) ipIndex(p netip.Prefix) int {
	return slices.IndexFunc(s.ips, func(x ipOverrides) bool { return x.prefix == p })
}

// storeIP sets the overrides of prefix p to list, dropping p when list is empty, keeping
// s.ips longest prefix first. Snapshot.Patch calls it on its own copy of s.ips.
func (s *Snapshot) storeIP(p netip.Prefix, list []*compiledOverride) {
	i := s.ipIndex(p)
	switch {
	case i >= 0 && len(list) == 0:
		s.ips = slices.Delete(s.ips, i, i+1)
	case i >= 0:
		s.ips[i].list = list
	case len(list) > 0:
		s.ips = append(s.ips, ipOverrides{prefix: p, list: list})
		slices.SortStableFunc(s.ips, func(a, b ipOverrides) int { return b.prefix.Bits() - a.prefix.Bits() })
	}
}

// matchIP appends to dst the override lists whose ip target holds ip, longest prefix first.
// A request without an address, or with one that does not parse, matches none. It does not
// allocate but for growing dst.
func (s *Snapshot) matchIP(ip string, dst [][]*compiledOverride) [][]*compiledOverride {
	if len(s.ips) == 0 || ip == "" {
		return dst
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return dst
	}
	addr = addr.Unmap()
	for i := range s.ips {
		if s.ips[i].prefix.Contains(addr) {
			dst = append(dst, s.ips[i].list)
		}
	}
	return dst
}
