package admincli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/spf13/cobra"
)

var identityColumns = []column{
	{"KIND", "kind", cellPlain},
	{"VALUE", "value", cellPlain},
	{"TIER", "tier", cellPlain},
	{"TENANT", "tenant", cellPlain},
	{"USER", "user", cellPlain},
	{"TRUST", "trust", cellPlain},
	{"UPDATED_BY", "updated_by", cellPlain},
	{"UPDATED_AT", "updated_at", cellTime},
}

var tokenColumns = []column{
	{"NAME", "name", cellPlain},
	{"ROLE", "role", cellPlain},
	{"CREATED_BY", "created_by", cellPlain},
	{"CREATED_AT", "created_at", cellTime},
	{"EXPIRES_AT", "expires_at", cellTime},
	{"LAST_USED_AT", "last_used_at", cellTime},
}

func identitiesCommand(o *adminOptions) *cobra.Command {
	cmd := group("identities", "Server-side tier, tenant, user and trust of an API key, user or tenant (KIND: api_key, user, tenant)")
	cmd.Long = `Identity assignments give an API key, a user or a tenant a tier (and an API key a tenant and
a user, and any of them an adaptive-limit trust score in [0, 1]). Assigned values win over
the ones a request carries. KIND is api_key, user or tenant.`
	list := o.listCommand("List the assignments", adminPath("identities"), "identities", identityColumns, "kind")
	list.Flags().String("kind", "", "only this kind: api_key, user or tenant")

	set := &cobra.Command{
		Use:     "set KIND VALUE",
		Aliases: []string{"put"},
		Short:   "Create or replace the assignment of KIND VALUE (what the flags leave out is unassigned)",
		Example: `  sluice admin identities set api_key k-123 --tier premium --tenant acme --user bob
  sluice admin identities set tenant acme --tier enterprise --trust 0.9`,
		Args: cobra.ExactArgs(2),
	}
	setChange := changeFlagsOf(set)
	set.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		var body object
		if err := bodyFromFlags(cmd, &body, "tier", "tenant", "user", "trust"); err != nil {
			return err
		}
		b, _ := json.Marshal(body)
		a, err := c.Send(cmd.Context(), http.MethodPut, adminPath("identities", args[0], args[1]), b, *setChange)
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})
	sf := set.Flags()
	sf.String("tier", "", "the tier its requests are limited as")
	sf.String("tenant", "", "api_key only: the tenant its requests belong to")
	sf.String("user", "", "api_key only: the user its requests belong to")
	sf.Float64("trust", 0, "trust score in [0, 1] for rules with adaptive: trust")

	get := &cobra.Command{
		Use: "get KIND VALUE", Short: "Show an assignment and its ETag", Args: cobra.ExactArgs(2),
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
			a, err := c.Get(cmd.Context(), adminPath("identities", args[0], args[1]), nil)
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	del := &cobra.Command{Use: "delete KIND VALUE", Aliases: []string{"rm"}, Short: "Delete an assignment", Args: cobra.ExactArgs(2)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("identities", args[0], args[1]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, fmt.Sprintf("identity %s %s", args[0], strconv.Quote(args[1])), a)
	})
	cmd.AddCommand(list, set, get, del)
	return cmd
}

func tokensCommand(o *adminOptions) *cobra.Command {
	cmd := group("tokens", "Admin API tokens (needs an admin token): read, write or admin")
	create := &cobra.Command{
		Use:   "create NAME --role read|write|admin",
		Short: "Create a token and print its secret, shown this once: stdout has the secret alone",
		Example: `  sluice admin tokens create ci --role read --ttl 90d > ci.token
  sluice admin tokens create deploy --role write -o json`,
		Args: cobra.ExactArgs(1),
	}
	role := create.Flags().String("role", "", "read (every GET), write (read and every change), admin (write and tokens)")
	_ = create.MarkFlagRequired("role")
	ttl := create.Flags().String("ttl", "", "the token stops working this long after now: 12h, 90d (default: never)")
	create.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		body := object{{Name: "name", Value: mustJSON(args[0])}, {Name: "role", Value: mustJSON(*role)}}
		if *ttl != "" {
			body.Set("ttl", *ttl)
		}
		b, _ := json.Marshal(body)
		a, err := c.Send(cmd.Context(), http.MethodPost, adminPath("tokens"), b, changeFlags{})
		if err != nil {
			return err
		}
		if o.jsonOut() {
			return writeRaw(out(cmd), a.Body)
		}
		var t struct {
			Name          string `json:"name"`
			Role          string `json:"role"`
			Token         string `json:"token"`
			PolicyVersion string `json:"policy_version"`
		}
		if err := json.Unmarshal(a.Body, &t); err != nil {
			return fmt.Errorf("read the answer: %w", err)
		}
		if t.Token == "" {
			return errors.New("the answer has no token")
		}
		// The secret alone on stdout, so that "> file" or $(...) captures it; the rest is for
		// the person at the terminal.
		fmt.Fprintf(cmd.ErrOrStderr(), "created token %s (role %s, policy version %s); its secret follows, shown this once: store it now\n",
			strconv.Quote(t.Name), sanitize(t.Role), sanitize(t.PolicyVersion))
		_, err = fmt.Fprintln(out(cmd), t.Token)
		return err
	})

	list := o.listCommand("List token names and roles (never secrets)", adminPath("tokens"), "tokens", tokenColumns)
	del := &cobra.Command{Use: "delete NAME", Aliases: []string{"rm"}, Short: "Delete a token: its secret stops working at once", Args: cobra.ExactArgs(1)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("tokens", args[0]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, "token "+strconv.Quote(args[0]), a)
	})
	cmd.AddCommand(create, list, del)
	return cmd
}

// mustJSON encodes a string.
func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
