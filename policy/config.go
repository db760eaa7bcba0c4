package policy

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the native policy file (README.md, Policy).
type Config struct {
	Rules      []Rule      `yaml:"rules" json:"rules"`
	Overrides  []Override  `yaml:"overrides" json:"overrides,omitempty"`
	Exemptions []Exemption `yaml:"exemptions" json:"exemptions,omitempty"`

	// lines maps the path of every field and list entry that was written ("rules[0]",
	// "rules[0].tiers.free.limit") to its line, so that an error found after decoding points at
	// the field's own line.
	lines map[string]int
	// bad holds the paths that ParseConfig already reported, so that Compile does not report
	// the same mistake again as a consequence (a limit that did not parse is also zero).
	bad  map[string]bool
	file string
}

// Rule is one rate-limiting rule. Burst, Soft and Hard are optional: nil takes the default
// (burst = limit, no soft threshold, hard 100), while a value written is checked against its
// bounds, 0 included.
type Rule struct {
	Name         string          `yaml:"name" json:"name"`
	Match        Match           `yaml:"match" json:"match,omitempty"`
	Key          []string        `yaml:"key" json:"key"`
	Algorithm    string          `yaml:"algorithm" json:"algorithm"`
	Limit        int64           `yaml:"limit" json:"limit"`
	Period       Duration        `yaml:"period" json:"period"`
	Burst        *int64          `yaml:"burst" json:"burst,omitempty"`
	Soft         *int64          `yaml:"soft" json:"soft,omitempty"`
	Hard         *int64          `yaml:"hard" json:"hard,omitempty"`
	Tiers        map[string]Tier `yaml:"tiers" json:"tiers,omitempty"`
	Shadow       bool            `yaml:"shadow" json:"shadow,omitempty"`
	OnStoreError string          `yaml:"on_store_error" json:"on_store_error,omitempty"`
	// Escalation, when set, penalizes callers that burst at the rule: see Escalation.
	Escalation *Escalation `yaml:"escalation" json:"escalation,omitempty"`
	// Adaptive "trust" scales the rule's limits by each caller's trust score (docs/architecture.md,
	// Escalation and adaptive limits); empty for none.
	Adaptive string `yaml:"adaptive" json:"adaptive,omitempty"`
	// Regions is "global" for one limit across all regions, "home:NAME" for a limit decided
	// in region NAME only, or empty for a limit per region (docs/architecture.md, Regions).
	Regions string `yaml:"regions" json:"regions,omitempty"`
	// Calendar aligns a fixed_window to the calendar of a time zone (period 1d, 1w, 1mo or 1y;
	// docs/architecture.md, Calendar windows); see Calendar.
	Calendar Calendar `yaml:"calendar" json:"calendar,omitempty"`
	// OnDeny "drain" empties what is left of the limit when it denies a request (Gubernator's
	// DRAIN_OVER_LIMIT); empty for none. Buckets, fixed_window and sliding_window_log.
	OnDeny string `yaml:"on_deny" json:"on_deny,omitempty"`
}

