package policy

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the native policy file (DESIGN.md, Native configuration).
type Config struct {
	Rules      []Rule      `yaml:"rules" json:"rules"`
	Overrides  []Override  `yaml:"overrides" json:"overrides,omitempty"`
	Exemptions []Exemption `yaml:"exemptions" json:"exemptions,omitempty"`

	// lines remember where each entry was written, for errors found after decoding.
	ruleLines, overrideLines, exemptionLines []int
	file                                     string
}

// Rule is one rate-limiting rule.
type Rule struct {
	Name         string          `yaml:"name" json:"name"`
	Match        Match           `yaml:"match" json:"match,omitempty"`
	Key          []string        `yaml:"key" json:"key"`
	Algorithm    string          `yaml:"algorithm" json:"algorithm"`
	Limit        int64           `yaml:"limit" json:"limit"`
	Period       Duration        `yaml:"period" json:"period"`
	Burst        int64           `yaml:"burst" json:"burst,omitempty"`
	Soft         int64           `yaml:"soft" json:"soft,omitempty"`
	Hard         int64           `yaml:"hard" json:"hard,omitempty"`
	Tiers        map[string]Tier `yaml:"tiers" json:"tiers,omitempty"`
	Shadow       bool            `yaml:"shadow" json:"shadow,omitempty"`
	OnStoreError string          `yaml:"on_store_error" json:"on_store_error,omitempty"`
}

// Match filters the requests a rule applies to. Every filter given must match; a value may hold
// '*' wildcards; ip takes an address or a CIDR; method compares without letter case.
type Match struct {
	Tenant      string            `yaml:"tenant" json:"tenant,omitempty"`
	User        string            `yaml:"user" json:"user,omitempty"`
	APIKey      string            `yaml:"api_key" json:"api_key,omitempty"`
	IP          string            `yaml:"ip" json:"ip,omitempty"`
	Endpoint    string            `yaml:"endpoint" json:"endpoint,omitempty"`
	Method      string            `yaml:"method" json:"method,omitempty"`
	Tier        string            `yaml:"tier" json:"tier,omitempty"`
	Descriptors map[string]string `yaml:"descriptors" json:"descriptors,omitempty"`
}

// Tier overrides a rule's limit for requests of one tier; unset fields keep the rule's.
type Tier struct {
	Limit  int64    `yaml:"limit" json:"limit,omitempty"`
	Burst  int64    `yaml:"burst" json:"burst,omitempty"`
	Period Duration `yaml:"period" json:"period,omitempty"`
}

// Override changes the effective limits of a target until it expires.
type Override struct {
	Tenant    string    `yaml:"tenant" json:"tenant,omitempty"`
	User      string    `yaml:"user" json:"user,omitempty"`
	Endpoint  string    `yaml:"endpoint" json:"endpoint,omitempty"`
	Rule      string    `yaml:"rule" json:"rule,omitempty"` // empty: every rule
	Type      string    `yaml:"type" json:"type"`           // ban, multiplier, custom
	Value     float64   `yaml:"value" json:"value,omitempty"`
	Limit     int64     `yaml:"limit" json:"limit,omitempty"`
	Burst     int64     `yaml:"burst" json:"burst,omitempty"`
	ExpiresAt time.Time `yaml:"expires_at" json:"expires_at"`
	Reason    string    `yaml:"reason" json:"reason,omitempty"`
	Source    string    `yaml:"source" json:"source,omitempty"` // operator (default) or automatic
}

// Exemption names callers that are allowed and not counted: exactly one field is set.
type Exemption struct {
	APIKey string `yaml:"api_key" json:"api_key,omitempty"`
	User   string `yaml:"user" json:"user,omitempty"`
	Tenant string `yaml:"tenant" json:"tenant,omitempty"`
	IP     string `yaml:"ip" json:"ip,omitempty"` // address or CIDR
}

// Duration is a time.Duration written as "500ms", "1s", "1m", "1h" or "1d".
type Duration time.Duration

