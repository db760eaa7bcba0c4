package envoyconf

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Attributes are the request attributes a descriptor entry can set (DESIGN.md, "Envoy requests
// get the whole product"), in the order they are reported.
var Attributes = []string{"tenant", "user", "api_key", "ip", "endpoint", "method", "tier"}

// AttributeMap names, for each request attribute, the descriptor entry key it is read from
// when a deployment names its keys otherwise than the attribute (user=x-user-id). An attribute
// it leaves out is read from the entry of its own name (ip also from Envoy's remote_address).
type AttributeMap map[string]string

// ParseAttributeMap reads "user=x-user-id,tenant=org" (the --envoy-attributes flag). Empty is
// no mapping.
func ParseAttributeMap(s string) (AttributeMap, error) {
	m := AttributeMap{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		attr, entry, ok := strings.Cut(part, "=")
		attr, entry = strings.TrimSpace(attr), strings.TrimSpace(entry)
		if !ok || entry == "" {
			return nil, fmt.Errorf("%q: want attribute=entry-key, such as user=x-user-id", part)
		}
		if err := m.set(attr, entry); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m AttributeMap) set(attr, entry string) error {
	if !slices.Contains(Attributes, attr) {
		return fmt.Errorf("%q is not an attribute: want one of %s", attr, strings.Join(Attributes, ", "))
	}
	if len(entry) > maxAttributeKey {
		return fmt.Errorf("%s: entry key longer than %d bytes", attr, maxAttributeKey)
	}
	if prev, ok := m[attr]; ok && prev != entry {
		return fmt.Errorf("%s is mapped twice (%q and %q)", attr, prev, entry)
	}
	m[attr] = entry
	return nil
}

// maxAttributeKey bounds an entry key named in a mapping, as request attributes are bounded.
const maxAttributeKey = 1024

// String writes m as ParseAttributeMap reads it, attributes in their order.
func (m AttributeMap) String() string {
	var b strings.Builder
	for _, a := range Attributes {
		if k, ok := m[a]; ok {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(a + "=" + k)
		}
	}
	return b.String()
}

// Attributes returns the attribute mapping of domain's file (its top-level attributes:), nil
// when it has none.
func (c *Config) Attributes(domain string) AttributeMap {
	if d := c.domains[domain]; d != nil {
		return d.attrs
	}
	return nil
}

// attributes reads a domain file's attributes: mapping.
func (p *parser) attributes(v *yaml.Node, path string) AttributeMap {
	v = p.resolve(v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v.Line, path, "must be a mapping of attribute to entry key, such as {user: x-user-id}, got %s", kindName(v))
		return nil
	}
	m := AttributeMap{}
	p.fields(v, path, Attributes, func(field string, _, val *yaml.Node) {
		entry, ok := p.str(val, join(path, field))
		if !ok {
			return
		}
		if entry == "" {
			p.errorf(val.Line, join(path, field), "must name an entry key")
			return
		}
		if err := m.set(field, entry); err != nil {
			p.errorf(val.Line, join(path, field), "%v", err)
		}
	})
	return m
}

// mergeAttributes adds a merged file's mapping to a domain's; one attribute mapped to two keys
// is an error.
func mergeAttributes(into, from AttributeMap) (AttributeMap, error) {
	if len(from) == 0 {
		return into, nil
	}
	out := AttributeMap{}
	for a, k := range into {
		out[a] = k
	}
	for _, a := range Attributes {
		if k, ok := from[a]; ok {
			if err := out.set(a, k); err != nil {
				return into, err
			}
		}
	}
	return out, nil
}

// StatKey is the reference service's stat key of the limit at id in domain: the domain, then
// each level of the descriptor path as key or key_value, joined by dots ("domain.key_value.key2").
// Overrides name an Envoy limit by it as well as by its rate_limit name.
func StatKey(domain, id string) string {
	parts := strings.Split(id, "/")
	for i, p := range parts {
		k, v, hasValue := strings.Cut(p, "=")
		k, v = unescape(k), unescape(v)
		if hasValue {
			k += "_" + v
		}
		parts[i] = k
	}
	return domain + "." + strings.Join(parts, ".")
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// NamesLimit reports whether some limit of c has name as its rate_limit name, its stat key or
// its ID: what an override's rule may name.
func (c *Config) NamesLimit(name string) bool {
	if c == nil || name == "" {
		return false
	}
	_, ok := c.named[name]
	return ok
}