// Escalation penalizes a caller (an API key, or a user of a tenant) that sends more than
// Threshold requests to the rule within Window, denied ones included: the first time it is
// warned for Penalty (its decisions under the rule are soft, with X-RateLimit-Warning); again
// while warned, it is banned from the rule for Penalty. Windows are aligned to the epoch, so a
// burst that straddles two windows is seen once it exceeds Threshold within one of them.
type Escalation struct {
	Window    Duration `yaml:"window" json:"window"`
	Threshold int64    `yaml:"threshold" json:"threshold"`
	Penalty   Duration `yaml:"penalty" json:"penalty"`
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

// Tier overrides a rule's limit for requests of one tier; unset (nil) fields keep the rule's,
// and at least one must be set. A tier's limit without a burst takes the limit as its burst.
type Tier struct {
	Limit  *int64    `yaml:"limit" json:"limit,omitempty"`
	Burst  *int64    `yaml:"burst" json:"burst,omitempty"`
	Period *Duration `yaml:"period" json:"period,omitempty"`
}

// Override changes the effective limits of a target until it expires. The target is any
// non-empty combination of tenant, user, api_key and endpoint; a request matches it when it
// carries every value the target names. When several targets match, the most specific wins
// (see Snapshot.Resolve for the order).
type Override struct {
	Tenant string `yaml:"tenant" json:"tenant,omitempty"`
	User   string `yaml:"user" json:"user,omitempty"`
	APIKey string `yaml:"api_key" json:"api_key,omitempty"` // a secret: compiled hashed
	// APIKeyHash names an API key by its hash, as violations and usage show it ('#' and 32
	// hex digits): the same target as api_key, for whoever never saw the key.
	APIKeyHash string    `yaml:"api_key_hash" json:"api_key_hash,omitempty"`
	IP         string    `yaml:"ip" json:"ip,omitempty"` // an address or CIDR, alone
	Endpoint   string    `yaml:"endpoint" json:"endpoint,omitempty"`
	Rule       string    `yaml:"rule" json:"rule,omitempty"`   // empty: every rule
	Type       string    `yaml:"type" json:"type"`             // ban, multiplier, custom, warn
	Value      float64   `yaml:"value" json:"value,omitempty"` // multiplier; or a custom limit
	Limit      int64     `yaml:"limit" json:"limit,omitempty"` // custom: 1 to algorithm.MaxLimit
	Burst      int64     `yaml:"burst" json:"burst,omitempty"` // custom: 0 (= limit) to MaxLimit
	ExpiresAt  time.Time `yaml:"expires_at" json:"expires_at"`
	Reason     string    `yaml:"reason" json:"reason,omitempty"`
	Source     string    `yaml:"source" json:"source,omitempty"` // operator (default) or automatic
}

// Exemption names callers that are allowed and not counted: exactly one field is set.
type Exemption struct {
	APIKey string `yaml:"api_key" json:"api_key,omitempty"`
	User   string `yaml:"user" json:"user,omitempty"`
	Tenant string `yaml:"tenant" json:"tenant,omitempty"`
	IP     string `yaml:"ip" json:"ip,omitempty"` // address or CIDR
}

// Duration is a time.Duration written as "500ms", "1s", "1m", "1h", "1d" or "1w", or one of the
// calendar periods "1mo" and "1y" (PeriodMonth, PeriodYear).
type Duration time.Duration

// ParseDuration reads a Duration; it adds the "d" (24 h) unit to time.ParseDuration.
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days < 0 || days > 400 {
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

// UnmarshalYAML reads a duration string. A bad one is a *yaml.TypeError, which lets the
// decoder go on with the rest of the file (any other error stops it), so that one run reports
// every mistake; ParseConfig reports it with its field and line.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parsePeriod(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{err.Error()}}
	}
	*d = Duration(v)
	return nil
}

// UnmarshalText reads a duration string, for JSON and flags.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := parsePeriod(string(b))
	*d = Duration(v)
	return err
}

// MarshalText writes d in the largest whole unit that holds it (1d, 1h, 1m, 1s, 100ms), as
// people write periods, so a rule read back through the admin API looks as it was written;
// other durations as time.Duration prints them.
func (d Duration) MarshalText() ([]byte, error) {
	v := time.Duration(d)
	switch v {
	case PeriodMonth:
		return []byte("1mo"), nil
	case PeriodYear:
		return []byte("1y"), nil
	}
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if v != 0 && v%u.unit == 0 {
			return []byte(strconv.FormatInt(int64(v/u.unit), 10) + u.name), nil
		}
	}
	return []byte(v.String()), nil
}

// maxErrors bounds the report on a badly broken policy; the first mistakes are the useful ones.
const maxErrors = 50

// ParseConfig decodes a native policy file strictly: unknown fields, wrong types, numbers past
// the integer range and invalid YAML are errors of the form "file:line: field: message", all of
// them joined (errors.Join). It does not validate values; Compile does.
func ParseConfig(file string, data []byte) (*Config, error) {
	cfg, errs := parseConfig(file, data)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// parseConfig is ParseConfig that also returns what it could decode beside the errors, so that
// a check of a file reports the mistakes Compile finds in the rest of it too. cfg is nil when
// the YAML itself does not parse.
func parseConfig(file string, data []byte) (*Config, []error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, []error{&FieldError{File: file, Line: yamlErrorLine(err), Field: "yaml", Msg: yamlErrorText(err)}}
	}
	if len(root.Content) == 0 {
		return nil, []error{&FieldError{File: file, Field: "rules", Msg: "empty file"}}
	}
	doc := root.Content[0]
	fc := fieldChecker{file: file, lines: map[string]int{}, bad: map[string]bool{}, budget: nodeBudget(len(data))}
	fc.check(doc, reflect.TypeFor[Config](), "")
	if fc.budget < 0 {
		// The decoder would expand the same aliases: do not let it.
		return nil, fc.errs
	}
	cfg := &Config{file: file, lines: fc.lines, bad: fc.bad}
	if err := doc.Decode(cfg); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) || len(fc.errs) == 0 {
			// A type error is one the walk above reported with its field; anything else is not.
			fc.errs = append(fc.errs, &FieldError{File: file, Line: yamlErrorLine(err), Field: "yaml", Msg: yamlErrorText(err)})
		}
	}
	return cfg, fc.errs
}

