package admincli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

var ruleColumns = []column{
	{"NAME", "name", cellPlain},
	{"SOURCE", "source", cellPlain},
	{"ALGORITHM", "algorithm", cellPlain},
	{"LIMIT", "limit", cellPlain},
	{"PERIOD", "period", cellPlain},
	{"BURST", "burst", cellPlain},
	{"KEY", "key", cellPlain},
	{"MATCH", "match", cellPlain},
	{"SHADOW", "shadow", cellPlain},
	{"UPDATED_AT", "updated_at", cellTime},
}

func rulesCommand(o *adminOptions) *cobra.Command {
	cmd := group("rules", "List, read, create, replace, patch and delete rules (policy-file rules are read-only)")
	list := o.listCommand("List the rules: policy files' and the API's", adminPath("rules"), "rules", ruleColumns)
	get := &cobra.Command{
		Use: "get NAME", Short: "Show a rule and its ETag", Args: cobra.ExactArgs(1),
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
			a, err := c.Get(cmd.Context(), adminPath("rules", args[0]), nil)
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}

	create := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a rule from a YAML or JSON file (-f), flags, or both (flags win)",
		Example: `  sluice admin rules create -f rule.yaml
  sluice admin rules create api-writes --key tenant --algorithm gcra --limit 100 --period 1m --match endpoint=/api/* --match method=POST`,
		Args: cobra.MaximumNArgs(1),
	}
	createFlags := registerRuleFlags(create, false)
	create.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body, err := createFlags.body(cmd)
		if err != nil {
			return err
		}
		if len(args) == 1 {
			body.Set("name", args[0])
		}
		b, _ := json.Marshal(body)
		a, err := c.Send(cmd.Context(), http.MethodPost, adminPath("rules"), b, changeFlags{})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})

	update := &cobra.Command{
		Use:     "update NAME",
		Aliases: []string{"put"},
		Short:   "Replace a rule with the one of a file (-f) and flags; what they leave out is removed",
		Args:    cobra.ExactArgs(1),
	}
	updateFlags := registerRuleFlags(update, false)
	updateChange := changeFlagsOf(update)
	update.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body, err := updateFlags.body(cmd)
		if err != nil {
			return err
		}
		if len(body) == 0 {
			return errors.New("nothing to send: give the whole rule with --file or rule flags (to change a few fields, use patch)")
		}
		b, _ := json.Marshal(body)
		a, err := c.Send(cmd.Context(), http.MethodPut, adminPath("rules", args[0]), b, *updateChange)
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})

	patch := &cobra.Command{
		Use:   "patch NAME",
		Short: "Change some fields of a rule: a JSON merge patch from a file (-f), flags, and --unset",
		Example: `  sluice admin rules patch api-writes --limit 200
  sluice admin rules patch api-writes --unset burst --if-match 17
  echo '{"tiers": {"free": {"limit": 5}}}' | sluice admin rules patch api-writes -f -`,
		Args: cobra.ExactArgs(1),
	}
	patchFlags := registerRuleFlags(patch, true)
	patchChange := changeFlagsOf(patch)
	patch.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body, err := patchFlags.body(cmd)
		if err != nil {
			return err
		}
		if len(body) == 0 {
			return errors.New("nothing to change: give --file, rule flags or --unset")
		}
		b, _ := json.Marshal(body)
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPatch, Path: adminPath("rules", args[0]), Body: b,
			ContentType: "application/merge-patch+json", IfMatch: patchChange.IfMatch, Reason: patchChange.Reason})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})

	del := &cobra.Command{Use: "delete NAME", Aliases: []string{"rm"}, Short: "Delete an API rule", Args: cobra.ExactArgs(1)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("rules", args[0]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, "rule "+strconv.Quote(args[0]), a)
	})

	cmd.AddCommand(list, get, create, update, patch, del)
	return cmd
}

// ruleFlags build a rule body, or a merge patch of one, from a file and flags.
type ruleFlags struct {
	file  string
	keys  []string
	match []string
	unset []string
}

// ruleScalarFlags are the rule fields set by a flag of the same name (- for _).
var ruleScalarFlags = []string{"algorithm", "limit", "period", "burst", "soft", "hard", "shadow", "on-store-error"}

func registerRuleFlags(cmd *cobra.Command, patch bool) *ruleFlags {
	rf := &ruleFlags{}
	f := cmd.Flags()
	f.StringVarP(&rf.file, "file", "f", "", "the rule as YAML or JSON, the native rule fields (- reads stdin)")
	f.String("algorithm", "", "token_bucket (default), gcra, leaky_bucket, fixed_window, sliding_window_log or sliding_window_counter")
	f.Int64("limit", 0, "requests allowed per period")
	f.String("period", "", "the limit's period: 1s, 1m, 1h, 1d")
	f.Int64("burst", 0, "bucket capacity, when it differs from limit")
	f.Int64("soft", 0, "percent of the limit past which allowed decisions are marked soft (a warning)")
	f.Int64("hard", 0, "percent of the limit where requests are denied (default 100; 110 tolerates 10% more)")
	f.Bool("shadow", false, "count and report, never deny")
	f.String("on-store-error", "", "when the store fails: open, closed or local")
	f.StringSliceVar(&rf.keys, "key", nil, "attributes the limit is counted per, such as tenant,user (repeatable)")
	f.StringArrayVar(&rf.match, "match", nil, "a match filter FIELD=VALUE: tenant, user, api_key, ip, endpoint, method, tier, descriptors.NAME (repeatable)")
	if patch {
		f.StringArrayVar(&rf.unset, "unset", nil, "remove a field (send it as null), such as burst or match.method (repeatable)")
	}
	return rf
}

