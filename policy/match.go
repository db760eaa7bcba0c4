package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

type attrKind uint8

const (
	attrTenant attrKind = iota
	attrUser
	attrAPIKey
	attrIP
	attrEndpoint
	attrMethod
	attrTier
	attrIdentity
	attrDescriptor
	numIndexed = attrTier + 1 // kinds with an index of their own
)

// attr is one request attribute a rule matches or keys on.
type attr struct {
	kind attrKind
	name string // the descriptor's name, for attrDescriptor
}

func parseAttr(s string) (attr, error) {
	switch s {
	case "tenant":
		return attr{kind: attrTenant}, nil
	case "user":
		return attr{kind: attrUser}, nil
	case "api_key":
		return attr{kind: attrAPIKey}, nil
	case "ip":
		return attr{kind: attrIP}, nil
	case "endpoint":
		return attr{kind: attrEndpoint}, nil
	case "method":
		return attr{kind: attrMethod}, nil
	case "tier":
		return attr{kind: attrTier}, nil
	case "identity":
		return attr{kind: attrIdentity}, nil
	}
	if name, ok := strings.CutPrefix(s, "descriptors."); ok && name != "" {
		return attr{kind: attrDescriptor, name: name}, nil
	}
	return attr{}, fmt.Errorf("unknown attribute %q (want tenant, user, api_key, ip, endpoint, method, tier, identity or descriptors.NAME)", s)
}

func (a attr) value(r *Request) string {
	switch a.kind {
	case attrTenant:
		return r.Tenant
	case attrUser:
		return r.User
	case attrAPIKey:
		return r.APIKey
	case attrIP:
		return r.IP
	case attrEndpoint:
		return r.Endpoint
	case attrMethod:
		return r.Method
	case attrTier:
		return r.Tier
	case attrIdentity:
		_, v := r.Identity()
		return v
	case attrDescriptor:
		return r.Descriptors[a.name]
	}
	return ""
}

// filter is one compiled match condition.
type filter struct {
	attr   attr
	value  string // exact value, or glob pattern when glob is set
	glob   bool
	prefix netip.Prefix // ip filters
}

// compileMatch compiles the filters of m, or returns every mistake in them.
func compileMatch(m *Match) ([]filter, []error) {
	var fs []filter
	var errs []error
	add := func(kind attrKind, field, v string) error {
		if v == "" {
			return nil
		}
		f := filter{attr: attr{kind: kind}, value: v, glob: strings.Contains(v, "*")}
		switch kind {
		case attrIP:
			p, err := parsePrefix(v)
			if err != nil {
				return &FieldError{Field: "match." + field, Msg: err.Error()}
			}
			f.prefix, f.glob = p, false
		case attrMethod:
			f.value = strings.ToUpper(v)
		}
		fs = append(fs, f)
		return nil
	}
	for _, x := range []struct {
		kind  attrKind
		field string
		v     string
	}{
		{attrEndpoint, "endpoint", m.Endpoint}, {attrAPIKey, "api_key", m.APIKey}, {attrUser, "user", m.User},
		{attrTenant, "tenant", m.Tenant}, {attrIP, "ip", m.IP}, {attrTier, "tier", m.Tier}, {attrMethod, "method", m.Method},
	} {
		if err := add(x.kind, x.field, x.v); err != nil {
			errs = append(errs, err)
		}
	}
	names := make([]string, 0, len(m.Descriptors))
	for k := range m.Descriptors {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if k == "" {
			errs = append(errs, &FieldError{Field: "match.descriptors", Msg: "empty descriptor name"})
			continue
		}
		v := m.Descriptors[k]
		fs = append(fs, filter{attr: attr{kind: attrDescriptor, name: k}, value: v, glob: strings.Contains(v, "*")})
	}
	return fs, errs
}

func (f *filter) match(r *Request) bool {
	switch f.attr.kind {
	case attrIP:
		if r.IP == "" {
			return false
		}
		a, err := netip.ParseAddr(r.IP)
		return err == nil && f.prefix.Contains(a.Unmap())
	case attrMethod:
		return strings.EqualFold(r.Method, f.value)
	case attrDescriptor:
		v, ok := r.Descriptors[f.attr.name]
		if !ok {
			return false
		}
		if f.glob {
			return Glob(f.value, v)
		}
		return v == f.value
	}
	v := f.attr.value(r)
	if f.glob {
		return Glob(f.value, v)
	}
	return v == f.value
}

