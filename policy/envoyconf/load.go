package envoyconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/algorithm"
)

// LoadError is one problem in one file. Load and LoadDir return every LoadError they find
// (up to maxErrors) joined with errors.Join, so one run of a config check shows them all;
// use errors.As to reach the first.
type LoadError struct {
	File  string
	Line  int
	Field string // dotted path such as descriptors[0].rate_limit.unit
	Msg   string
}

// Error formats the problem as file:line: field: message, the form editors can jump to.
func (e *LoadError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// maxErrors bounds the report for a badly broken folder; the first errors are the useful ones.
const maxErrors = 20

// nodeBudget bounds the YAML nodes visited in a file of size bytes, aliases included, so that
// a document of nested aliases (a "billion laughs") is refused instead of expanded. A file
// without aliases cannot hold more nodes than it has bytes, and the walk visits each node
// about once, so the bound only ever stops alias expansion.
func nodeBudget(size int) int { return 4*size + 4096 }

// maxDepth bounds how deep descriptors and metadata nest. Real files stay within a handful of
// levels; the bound turns a recursive alias (a list that contains itself), which yaml.v3 builds
// without complaint, into an error instead of an endless walk.
const maxDepth = 64

// units are the reference service's units (the RateLimitResponse.RateLimit.Unit enum, UNKNOWN
// excluded), with its fixed lengths for month and year.
var units = map[string]time.Duration{
	"SECOND": time.Second,
	"MINUTE": time.Minute,
	"HOUR":   time.Hour,
	"DAY":    24 * time.Hour,
	"WEEK":   7 * 24 * time.Hour,
	"MONTH":  30 * 24 * time.Hour,
	"YEAR":   365 * 24 * time.Hour,
}

const unitList = "second, minute, hour, day, week, month or year"

// The fields accepted at each level: the reference service's own, plus Sluice's extensions:
// algorithm, burst, escalation, adaptive and regions inside rate_limit, on_store_error on a domain and on a descriptor.
var (
	rootFields       = []string{"domain", "descriptors", "on_store_error", "attributes"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata", "on_store_error"}
	rateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst",
		"escalation", "adaptive", "regions"}
	replacesFields = []string{"name"}
)

// LoadDir loads every *.yaml and *.yml file of dir (not recursive; names starting with '.' are
// skipped, which also skips the ..data entries of a Kubernetes ConfigMap volume). Symbolic links
// are followed. With merge, one domain may span files (their top-level descriptors are merged;
// the same key and value at the top level in two files is still an error); without it a domain
// in two files is an error naming both.
func LoadDir(dir string, merge bool) (*Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load envoy rate limit config %s: %w", dir, err)
	}
	files := make(map[string][]byte)
	for _, e := range entries {
		name := e.Name()
		ext := strings.ToLower(filepath.Ext(name))
		if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("load envoy rate limit config %s: %w", dir, err)
		}
		if fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("load envoy rate limit config %s: %w", dir, err)
		}
		files[path] = data
	}
	return Load(files, merge)
}

// Load is LoadDir for named in-memory files (name -> contents); names appear in errors. Files
// are read in the order of their names, which decides, when a domain is merged, which file's
// wildcards are tried first.
func Load(files map[string][]byte, merge bool) (*Config, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)

	var errs []error
	c := &Config{domains: make(map[string]*domain)}
	for _, name := range names {
		f, ferrs := parseFile(name, files[name])
		errs = append(errs, ferrs...)
		if f == nil || len(errs) >= maxErrors {
			continue
		}
		d := c.domains[f.domain]
		if d == nil {
			c.domains[f.domain] = &domain{file: name, line: f.line, mode: f.mode, attrs: f.attrs, root: f.root, limits: f.limits}
			c.names = append(c.names, f.domain)
			continue
		}
		if !merge {
			errs = append(errs, &LoadError{name, f.line, "domain",
				fmt.Sprintf("domain %q is already defined in %s:%d (merging domains across files is off)", f.domain, d.file, d.line)})
			continue
		}
		errs = append(errs, d.root.merge(&f.root, name)...)
		d.limits = append(d.limits, f.limits...)
		attrs, err := mergeAttributes(d.attrs, f.attrs)
		if err != nil {
			errs = append(errs, &LoadError{name, f.line, "attributes", err.Error()})
		}
		d.attrs = attrs
	}
	if len(errs) > 0 {
		if len(errs) > maxErrors {
			errs = errs[:maxErrors]
		}
		return nil, errors.Join(errs...)
	}
	slices.Sort(c.names)
	c.indexNames()
	return c, nil
}

// indexNames records every limit's rate_limit name, stat key and ID, for NamesLimit.
func (c *Config) indexNames() {
	c.named = make(map[string]struct{})
	for _, d := range c.domains {
		for _, l := range d.limits {
			for _, n := range [...]string{l.Name, l.StatKey, l.ID} {
				if n != "" {
					c.named[n] = struct{}{}
				}
			}
		}
	}
}

// merge adds the top-level nodes of another file; like the reference service it merges only
// this level, so the same key and value in both files is a conflict even when their nested
// descriptors differ.
func (lv *level) merge(other *level, file string) []error {
	var errs []error
	for _, n := range other.list {
		if prev := lv.add(n); prev != nil {
			errs = append(errs, &LoadError{file, n.line, "descriptors",
				fmt.Sprintf("%s is already defined in %s:%d", describe(n), prev.file, prev.line)})
		}
	}
	return errs
}

// add inserts n, or returns the node already holding its key and value.
func (lv *level) add(n *node) *node {
	k := entryKey{n.key, n.value}
	if prev := lv.nodes[k]; prev != nil {
		return prev
	}
	if lv.nodes == nil {
		lv.nodes = make(map[entryKey]*node)
	}
	lv.nodes[k] = n
	lv.list = append(lv.list, n)
	if n.glob != nil {
		if lv.wild == nil {
			lv.wild = make(map[string][]*node)
		}
		lv.wild[n.key] = append(lv.wild[n.key], n)
	}
	return nil
}

func describe(n *node) string {
	if n.value == "" {
		return fmt.Sprintf("descriptor key %q (no value)", n.key)
	}
	return fmt.Sprintf("descriptor key %q value %q", n.key, n.value)
}

type fileConfig struct {
	domain string
	line   int
	mode   StoreErrorMode
	attrs  AttributeMap
	root   level
	limits []*Limit
}

// parser walks one file's YAML nodes. It records errors and keeps going, so a file reports
// all its problems at once.
type parser struct {
	file   string
	domain string
	errs   []error
	budget int
	depth  int
	limits []*Limit
}

// errBudget aborts a walk whose aliases expand past nodeBudget.
var errBudget = errors.New("budget exhausted")

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func parseFile(name string, data []byte) (f *fileConfig, errs []error) {
	p := &parser{file: name, budget: nodeBudget(len(data))}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, []error{&LoadError{name, 1, "domain", "file is empty; want a domain and descriptors"}}
		}
		return nil, []error{yamlError(name, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, []error{yamlError(name, err)}
		}
		return nil, []error{&LoadError{name, extra.Line, "document", "a second YAML document; put each domain in its own file"}}
	}

	defer func() {
		if r := recover(); r != nil {
			if r != errBudget {
				panic(r)
			}
			f, errs = nil, append(p.errs, &LoadError{name, 1, "document",
				fmt.Sprintf("aliases expand to more than %d YAML nodes", nodeBudget(len(data)))})
		}
	}()

	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root = p.resolve(root)
	if isNull(root) {
		return nil, []error{&LoadError{name, 1, "domain", "file is empty; want a domain and descriptors"}}
	}
	if root.Kind != yaml.MappingNode {
		return nil, []error{&LoadError{name, root.Line, "document", "must be a mapping with domain and descriptors, got " + kindName(root)}}
	}

	f = &fileConfig{line: root.Line}
	var descs *yaml.Node
	mode := FailOpen
	p.fields(root, "", rootFields, func(field string, k, v *yaml.Node) {
		switch field {
		case "domain":
			f.domain, _ = p.str(v, field)
			f.line = k.Line
		case "descriptors":
			descs = v
		case "on_store_error":
			mode = p.storeErrorMode(v, field, mode)
		case "attributes":
			f.attrs = p.attributes(v, field)
		}
	})
	if f.domain == "" {
		p.errorf(f.line, "domain", "must not be empty")
		return nil, p.errs
	}
	p.domain, f.mode = f.domain, mode
	if descs != nil {
		p.descriptors(descs, "descriptors", "", nil, mode, &f.root)
	}
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	f.limits = p.limits
	return f, nil
}

// descriptors loads a list of descriptors into lv. idPrefix, trail and mode describe the
// ancestors: the ID so far, the nodes of the levels above, and the on_store_error in force.
func (p *parser) descriptors(list *yaml.Node, path, idPrefix string, trail []*node, mode StoreErrorMode, lv *level) {
	list = p.resolve(list)
	if isNull(list) {
		return
	}
	if list.Kind != yaml.SequenceNode {
		p.errorf(list.Line, path, "must be a list of descriptors, got %s", kindName(list))
		return
	}
	if p.depth >= maxDepth {
		p.errorf(list.Line, path, "descriptors nest deeper than %d levels (a recursive alias?)", maxDepth)
		return
	}
	p.depth++
	defer func() { p.depth-- }()
	for i, item := range list.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		item = p.resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, ipath, "must be a mapping with key, value, rate_limit, descriptors, ..., got %s", kindName(item))
			continue
		}
		p.descriptor(item, ipath, idPrefix, trail, mode, lv)
	}
}

func (p *parser) descriptor(m *yaml.Node, path, idPrefix string, trail []*node, mode StoreErrorMode, lv *level) {
	n := &node{file: p.file, line: m.Line}
	var rl, children, metadata *yaml.Node
	var keyLine, shareLine, rlLine int
	var shadow, quota, detailed bool
	p.fields(m, path, descriptorFields, func(field string, k, v *yaml.Node) {
		fpath := join(path, field)
		switch field {
		case "key":
			n.key, _ = p.str(v, fpath)
			keyLine = k.Line
		case "value":
			n.value, _ = p.str(v, fpath)
		case "rate_limit":
			rl, rlLine = v, k.Line
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow = p.boolean(v, fpath)
		case "quota_mode":
			quota = p.boolean(v, fpath)
		case "detailed_metric":
			detailed = p.boolean(v, fpath)
		case "value_to_metric":
			n.toMetric = p.boolean(v, fpath)
		case "share_threshold":
			n.share = p.boolean(v, fpath)
			shareLine = k.Line
		case "metadata":
			metadata = v
		case "on_store_error":
			mode = p.storeErrorMode(v, fpath, mode)
		}
	})
	n.mode = mode
	if n.key == "" {
		if keyLine == 0 {
			keyLine = m.Line
		}
		p.errorf(keyLine, join(path, "key"), "must not be empty")
		return
	}
	if strings.Contains(n.value, "*") {
		n.glob = strings.Split(n.value, "*")
	}
	if n.share && n.glob == nil {
		p.errorf(shareLine, join(path, "share_threshold"), "needs a wildcard value (one containing '*'), got %q", n.value)
	}

	id := escapeID(n.key)
	if n.value != "" {
		id += "=" + escapeID(n.value)
	}
	if idPrefix != "" {
		id = idPrefix + "/" + id
	}
	trail = append(trail[:len(trail):len(trail)], n)

	if prev := lv.add(n); prev != nil {
		p.errorf(m.Line, path, "duplicate %s (first at line %d)", describe(n), prev.line)
	}

	if rl != nil {
		var md map[string]any
		if metadata != nil {
			md = p.metadata(metadata, join(path, "metadata"))
		}
		n.limit = p.rateLimit(rl, join(path, "rate_limit"), rlLine)
		if n.limit != nil {
			l := n.limit
			l.ID, l.Shadow, l.QuotaMode, l.DetailedMetric, l.ValueToMetric, l.Metadata = id, shadow, quota, detailed, n.toMetric, md
			l.label, l.StatKey = l.Domain+"/"+id, StatKey(l.Domain, id)
			l.OnStoreError = mode
			l.setTrail(trail)
			p.limits = append(p.limits, l)
		}
	} else if metadata != nil {
		p.metadata(metadata, join(path, "metadata"))
	}

	if children != nil {
		var kids level
		p.descriptors(children, join(path, "descriptors"), id, trail, mode, &kids)
		if len(kids.nodes) > 0 {
			n.children = &kids
		}
	}
}