// fieldChecker walks a document against the yaml tags of the Config types, records the line
// of every field, and reports every key the types do not have and every value of the wrong
// kind, with its line. yaml.v3 is strict only through Decoder.KnownFields, which stops at the
// first unknown field and gives no field path.
type fieldChecker struct {
	file   string
	lines  map[string]int
	bad    map[string]bool
	errs   []error
	budget int // nodes left to visit, aliases expanded
}

// nodeBudget bounds the YAML nodes visited in a file of size bytes, aliases included, so that
// a document of aliases repeated at every level is refused instead of expanded. A file without
// aliases cannot hold more nodes than it has bytes, so the bound stops only alias expansion.
func nodeBudget(size int) int { return 4*size + 4096 }

func (fc *fieldChecker) fail(line int, path, msg string) {
	fc.bad[path] = true
	if len(fc.errs) < maxErrors {
		fc.errs = append(fc.errs, &FieldError{File: fc.file, Line: line, Field: orTop(path), Msg: msg})
	}
}

func (fc *fieldChecker) check(n *yaml.Node, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if fc.budget--; fc.budget < 0 {
		if fc.budget == -1 {
			fc.errs = append(fc.errs, &FieldError{File: fc.file, Line: n.Line, Field: orTop(path), Msg: "aliases expand to too many YAML nodes"})
		}
		return
	}
	bad := func(msg string) { fc.fail(n.Line, path, msg) }
	switch t {
	case reflect.TypeFor[Duration]():
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return
		}
		if _, err := parsePeriod(n.Value); err != nil || n.Kind != yaml.ScalarNode {
			bad(fmt.Sprintf("invalid duration %q (use e.g. 100ms, 1s, 1m, 1h, 1d, 1w; 1mo and 1y with calendar)", n.Value))
		}
		return
	case reflect.TypeFor[time.Time]():
		var tm time.Time
		if err := n.Decode(&tm); err != nil {
			bad(fmt.Sprintf("invalid time %q (use RFC 3339, e.g. 2026-12-01T00:00:00Z)", n.Value))
		}
		return
	}
	scalar := func(tags ...string) bool {
		if n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || slices.Contains(tags, n.Tag)) {
			return true
		}
		bad(fmt.Sprintf("%q is not %s", n.Value, map[string]string{"!!int": "an integer", "!!bool": "true or false", "!!str": "a string"}[tags[0]]))
		return false
	}
	switch t.Kind() {
	case reflect.Int64, reflect.Int:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!float" && isInteger(n.Value) {
			// Digits too many for any integer type: yaml.v3 reads them as a float.
			bad(fmt.Sprintf("%s is past the integer range (%d to %d)", n.Value, int64(math.MinInt64), int64(math.MaxInt64)))
			return
		}
		if scalar("!!int") && n.Tag == "!!int" {
			// yaml.v3 tags any run of digits !!int, then fails the whole decode on one that
			// does not fit: say which field, before it does.
			var v int64
			if err := n.Decode(&v); err != nil {
				bad(fmt.Sprintf("%s is past the integer range (%d to %d)", n.Value, int64(math.MinInt64), int64(math.MaxInt64)))
			}
		}
	case reflect.Float64:
		scalar("!!int", "!!float")
	case reflect.Bool:
		scalar("!!bool")
	case reflect.String:
		scalar("!!str", "!!int", "!!float", "!!bool")
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Tag != "!!null" {
				bad("must be a map")
			}
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			full := join(path, k)
			fc.lines[full] = n.Content[i].Line
			f, ok := fieldByTag(t, k)
			if !ok {
				fc.fail(n.Content[i].Line, full, "unknown field")
				continue
			}
			fc.check(n.Content[i+1], f.Type, full)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if n.Tag != "!!null" {
				bad("must be a list")
			}
			return
		}
		for i, item := range n.Content {
			ipath := fmt.Sprintf("%s[%d]", path, i)
			fc.lines[ipath] = item.Line
			fc.check(item, t.Elem(), ipath)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			if n.Tag != "!!null" {
				bad("must be a map")
			}
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			full := join(path, n.Content[i].Value)
			fc.lines[full] = n.Content[i].Line
			fc.check(n.Content[i+1], t.Elem(), full)
		}
	}
}

// isInteger reports whether s is written as a whole number: an optional sign and digits.
func isInteger(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '_' {
			return false
		}
	}
	return true
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