// ParseDuration reads a Duration; it adds the "d" (24 h) unit to time.ParseDuration.
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days < 0 || days > 366 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 100ms, 1s, 1m, 1h, 1d)", s)
	}
	return d, nil
}

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseDuration(n.Value)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// UnmarshalText reads a duration string, for JSON and flags.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// MarshalText writes d as time.Duration does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// ParseConfig decodes a native policy file strictly: unknown fields, wrong types and invalid
// YAML are errors of the form "file:line: field: message". It does not validate values;
// Compile does.
func ParseConfig(file string, data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &FieldError{File: file, Line: yamlErrorLine(err), Field: "yaml", Msg: yamlErrorText(err)}
	}
	cfg := &Config{file: file}
	if len(root.Content) == 0 {
		return nil, &FieldError{File: file, Field: "rules", Msg: "empty file"}
	}
	doc := root.Content[0]
	if err := checkFields(file, doc, reflect.TypeFor[Config](), ""); err != nil {
		return nil, err
	}
	if err := doc.Decode(cfg); err != nil {
		return nil, &FieldError{File: file, Line: yamlErrorLine(err), Field: "yaml", Msg: yamlErrorText(err)}
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		var lines *[]int
		switch doc.Content[i].Value {
		case "rules":
			lines = &cfg.ruleLines
		case "overrides":
			lines = &cfg.overrideLines
		case "exemptions":
			lines = &cfg.exemptionLines
		default:
			continue
		}
		for _, item := range doc.Content[i+1].Content {
			*lines = append(*lines, item.Line)
		}
	}
	return cfg, nil
}

// checkFields walks n against the yaml tags of t and reports the first key t does not have,
// with its line. yaml.v3 is strict only through Decoder.KnownFields, which gives no field path.
func checkFields(file string, n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	bad := func(msg string) error {
		return &FieldError{File: file, Line: n.Line, Field: orTop(path), Msg: msg}
	}
	switch t {
	case reflect.TypeFor[Duration]():
		if _, err := ParseDuration(n.Value); err != nil || n.Kind != yaml.ScalarNode {
			return bad(fmt.Sprintf("invalid duration %q (use e.g. 100ms, 1s, 1m, 1h, 1d)", n.Value))
		}
		return nil
	case reflect.TypeFor[time.Time]():
		var tm time.Time
		if err := n.Decode(&tm); err != nil {
			return bad(fmt.Sprintf("invalid time %q (use RFC 3339, e.g. 2026-12-01T00:00:00Z)", n.Value))
		}
		return nil
	}
	scalar := func(tags ...string) error {
		if n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || slices.Contains(tags, n.Tag)) {
			return nil
		}
		return bad(fmt.Sprintf("%q is not %s", n.Value, map[string]string{"!!int": "an integer", "!!bool": "true or false", "!!str": "a string"}[tags[0]]))
	}
	switch t.Kind() {
	case reflect.Int64, reflect.Int:
		return scalar("!!int")
	case reflect.Float64:
		return scalar("!!int", "!!float")
	case reflect.Bool:
		return scalar("!!bool")
	case reflect.String:
		return scalar("!!str", "!!int", "!!float", "!!bool")
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Tag == "!!null" {
				return nil
			}
			return &FieldError{File: file, Line: n.Line, Field: orTop(path), Msg: "must be a map"}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			f, ok := fieldByTag(t, k)
			if !ok {
				return &FieldError{File: file, Line: n.Content[i].Line, Field: join(path, k), Msg: "unknown field"}
			}
			if err := checkFields(file, n.Content[i+1], f.Type, join(path, k)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if n.Tag == "!!null" {
				return nil
			}
			return &FieldError{File: file, Line: n.Line, Field: orTop(path), Msg: "must be a list"}
		}
		for i, item := range n.Content {
			if err := checkFields(file, item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			if n.Tag == "!!null" {
				return nil
			}
			return &FieldError{File: file, Line: n.Line, Field: orTop(path), Msg: "must be a map"}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkFields(file, n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag == name && f.IsExported() {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func orTop(path string) string {
	if path == "" {
		return "document"
	}
	return path
}

// yamlErrorLine digs the line out of yaml.v3's "yaml: line N: ..." messages.
func yamlErrorLine(err error) int {
	msg := err.Error()
	if i := strings.Index(msg, "line "); i >= 0 {
		rest := msg[i+5:]
		if j := strings.IndexByte(rest, ':'); j > 0 {
			if n, err := strconv.Atoi(rest[:j]); err == nil {
				return n
			}
		}
	}
	return 0
}

func yamlErrorText(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n  ")
	if i := strings.Index(msg, "line "); i == 0 {
		if j := strings.IndexByte(msg, ':'); j > 0 {
			msg = strings.TrimSpace(msg[j+1:])
		}
	}
	return msg
}
