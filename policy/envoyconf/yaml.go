package envoyconf

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

func yamlError(name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 1
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	return &LoadError{name, line, "yaml", msg}
}

func (p *parser) errorf(line int, field, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		return
	}
	p.errs = append(p.errs, &LoadError{p.file, line, field, fmt.Sprintf(format, args...)})
}

// resolve follows aliases and charges the walk's budget.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	p.budget--
	if p.budget < 0 {
		panic(errBudget)
	}
	return n
}

// fields checks that m is a mapping of known, unique fields and calls f for each. Field names
// are matched exactly, as the reference service does.
func (p *parser) fields(m *yaml.Node, path string, allowed []string, f func(field string, k, v *yaml.Node)) {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := p.resolve(m.Content[i]), m.Content[i+1]
		name := k.Value
		full := join(path, name)
		switch {
		case k.Kind != yaml.ScalarNode:
			p.errorf(k.Line, join(path, "?"), "a field name must be a string, got %s", kindName(k))
		case name == "<<":
			p.errorf(k.Line, full, "YAML merge keys are not supported; repeat the fields")
		case !slices.Contains(allowed, name):
			p.errorf(k.Line, full, "unknown field%s (want one of %s)", suggest(name, allowed), strings.Join(allowed, ", "))
		case seen[name] != 0:
			p.errorf(k.Line, full, "duplicate field (first at line %d)", seen[name])
		default:
			seen[name] = k.Line
			f(name, k, v)
		}
	}
}

// suggest names the allowed field a misspelling most likely meant.
func suggest(name string, allowed []string) string {
	best, bestD := "", 3
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(name), a); d < bestD {
			best, bestD = a, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// str reads a string field. Any scalar is taken as the text written, as the reference service
// does (value: 10 is "10"); null is "".
func (p *parser) str(v *yaml.Node, path string) (string, bool) {
	v = p.resolve(v)
	if isNull(v) {
		return "", true
	}
	if v.Kind != yaml.ScalarNode {
		p.errorf(v.Line, path, "must be a string, got %s", kindName(v))
		return "", false
	}
	return v.Value, true
}

// YAML 1.1 booleans, which the reference service's YAML library (yaml.v2) accepts; yaml.v3
// alone would read yes and on as strings.
var (
	yamlTrue  = []string{"true", "True", "TRUE", "yes", "Yes", "YES", "y", "Y", "on", "On", "ON"}
	yamlFalse = []string{"false", "False", "FALSE", "no", "No", "NO", "n", "N", "off", "Off", "OFF"}
)

func (p *parser) boolean(v *yaml.Node, path string) bool {
	v = p.resolve(v)
	if isNull(v) {
		return false
	}
	if v.Kind == yaml.ScalarNode && plain(v) {
		if slices.Contains(yamlTrue, v.Value) {
			return true
		}
		if slices.Contains(yamlFalse, v.Value) {
			return false
		}
	}
	p.errorf(v.Line, path, "must be true or false, got %s", describeScalar(v))
	return false
}

// uint reads a non-negative integer of at most bits bits. Like yaml.v2 it takes 0x, 0o and 0b
// prefixes, a leading 0 as octal and '_' separators; quoted numbers and floats are refused.
func (p *parser) uint(v *yaml.Node, path string, bits int) (uint64, bool) {
	v = p.resolve(v)
	if isNull(v) {
		return 0, true
	}
	if v.Kind == yaml.ScalarNode && plain(v) {
		s := strings.TrimPrefix(strings.ReplaceAll(v.Value, "_", ""), "+")
		if strings.HasPrefix(s, "-") {
			if _, err := strconv.ParseInt(s, 0, 64); err == nil {
				p.errorf(v.Line, path, "must not be negative, got %s", v.Value)
				return 0, false
			}
		}
		n, err := strconv.ParseUint(s, 0, bits)
		if err == nil {
			return n, true
		}
		if errors.Is(err, strconv.ErrRange) {
			p.errorf(v.Line, path, "must be at most %d, got %s", uint64(1)<<bits-1, v.Value)
			return 0, false
		}
	}
	p.errorf(v.Line, path, "must be a whole number, got %s", describeScalar(v))
	return 0, false
}

// metadata converts a free-form mapping to plain Go values (map[string]any, []any, string,
// int64, uint64, float64, bool, nil), as the reference service passes it on without validating it.
func (p *parser) metadata(v *yaml.Node, path string) map[string]any {
	v = p.resolve(v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v.Line, path, "must be a mapping, got %s", kindName(v))
		return nil
	}
	m, _ := p.anyValue(v, path).(map[string]any)
	return m
}

func (p *parser) anyValue(v *yaml.Node, path string) any {
	v = p.resolve(v)
	if v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode {
		if p.depth >= maxDepth {
			p.errorf(v.Line, path, "metadata nests deeper than %d levels (a recursive alias?)", maxDepth)
			return nil
		}
		p.depth++
		defer func() { p.depth-- }()
	}
	switch v.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			k := p.resolve(v.Content[i])
			if k.Kind != yaml.ScalarNode {
				p.errorf(k.Line, path, "a metadata key must be a string, got %s", kindName(k))
				continue
			}
			if _, dup := m[k.Value]; dup {
				p.errorf(k.Line, join(path, k.Value), "duplicate field")
				continue
			}
			m[k.Value] = p.anyValue(v.Content[i+1], join(path, k.Value))
		}
		return m
	case yaml.SequenceNode:
		s := make([]any, len(v.Content))
		for i, e := range v.Content {
			s[i] = p.anyValue(e, fmt.Sprintf("%s[%d]", path, i))
		}
		return s
	case yaml.ScalarNode:
		return scalarValue(v)
	}
	return nil
}

// scalarValue reads a metadata scalar by its resolved tag, without yaml.v3's reflection-based
// decoder, which is slow enough per call to matter for large metadata.
func scalarValue(v *yaml.Node) any {
	switch v.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		if b, err := strconv.ParseBool(strings.ToLower(v.Value)); err == nil {
			return b
		}
	case "!!int":
		s := strings.ReplaceAll(v.Value, "_", "")
		if n, err := strconv.ParseInt(s, 0, 64); err == nil {
			return n
		}
		if n, err := strconv.ParseUint(s, 0, 64); err == nil {
			return n
		}
	case "!!float":
		switch strings.ToLower(strings.TrimLeft(v.Value, "+")) {
		case ".inf":
			return math.Inf(1)
		case "-.inf":
			return math.Inf(-1)
		case ".nan":
			return math.NaN()
		}
		if f, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64); err == nil {
			return f
		}
	}
	return v.Value // strings, and timestamps and binary as written
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// plain reports an unquoted, untagged-as-string scalar: the only kind yaml.v2 would read as a
// bool or a number.
func plain(n *yaml.Node) bool {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return false
	}
	return n.Style&yaml.TaggedStyle == 0 || n.ShortTag() != "!!str"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

func describeScalar(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode && !plain(n) {
		return fmt.Sprintf("the string %q", n.Value)
	}
	return kindName(n)
}
