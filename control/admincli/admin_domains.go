package admincli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/control"
)

var domainColumns = []column{
	{"DOMAIN", "domain", cellPlain},
	{"SOURCE", "source", cellPlain},
	{"UPDATED_BY", "updated_by", cellPlain},
	{"UPDATED_AT", "updated_at", cellTime},
}

func domainsCommand(o *adminOptions) *cobra.Command {
	cmd := group("domains", "Envoy-format domains (the reference rate limit service's configuration), operated at run time")
	cmd.Long = `A domain holds the descriptors Envoy's rate limit requests name, in the format of Envoy's
reference rate limit service: the YAML of one of its files, or the same as JSON. The server
validates it exactly as a file of --config, and every node enforces it within a second. A
domain of the policy files is read-only here.`
	list := o.listCommand("List the domains, the files' then the API's", adminPath("domains"), "domains", domainColumns)
	get := &cobra.Command{
		Use: "get DOMAIN", Short: "Show a domain's configuration (as JSON with -o json) and its ETag", Args: cobra.ExactArgs(1),
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
			a, err := c.Get(cmd.Context(), adminPath("domains", args[0]), nil)
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	put := &cobra.Command{
		Use:     "put DOMAIN -f FILE",
		Aliases: []string{"set"},
		Short:   "Create or replace a domain from a file of the reference service's format, YAML or JSON",
		Example: `  sluice admin domains put edge -f edge.yaml
  sluice admin domains get edge -o json > edge.json && sluice admin domains put edge -f edge.json --if-match 12`,
		Args: cobra.ExactArgs(1),
	}
	file := put.Flags().StringP("file", "f", "", "the domain's configuration, YAML or JSON (- reads stdin)")
	_ = put.MarkFlagRequired("file")
	putChange := changeFlagsOf(put)
	put.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body, err := readDomainFile(*file, cmd.InOrStdin())
		if err != nil {
			return err
		}
		// JSON as JSON, so that an answer of get can be sent back; the rest (a YAML flow
		// mapping, which starts with { too, included) as YAML, which the server reads as it
		// reads a file, naming lines in its errors.
		ct := "application/yaml"
		if json.Valid(body) {
			ct = "application/json"
		}
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPut, Path: adminPath("domains", args[0]), Body: body,
			ContentType: ct, IfMatch: putChange.IfMatch, Reason: putChange.Reason})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})
	del := &cobra.Command{Use: "delete DOMAIN", Aliases: []string{"rm"}, Short: "Delete a domain: its requests then answer OK, unlimited", Args: cobra.ExactArgs(1)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("domains", args[0]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, "domain "+strconv.Quote(args[0]), a)
	})
	cmd.AddCommand(list, get, put, del)
	return cmd
}

// readDomainFile reads a domain's file, or stdin for "-", up to the size the server takes.
func readDomainFile(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, control.MaxDomainBodyLen+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > control.MaxDomainBodyLen {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, control.MaxDomainBodyLen)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("%s: empty; want a domain's configuration", path)
	}
	return data, nil
}
