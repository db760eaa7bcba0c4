// Package envoyconf reads the YAML configuration of Envoy's reference rate limit service
// (github.com/envoyproxy/ratelimit) and answers which limit applies to a request descriptor
// exactly as that service does, so a fleet can move to Sluice without rewriting its rules.
//
// A Config is immutable once loaded and safe for concurrent use; Match and CounterValues
// allocate nothing, as they run on every request. A reload builds a new Config and swaps it
// in: a folder that fails to load never yields a partial Config, so the running one stays.
package envoyconf

import (
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// StoreErrorMode says what a limit decides when its store cannot be reached: on_store_error,
// a Sluice extension of the reference format, written on a domain or on a descriptor and
// inherited by the descriptors nested in it. The default is FailOpen, which is what Envoy's
// reference service does (its callers fail open unless failure_mode_deny is set).
type StoreErrorMode = store.ErrorMode

// The on_store_error modes, as for native rules; FailClosed answers OVER_LIMIT.
const (
	FailOpen   = store.FailOpen
	FailClosed = store.FailClosed
	FailLocal  = store.FailLocal
)

// Entry is one key/value of a request descriptor.
type Entry struct{ Key, Value string }

// Limit is one `rate_limit` of the file, compiled. It is shared by every request that matches
// it and must not be modified.
type Limit struct {
	Domain string
	// ID is the path of descriptor keys and values from the root to the limit's node, such as
	// "message_type=marketing/to_number": key=value for a node with a value, the bare key for a
	// default, levels joined by '/', with '%', '/', '=' and control bytes percent-escaped. It is
	// unique within the domain and stable across reloads, so it can name a bucket.
	ID   string
	Name string // rate_limit.name, returned to Envoy as current_limit.name; may be empty
	// StatKey is the reference service's name of the limit in its stats, such as
	// "messaging.message_type_marketing.to_number" (see StatKey).
	StatKey         string
	Unit            string // second, minute, hour, day, week, month or year; empty when Unlimited
	RequestsPerUnit uint32
	Unlimited       bool
	Shadow          bool     // shadow_mode: counted and reported, but the answer is always OK
	Replaces        []string // names of the limits this one replaces when both match a request
	DetailedMetric  bool
	ValueToMetric   bool
	QuotaMode       bool
	Metadata        map[string]any // the node's free-form metadata, nil when absent
	// OnStoreError is the on_store_error of the limit's node or its nearest ancestor, else of
	// its domain, else FailOpen.
	OnStoreError StoreErrorMode

	// Period is the unit as a duration (month = 30 days, year = 365 days); 0 when Unlimited.
	Period time.Duration
	// Params are the compiled algorithm parameters: fixed_window unless the rate_limit names
	// another algorithm, Limit = RequestsPerUnit (0 denies every request), Period as above.
	// Unset (zero) when Unlimited.
	Params algorithm.Params
	// Escalation, Adaptive and Regions are the Sluice extensions escalation, adaptive: trust
	// and regions inside a rate_limit, with a native rule's meaning (DESIGN.md, "Envoy
	// requests get the whole product"). Escalation is nil and Regions "" when not set;
	// Regions is "global" or "home:NAME" (HomeRegion).
	Escalation *Escalation
	Adaptive   bool
	Regions    string

	File string // the file that defined the limit, as named to Load
	Line int    // the line of its rate_limit

	// label is Domain/ID, made once at load: metrics and usage name an unnamed limit by it on
	// every decision.
	label string

	// shared[i] is the wildcard pattern that stands for the request's value at level i when
	// the ancestor matched there has share_threshold: true, "" elsewhere; nil when no level
	// shares. A limit is reachable only through its ancestors, so this is known at load time.
	shared []string
	// trail is the nodes from the root to the limit's, kept only when the limit's stats are
	// named per request value (detailed_metric, or value_to_metric at some level): see
	// AppendStatKey.
	trail []*node
}

// Label names the limit where it has no name of its own, as metrics and usage records do:
// "domain/id".
func (l *Limit) Label() string {
	if l.label == "" {
		return l.Domain + "/" + l.ID // a Limit not made by Load
	}
	return l.label
}

// Match is the outcome of matching one descriptor. Limit is nil when nothing applies.
type Match struct {
	Limit *Limit
}

// Config holds the domains of a set of files.
type Config struct {
	domains map[string]*domain
	names   []string
	// named holds every limit's rate_limit name, stat key and ID: what overrides may name.
	named map[string]struct{}
}

type domain struct {
	file   string // the first file that defined it, for the duplicate-domain error
	line   int
	mode   StoreErrorMode // its on_store_error (of that first file, when merged)
	attrs  AttributeMap   // its files' attributes: mapping, nil when none
	root   level
	limits []*Limit
}

// entryKey addresses a node within a level. A default (key-only) node has value "", which no
// request value reaches through the exact lookup because Match skips it for empty values.
type entryKey struct{ key, value string }

type level struct {
	nodes map[entryKey]*node
	wild  map[string][]*node // wildcard nodes by key, in the order they were listed
	list  []*node            // every node in the order it was listed, for merging
}

type node struct {
	key, value string
	file       string
	line       int
	glob       []string // value split on '*'; nil when the value has no wildcard
	share      bool
	toMetric   bool           // value_to_metric: the request's value names this level in stats
	mode       StoreErrorMode // on_store_error in force at this node
	limit      *Limit
	children   *level // nil when the node has no nested descriptors
}

// Domains lists the domain names, sorted.
func (c *Config) Domains() []string { return slices.Clone(c.names) }

// Limits lists the limits of domain in the order they appear in its files (nil for an
// unknown domain).
func (c *Config) Limits(domain string) []*Limit {
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	return slices.Clone(d.limits)
}

// Match returns the limit that applies to one descriptor of a request in domain, following the
// reference service: each entry picks a node at its level (an exact value, else the first
// listed wildcard that matches, else the key-only default) and the walk descends into that
// node's children without ever backtracking. A limit applies only if every entry matched a
// node and the last node has a rate_limit; a limit on an intermediate node does not apply.
// An Unlimited limit is returned as such; the caller answers OK without counting.
func (c *Config) Match(domain string, entries []Entry) Match {
	d := c.domains[domain]
	if d == nil || len(entries) == 0 {
		return Match{}
	}
	lv := &d.root
	for i, e := range entries {
		n := lv.find(e)
		if n == nil {
			return Match{}
		}
		if i == len(entries)-1 {
			return Match{Limit: n.limit}
		}
		if n.children == nil {
			return Match{}
		}
		lv = n.children
	}
	return Match{}
}

// StoreErrorMode returns the on_store_error in force for a descriptor of domain that has no
// limit of its own to say it (a per-request limit override): that of the deepest node its
// entries reach, as Match walks them, else the domain's, else FailOpen.
func (c *Config) StoreErrorMode(domain string, entries []Entry) StoreErrorMode {
	d := c.domains[domain]
	if d == nil {
		return FailOpen
	}
	mode := d.mode
	for lv := &d.root; lv != nil && len(entries) > 0; entries = entries[1:] {
		n := lv.find(entries[0])
		if n == nil {
			break
		}
		mode, lv = n.mode, n.children
	}
	return mode
}

func (lv *level) find(e Entry) *node {
	// The reference looks up key_value first; an empty request value can only reach a node
	// through a wildcard (such as "*") or the default.
	if e.Value != "" {
		if n := lv.nodes[entryKey{e.Key, e.Value}]; n != nil {
			return n
		}
	}
	for _, n := range lv.wild[e.Key] {
		if globMatch(n.glob, e.Value) {
			return n
		}
	}
	return lv.nodes[entryKey{e.Key, ""}]
}

// CounterValues calls f for each entry in order with the key and the value that identifies
// the counter: the request's own value, or the wildcard pattern itself at a level whose
// matched node has share_threshold: true, so that all values the wildcard matches share one
// counter. entries must be the ones that produced m.
func (m Match) CounterValues(entries []Entry, f func(key, value string)) {
	var shared []string
	if m.Limit != nil {
		shared = m.Limit.shared
	}
	for i, e := range entries {
		v := e.Value
		if i < len(shared) && shared[i] != "" {
			v = shared[i]
		}
		f(e.Key, v)
	}
}

// Replaced reports, for the limits matched by all descriptors of one request (in order; nil
// entries allowed), which ones are replaced. As in the reference service, a named limit is
// replaced when any matched limit lists its name in replaces, whether or not that limit is
// itself replaced (so in a chain a→b→c both b and c drop, and two limits replacing each other
// both drop). Unlimited limits are never reported replaced: the reference answers them as
// unlimited before it considers replacement, though their own replaces still count.
func Replaced(limits []*Limit) []bool { return AppendReplaced(nil, limits) }

// AppendReplaced is Replaced into dst's storage, which it returns resliced to len(limits):
// a caller that keeps it reuses it.
func AppendReplaced(dst []bool, limits []*Limit) []bool {
	out := append(dst[:0], make([]bool, len(limits))...)
	var replacing map[string]bool
	for _, l := range limits {
		if l == nil {
			continue
		}
		for _, name := range l.Replaces {
			if replacing == nil {
				replacing = make(map[string]bool)
			}
			replacing[name] = true
		}
	}
	if replacing == nil {
		return out
	}
	for i, l := range limits {
		if l != nil && !l.Unlimited && l.Name != "" && replacing[l.Name] {
			out[i] = true
		}
	}
	return out
}

// globMatch reports whether value matches a pattern pre-split on '*', where each '*' stands
// for any run of bytes, possibly empty. Anchoring both ends first makes the leftmost scan of
// the middle parts exact, with no backtracking.
func globMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// escapeID makes a key or value safe inside an ID: '/' and '=' carry the ID's structure, '%'
// is the escape itself, and control bytes would make IDs unreadable in logs.
func escapeID(s string) string {
	const hex = "0123456789ABCDEF"
	clean := true
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func needsEscape(c byte) bool {
	return c == '%' || c == '/' || c == '=' || c < 0x20 || c == 0x7f
}

// File returns the name of the file that defined domain (the first, when merged), or "".
func (c *Config) File(domain string) string {
	if d := c.domains[domain]; d != nil {
		return d.file
	}
	return ""
}

// HasDomain reports whether the configuration defines domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }
