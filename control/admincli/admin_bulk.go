package admincli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// exportCommand is `sluice admin export`: every resource created through the API as one
// YAML document (docs/architecture.md, Bulk export and import).
func exportCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write every rule, override, exemption, identity and domain made through the API as one YAML document",
		Long: `Write the control store's rules, overrides, exemptions, identity assignments and Envoy
domains (those made through the API, not the policy files' nor the abuse detector's) as one
YAML document with top-level rules, overrides, exemptions, identities and domains, each entry
the API's body for that resource. "sluice admin import" loads it. -o json writes the server's
JSON instead. A large store may need a longer --timeout.`,
		Example: `  sluice admin export > control.yaml
  sluice admin export --timeout 2m -f control.yaml`,
		Args: cobra.NoArgs,
	}
	file := cmd.Flags().StringP("file", "f", "-", "where to write the document (- for stdout)")
	cmd.RunE = o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
		a, err := c.Get(cmd.Context(), adminPath("export"), nil)
		if err != nil {
			return err
		}
		doc := a.Body
		if !o.jsonOut() {
			if doc, err = jsonToYAML(a.Body); err != nil {
				return fmt.Errorf("export: %w", err)
			}
		}
		if *file == "-" {
			_, err = out(cmd).Write(doc)
			return err
		}
		return os.WriteFile(*file, doc, 0o600)
	})
	return cmd
}

// importCommand is `sluice admin import FILE [--apply]`.
func importCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Show what a document of export would change; with --apply, load it in one transaction",
		Long: `Read a document as "sluice admin export" writes it (YAML or JSON; - reads stdin) and send it
to the server, which checks every entry as its own endpoint does: a bad entry is named by its
list, index and field (overrides[3].type) and nothing changes. Without --apply, print what
would be created and updated, and change nothing. With --apply, load it in one transaction,
audited as one event per resource. Entries equal to the stored ones change nothing; an active
override of the same target is replaced; nothing absent from the document is deleted.`,
		Example: `  sluice admin import control.yaml
  sluice admin import control.yaml --apply --timeout 5m`,
		Args: cobra.ExactArgs(1),
	}
	apply := cmd.Flags().Bool("apply", false, "load the document; without it, only print what would change")
	cmd.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body, err := readDocument(args[0], cmd.InOrStdin())
		if err != nil {
			return err
		}
		q := url.Values{}
		if *apply {
			q.Set("apply", "true")
		}
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPost, Path: adminPath("import"), Query: q, Body: body})
		if err != nil {
			return err
		}
		if o.jsonOut() {
			_, err = out(cmd).Write(append(a.Body, '\n'))
			return err
		}
		var res struct {
			Applied                     bool
			Created, Updated, Unchanged int
			Changes                     []struct{ Action, Kind, Key string }
			PolicyVersion               string `json:"policy_version"`
		}
		if err := json.Unmarshal(a.Body, &res); err != nil {
			return fmt.Errorf("import: the answer: %w", err)
		}
		w := out(cmd)
		for _, ch := range res.Changes {
			fmt.Fprintf(w, "%s %s %s\n", ch.Action, ch.Kind, ch.Key)
		}
		if res.Applied {
			fmt.Fprintf(w, "imported: %d created, %d updated, %d unchanged", res.Created, res.Updated, res.Unchanged)
			if res.PolicyVersion != "" {
				fmt.Fprintf(w, " (policy version %s)", res.PolicyVersion)
			}
			fmt.Fprintln(w)
			return nil
		}
		fmt.Fprintf(w, "would create %d, update %d; %d unchanged. Nothing was changed: give --apply to import.\n", res.Created, res.Updated, res.Unchanged)
		return nil
	})
	return cmd
}

// readDocument reads an import document and returns it as JSON: YAML is turned into JSON
// here, so that the server reads one format.
func readDocument(path string, stdin io.Reader) ([]byte, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("%s: empty; want a document of sluice admin export", path)
	}
	if json.Valid(data) {
		return data, nil
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// jsonToYAML renders JSON as block-style YAML, keeping the order of members and numbers as
// they were written (JSON is YAML, so it is read as it is and only its style changes).
func jsonToYAML(b []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, err
	}
	var block func(*yaml.Node)
	block = func(n *yaml.Node) {
		n.Style &^= yaml.FlowStyle
		if n.Kind == yaml.ScalarNode && n.Style&yaml.DoubleQuotedStyle != 0 {
			// Quoted only where YAML needs it ("yes", "1", a time kept a string).
			n.Style &^= yaml.DoubleQuotedStyle
			if n.Tag == "!!str" {
				var probe any
				if yaml.Unmarshal([]byte(n.Value), &probe) != nil || fmt.Sprint(probe) != n.Value {
					n.Style |= yaml.DoubleQuotedStyle
				}
			}
		}
		for _, c := range n.Content {
			block(c)
		}
	}
	block(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