// body is the file's object (or an empty one) with the given flags set on it.
func (rf *ruleFlags) body(cmd *cobra.Command) (object, error) {
	var body object
	if rf.file != "" {
		var err error
		if body, err = readObjectFile(rf.file, cmd.InOrStdin()); err != nil {
			return nil, err
		}
	}
	if err := bodyFromFlags(cmd, &body, ruleScalarFlags...); err != nil {
		return nil, err
	}
	if cmd.Flags().Changed("key") {
		body.Set("key", rf.keys)
	}
	if len(rf.match) > 0 {
		var match object
		if raw, ok := body.Get("match"); ok {
			var err error
			if match, err = parseObject(raw); err != nil {
				return nil, fmt.Errorf("match: %w", err)
			}
		}
		var desc object
		if raw, ok := match.Get("descriptors"); ok {
			var err error
			if desc, err = parseObject(raw); err != nil {
				return nil, fmt.Errorf("match.descriptors: %w", err)
			}
		}
		for _, kv := range rf.match {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--match %q: want FIELD=VALUE, such as endpoint=/api/*", kv)
			}
			if name, ok := strings.CutPrefix(k, "descriptors."); ok {
				desc.Set(name, v)
				continue
			}
			match.Set(k, v)
		}
		if len(desc) > 0 {
			b, _ := json.Marshal(desc)
			match.SetRaw("descriptors", b)
		}
		b, _ := json.Marshal(match)
		body.SetRaw("match", b)
	}
	for _, path := range rf.unset {
		if err := unset(&body, strings.Split(path, ".")); err != nil {
			return nil, fmt.Errorf("--unset %q: %w", path, err)
		}
	}
	return body, nil
}

// unset sets the member at path to null, the merge patch's removal.
func unset(o *object, path []string) error {
	if path[0] == "" {
		return errors.New("empty field name")
	}
	if len(path) == 1 {
		o.SetRaw(path[0], json.RawMessage("null"))
		return nil
	}
	var sub object
	if raw, ok := o.Get(path[0]); ok && len(raw) > 0 && raw[0] == '{' {
		var err error
		if sub, err = parseObject(raw); err != nil {
			return err
		}
	}
	if err := unset(&sub, path[1:]); err != nil {
		return err
	}
	b, _ := json.Marshal(sub)
	o.SetRaw(path[0], b)
	return nil
}

// maxFileBytes bounds a rule file; the server refuses bodies far smaller.
const maxFileBytes = 4 << 20

// readObjectFile reads one object from a YAML or JSON file (JSON is YAML), its members in the
// file's order. The server validates the fields and names the wrong one; this only turns YAML
// into the JSON the API takes.
func readObjectFile(path string, stdin io.Reader) (object, error) {
	var (
		data []byte
		err  error
	)
	if path == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, maxFileBytes+1))
	} else {
		var f *os.File
		if f, err = os.Open(path); err == nil {
			data, err = io.ReadAll(io.LimitReader(f, maxFileBytes+1))
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxFileBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty; want one object of rule fields", path)
	}
	n := doc.Content[0]
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: line %d: want one object of rule fields, as YAML or JSON", path, n.Line)
	}
	budget := maxYAMLNodes
	raw, err := yamlToJSON(n, "", &budget)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return parseObject(raw)
}

// maxYAMLNodes bounds the nodes a file expands to through aliases ("billion laughs").
const maxYAMLNodes = 100_000

// yamlToJSON renders a YAML node as JSON: mappings as objects in order, sequences as arrays,
// scalars by their resolved tag. Written by hand because decoding into map[string]any loses
// the members' order and yaml.v3 offers no JSON writer.
func yamlToJSON(n *yaml.Node, path string, budget *int) ([]byte, error) {
	if *budget--; *budget < 0 {
		return nil, errors.New("too many values (aliases expand past the limit)")
	}
	at := func(msg string) error {
		if path == "" {
			return fmt.Errorf("line %d: %s", n.Line, msg)
		}
		return fmt.Errorf("%s: line %d: %s", path, n.Line, msg)
	}
	switch n.Kind {
	case yaml.AliasNode:
		return yamlToJSON(n.Alias, path, budget)
	case yaml.MappingNode:
		var o object
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, at("a key must be a string")
			}
			sub := k.Value
			if path != "" {
				sub = path + "." + k.Value
			}
			b, err := yamlToJSON(v, sub, budget)
			if err != nil {
				return nil, err
			}
			// Appended, not set: a name given twice reaches the server, which names it.
			o = append(o, member{Name: k.Value, Value: b})
		}
		return json.Marshal(o)
	case yaml.SequenceNode:
		items := make([]json.RawMessage, len(n.Content))
		for i, c := range n.Content {
			b, err := yamlToJSON(c, fmt.Sprintf("%s[%d]", path, i), budget)
			if err != nil {
				return nil, err
			}
			items[i] = b
		}
		return json.Marshal(items)
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return []byte("null"), nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return nil, at(err.Error())
			}
			return json.Marshal(b)
		case "!!int":
			var i int64
			if err := n.Decode(&i); err != nil {
				return nil, at(fmt.Sprintf("%s is not a 64-bit integer", n.Value))
			}
			return json.Marshal(i)
		case "!!float":
			var f float64
			if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return nil, at(fmt.Sprintf("%s is not a finite number", n.Value))
			}
			return json.Marshal(f)
		}
		return json.Marshal(n.Value) // strings, and times or others kept as their text
	}
	return nil, at("unsupported YAML node")
}
