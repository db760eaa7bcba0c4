package envoyconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// ParseDomain reads one domain's configuration, YAML or JSON (which is YAML), exactly as Load
// reads a file called file, and returns the domain's name and its configuration as a compact
// JSON object, the form the control store keeps (docs/architecture.md, Envoy domains). Errors
// are those of Load: *LoadError, each naming its field, joined with errors.Join.
//
// JSON says less than YAML: a YAML 1.1 boolean (yes, on) or a number written in another base
// (0x10, 1_000) has no JSON spelling that the reference service reads the same. Such a
// document is refused with a *LoadError for field "document" rather than stored with another
// meaning; every document whose scalars are plain text, decimal numbers, true, false and null
// converts, and the JSON is checked to compile to the same limits as the YAML.
func ParseDomain(file string, data []byte) (string, []byte, error) {
	c, err := Load(map[string][]byte{file: data}, false)
	if err != nil {
		return "", nil, err
	}
	name := c.names[0]
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", nil, yamlError(file, err) // parsed once already; not expected
	}
	var buf bytes.Buffer
	if err := toJSON(&buf, &doc, nodeBudget(len(data))); err != nil {
		return "", nil, &LoadError{file, 1, "document", err.Error()}
	}
	out := buf.Bytes()
	again, err := Load(map[string][]byte{file: out}, false)
	if err != nil || !sameDomain(c.domains[name], again.domains[name]) {
		return "", nil, &LoadError{file, 1, "document", "does not convert to JSON with the same meaning: " +
			"write booleans as true or false and numbers in decimal (YAML 1.1 forms such as yes, on, 0x10 or 1_000 have no JSON spelling)"}
	}
	return name, out, nil
}

// jsonNumber is a number as JSON writes it, which yaml.v3 reads back as the same plain scalar.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// toJSON writes n as JSON, members in the order written. A plain scalar that JSON can spell
// as a literal (a decimal number, true, false, null) is written as one, so that it reads back
// as the same plain scalar; every other scalar is written as a string of its text. budget
// bounds the nodes visited, aliases included, as Load's walk does.
func toJSON(buf *bytes.Buffer, n *yaml.Node, budget int) error {
	var walk func(n *yaml.Node, depth int) error
	walk = func(n *yaml.Node, depth int) error {
		for n != nil && n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		if budget--; budget < 0 {
			return fmt.Errorf("aliases expand to more YAML nodes than the document holds")
		}
		if depth > 2*maxDepth+8 {
			return fmt.Errorf("nests deeper than %d levels", 2*maxDepth+8)
		}
		switch {
		case n == nil:
			buf.WriteString("null")
		case n.Kind == yaml.DocumentNode:
			if len(n.Content) != 1 {
				return errors.New("want one YAML document")
			}
			return walk(n.Content[0], depth)
		case n.Kind == yaml.MappingNode:
			buf.WriteByte('{')
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				for k.Kind == yaml.AliasNode {
					k = k.Alias
				}
				if k.Kind != yaml.ScalarNode {
					return fmt.Errorf("line %d: a mapping key must be text", k.Line)
				}
				if i > 0 {
					buf.WriteByte(',')
				}
				writeString(buf, k.Value)
				buf.WriteByte(':')
				if err := walk(n.Content[i+1], depth+1); err != nil {
					return err
				}
			}
			buf.WriteByte('}')
		case n.Kind == yaml.SequenceNode:
			buf.WriteByte('[')
			for i, e := range n.Content {
				if i > 0 {
					buf.WriteByte(',')
				}
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
			buf.WriteByte(']')
		case n.Kind == yaml.ScalarNode:
			switch {
			case isNull(n):
				buf.WriteString("null")
			case plain(n) && (n.Value == "true" || n.Value == "false" || jsonNumber.MatchString(n.Value)):
				buf.WriteString(n.Value)
			default:
				writeString(buf, n.Value)
			}
		default:
			return fmt.Errorf("line %d: unexpected YAML node", n.Line)
		}
		return nil
	}
	return walk(n, 0)
}

func writeString(buf *bytes.Buffer, s string) {
	b, err := json.Marshal(s)
	if err != nil { // not expected for a string
		b = []byte(strconv.Quote(s))
	}
	buf.Write(b)
}

// sameDomain reports whether two loads of one domain compile to the same limits, tree and
// on_store_error, wherever they were read from.
func sameDomain(a, b *domain) bool {
	if a == nil || b == nil || a.mode != b.mode || len(a.limits) != len(b.limits) {
		return false
	}
	for i := range a.limits {
		x, y := *a.limits[i], *b.limits[i]
		x.File, x.Line, y.File, y.Line = "", 0, "", 0
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return sameLevel(&a.root, &b.root)
}

func sameLevel(a, b *level) bool {
	if len(a.list) != len(b.list) {
		return false
	}
	for i, x := range a.list {
		y := b.list[i]
		if x.key != y.key || x.value != y.value || x.share != y.share || x.mode != y.mode || (x.limit == nil) != (y.limit == nil) ||
			(x.children == nil) != (y.children == nil) || x.children != nil && !sameLevel(x.children, y.children) {
			return false
		}
	}
	return true
}

// WithDomains returns a Config that holds the domains of c (nil for none) and those of each
// of more that no Config before it defines: the first to define a domain keeps it. Neither c
// nor more changes; their domains are shared, being immutable.
func (c *Config) WithDomains(more ...*Config) *Config {
	out := &Config{domains: make(map[string]*domain)}
	for _, x := range append([]*Config{c}, more...) {
		if x == nil {
			continue
		}
		for _, name := range x.names {
			if out.domains[name] == nil {
				out.domains[name] = x.domains[name]
				out.names = append(out.names, name)
			}
		}
	}
	slices.Sort(out.names)
	out.indexNames()
	return out
}