// rateLimit compiles a rate_limit block; nil when it is null (the reference service reads a
// null rate_limit as none) or invalid.
func (p *parser) rateLimit(m *yaml.Node, path string, line int) *Limit {
	m = p.resolve(m)
	if isNull(m) {
		return nil
	}
	if m.Kind != yaml.MappingNode {
		p.errorf(m.Line, path, "must be a mapping with unit and requests_per_unit, got %s", kindName(m))
		return nil
	}
	l := &Limit{Domain: p.domain, File: p.file, Line: line}
	nerr := len(p.errs)
	var unit, algo string
	var unitLine, algoLine, burstLine, adaptiveLine, regionsLine int
	var burst uint64
	var adaptive string
	var replaces []*yaml.Node
	p.fields(m, path, rateLimitFields, func(field string, k, v *yaml.Node) {
		fpath := join(path, field)
		switch field {
		case "unit":
			unit, _ = p.str(v, fpath)
			unitLine = k.Line
		case "requests_per_unit":
			n, _ := p.uint(v, fpath, 32)
			l.RequestsPerUnit = uint32(n)
		case "unlimited":
			l.Unlimited = p.boolean(v, fpath)
		case "name":
			l.Name, _ = p.str(v, fpath)
		case "replaces":
			replaces = p.replaces(v, fpath)
		case "algorithm":
			algo, _ = p.str(v, fpath)
			algoLine = k.Line
		case "burst":
			burst, _ = p.uint(v, fpath, 40)
			burstLine = k.Line
		case "escalation":
			l.Escalation = p.escalation(v, fpath)
		case "adaptive":
			adaptive, _ = p.str(v, fpath)
			adaptiveLine = k.Line
		case "regions":
			l.Regions, _ = p.str(v, fpath)
			regionsLine = k.Line
		}
	})
	if adaptiveLine != 0 {
		if adaptive != "trust" {
			p.errorf(adaptiveLine, join(path, "adaptive"), "%q is not trust, the only adaptive mode", adaptive)
		}
		l.Adaptive = true
	}

	for i, r := range replaces {
		rpath := fmt.Sprintf("%s.replaces[%d]", path, i)
		var name string
		var nameLine int
		p.fields(r, rpath, replacesFields, func(_ string, k, v *yaml.Node) {
			name, _ = p.str(v, join(rpath, "name"))
			nameLine = k.Line
		})
		if nameLine == 0 {
			nameLine = r.Line
		}
		switch {
		case name == "":
			p.errorf(nameLine, join(rpath, "name"), "must not be empty")
		case name == l.Name:
			p.errorf(nameLine, join(rpath, "name"), "a limit cannot replace itself (%q)", name)
		default:
			l.Replaces = append(l.Replaces, name)
		}
	}

	if l.Unlimited {
		if unitLine != 0 && unit != "" {
			p.errorf(unitLine, join(path, "unit"), "must not be set when unlimited is true")
		}
		if algoLine != 0 {
			p.errorf(algoLine, join(path, "algorithm"), "must not be set when unlimited is true")
		}
		if burstLine != 0 {
			p.errorf(burstLine, join(path, "burst"), "must not be set when unlimited is true")
		}
		for _, f := range []struct {
			line  int
			field string
		}{{adaptiveLine, "adaptive"}, {regionsLine, "regions"}} {
			if f.line != 0 {
				p.errorf(f.line, join(path, f.field), "must not be set when unlimited is true")
			}
		}
		if l.Escalation != nil {
			p.errorf(line, join(path, "escalation"), "must not be set when unlimited is true")
		}
		if len(p.errs) > nerr {
			return nil
		}
		return l
	}

	period, ok := units[strings.ToUpper(unit)]
	switch {
	case unitLine == 0:
		p.errorf(line, join(path, "unit"), "missing (want %s, or unlimited: true)", unitList)
	case !ok:
		p.errorf(unitLine, join(path, "unit"), "invalid unit %q (want %s)", unit, unitList)
	}
	l.Unit, l.Period = strings.ToLower(unit), period

	kind := algorithm.FixedWindow
	if algoLine != 0 {
		k, err := algorithm.ParseKind(algo)
		if err != nil {
			p.errorf(algoLine, join(path, "algorithm"), "%v", err)
		}
		kind = k
	}
	if burstLine != 0 {
		switch {
		case burst == 0:
			p.errorf(burstLine, join(path, "burst"), "must be at least 1")
		case kind != 0 && !kind.IsBucket():
			p.errorf(burstLine, join(path, "burst"), "only token_bucket, gcra and leaky_bucket take a burst, not %s", kind)
		}
	}
	if regionsLine != 0 {
		p.regions(l.Regions, regionsLine, join(path, "regions"), kind)
	}
	if len(p.errs) > nerr {
		return nil
	}
	params, err := algorithm.NewParams(kind, int64(l.RequestsPerUnit), int64(burst), period)
	if err != nil {
		p.errorf(line, path, "%v", err)
		return nil
	}
	l.Params = params
	return l
}

func (p *parser) replaces(v *yaml.Node, path string) []*yaml.Node {
	v = p.resolve(v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		p.errorf(v.Line, path, "must be a list of {name: ...}, got %s", kindName(v))
		return nil
	}
	var out []*yaml.Node
	for i, item := range v.Content {
		item = p.resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, fmt.Sprintf("%s[%d]", path, i), "must be a mapping {name: ...}, got %s", kindName(item))
			continue
		}
		out = append(out, item)
	}
	return out
}

// storeErrorMode reads on_store_error; a bad value is an error, and inherited keeps the mode
// in force.
func (p *parser) storeErrorMode(v *yaml.Node, path string, inherited StoreErrorMode) StoreErrorMode {
	s, ok := p.str(v, path)
	if !ok {
		return inherited
	}
	switch s {
	case "":
		return inherited
	case "open":
		return FailOpen
	case "closed":
		return FailClosed
	case "local":
		return FailLocal
	}
	p.errorf(v.Line, path, "%q is not open, closed or local", s)
	return inherited
}