// Glob reports whether s matches pattern, where '*' matches any run of bytes, '/' included.
// Hand-written because path.Match stops '*' at '/', which is not what "/api/*" means here.
func Glob(pattern, s string) bool {
	// The classic greedy matcher with one backtrack point: linear in practice, no allocation.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// ruleIndex finds the rules that may match a request without scanning them all: each rule is
// filed under one exact filter (the most selective it has), or under the literal prefix of its
// endpoint glob, or in always when it has neither.
type ruleIndex struct {
	exact  [numIndexed]map[string][]int32
	prefix *trieNode
	always []int32
	// indexed lists the kinds that have an exact map, so a lookup skips the others.
	indexed []attrKind
}

type trieNode struct {
	edges []trieEdge
	rules []int32
}

type trieEdge struct {
	b    byte
	next *trieNode
}

// indexOrder is the order in which a rule's exact filters are tried for its index entry: the
// first is the one that narrows candidates most in typical policies.
var indexOrder = [...]attrKind{attrEndpoint, attrAPIKey, attrUser, attrTenant, attrIP, attrTier, attrMethod}

func buildIndex(rules []*CompiledRule) ruleIndex {
	var ix ruleIndex
	for i, r := range rules {
		n := int32(i)
		if ix.file(r, n) {
			continue
		}
		if f := r.filterOf(attrEndpoint); f != nil && f.glob {
			lit, _, _ := strings.Cut(f.value, "*")
			node := ix.node(lit)
			node.rules = append(node.rules, n)
			continue
		}
		ix.always = append(ix.always, n)
	}
	return ix
}

func (ix *ruleIndex) file(r *CompiledRule, n int32) bool {
	for _, kind := range indexOrder {
		f := r.filterOf(kind)
		if f == nil || f.glob || (kind == attrIP && !f.prefix.IsSingleIP()) {
			continue
		}
		v := f.value
		if kind == attrIP {
			v = f.prefix.Addr().String()
		}
		if ix.exact[kind] == nil {
			ix.exact[kind] = map[string][]int32{}
			ix.indexed = append(ix.indexed, kind)
		}
		ix.exact[kind][v] = append(ix.exact[kind][v], n)
		return true
	}
	return false
}

func (ix *ruleIndex) node(lit string) *trieNode {
	if ix.prefix == nil {
		ix.prefix = &trieNode{}
	}
	n := ix.prefix
	for i := 0; i < len(lit); i++ {
		var next *trieNode
		for _, e := range n.edges {
			if e.b == lit[i] {
				next = e.next
				break
			}
		}
		if next == nil {
			next = &trieNode{}
			n.edges = append(n.edges, trieEdge{lit[i], next})
		}
		n = next
	}
	return n
}

// candidates appends the rules that may match r, in no particular order.
func (ix *ruleIndex) candidates(r *Request, out []int32) []int32 {
	out = append(out, ix.always...)
	for _, kind := range ix.indexed {
		m := ix.exact[kind]
		v := attr{kind: kind}.value(r)
		if kind == attrMethod {
			v = upperASCII(v)
		} else if kind == attrIP && v != "" {
			if a, err := netip.ParseAddr(v); err == nil {
				v = a.Unmap().String()
			}
		}
		out = append(out, m[v]...)
	}
	for n, i := ix.prefix, 0; n != nil; i++ {
		out = append(out, n.rules...)
		if i == len(r.Endpoint) {
			break
		}
		var next *trieNode
		for _, e := range n.edges {
			if e.b == r.Endpoint[i] {
				next = e.next
				break
			}
		}
		n = next
	}
	return out
}

// upperASCII upper-cases s, allocating only when s has a lower-case letter.
func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			return strings.ToUpper(s)
		}
	}
	return s
}

func (c *CompiledRule) filterOf(kind attrKind) *filter {
	for i := range c.match {
		if c.match[i].attr.kind == kind {
			return &c.match[i]
		}
	}
	return nil
}

func (c *CompiledRule) matches(r *Request) bool {
	for i := range c.match {
		if !c.match[i].match(r) {
			return false
		}
	}
	return true
}
