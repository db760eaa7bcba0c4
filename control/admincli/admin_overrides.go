package admincli

import (
	"encoding/json"
	"net/http"

	"github.com/spf13/cobra"
)

var overrideColumns = []column{
	{"ID", "id", cellPlain},
	{"SOURCE", "source", cellPlain},
	{"TYPE", "type", cellPlain},
	{"TENANT", "tenant", cellPlain},
	{"USER", "user", cellPlain},
	{"API_KEY", "api_key", cellPlain},
	{"API_KEY_HASH", "api_key_hash", cellPlain},
	{"IP", "ip", cellPlain},
	{"ENDPOINT", "endpoint", cellPlain},
	{"RULE", "rule", cellPlain},
	{"VALUE", "value", cellPlain},
	{"LIMIT", "limit", cellPlain},
	{"BURST", "burst", cellPlain},
	{"EXPIRES_AT", "expires_at", cellTime},
	{"CREATED_BY", "created_by", cellPlain},
	{"REASON", "reason", cellPlain},
}

var exemptionColumns = []column{
	{"ID", "id", cellPlain},
	{"SOURCE", "source", cellPlain},
	{"API_KEY", "api_key", cellPlain},
	{"USER", "user", cellPlain},
	{"TENANT", "tenant", cellPlain},
	{"IP", "ip", cellPlain},
	{"EXPIRES_AT", "expires_at", cellTime},
	{"CREATED_BY", "created_by", cellPlain},
	{"REASON", "reason", cellPlain},
}

func overridesCommand(o *adminOptions) *cobra.Command {
	cmd := group("overrides", "Ban, throttle or raise the limits of a tenant, user, API key, IP or endpoint for a while")
	list := o.listCommand("List the active overrides", adminPath("overrides"), "overrides", overrideColumns, "tenant", "user", "api-key", "source")
	lf := list.Flags()
	lf.String("tenant", "", "only overrides of this tenant")
	lf.String("user", "", "only overrides of this user")
	lf.String("api-key", "", "only overrides of this API key")
	lf.String("source", "", "only overrides from file, api or automatic (the abuse detector)")

	create := &cobra.Command{
		Use:   "create",
		Short: "Create an override; it expires after --ttl or at --expires-at",
		Example: `  sluice admin overrides create --tenant acme --type ban --ttl 1h --reason "abuse ticket 42"
  sluice admin overrides create --api-key k-123 --type multiplier --value 0.1 --ttl 30m --reason "scraping"
  sluice admin overrides create --api-key-hash '#0f1e...' --type ban --ttl 1h --reason "key seen in violations"
  sluice admin overrides create --ip 203.0.113.0/24 --type ban --ttl 1h --reason "credential stuffing"
  sluice admin overrides create --tenant bigco --rule api-writes --type custom --limit 5000 --burst 500 \
      --expires-at 2026-12-31T00:00:00Z --reason "launch week"`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			var body object
			if err := bodyFromFlags(cmd, &body, "tenant", "user", "api-key", "api-key-hash", "ip", "endpoint", "rule", "type", "value", "limit", "burst", "ttl", "expires-at", "reason"); err != nil {
				return err
			}
			b, _ := json.Marshal(body)
			a, err := c.Send(cmd.Context(), http.MethodPost, adminPath("overrides"), b, changeFlags{})
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	cf := create.Flags()
	cf.String("tenant", "", "target tenant")
	cf.String("user", "", "target user")
	cf.String("api-key", "", "target API key")
	cf.String("api-key-hash", "", "target API key by its hash, as violations and usage show it ('#' and 32 hex digits)")
	cf.String("ip", "", "target IP address or CIDR, alone (no other target)")
	cf.String("endpoint", "", "target endpoint (no wildcards)")
	cf.String("rule", "", "only this rule (default: every rule)")
	cf.String("type", "", "ban, multiplier, custom or warn")
	cf.Float64("value", 0, "multiplier: the factor on limit and burst, such as 0.1 or 2")
	cf.Int64("limit", 0, "custom: the limit that replaces the rule's")
	cf.Int64("burst", 0, "custom: the burst that replaces the rule's")
	cf.String("ttl", "", "expire after this long: 30m, 1h, 7d")
	cf.String("expires-at", "", "expire at this RFC 3339 time")
	cf.String("reason", "", "why, for the audit log (required)")

	get := &cobra.Command{
		Use: "get ID", Short: "Show an override and its ETag", Args: cobra.ExactArgs(1),
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
			a, err := c.Get(cmd.Context(), adminPath("overrides", args[0]), nil)
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	del := &cobra.Command{Use: "delete ID", Aliases: []string{"rm"}, Short: "Delete an override now", Args: cobra.ExactArgs(1)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("overrides", args[0]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, "override "+args[0], a)
	})
	cmd.AddCommand(list, create, get, del)
	cmd.AddCommand(overridePatchCommands(o)...)
	return cmd
}

func exemptionsCommand(o *adminOptions) *cobra.Command {
	cmd := group("exemptions", "Callers that are always allowed and never counted: an API key, user, tenant, address or CIDR")
	list := o.listCommand("List the active exemptions", adminPath("exemptions"), "exemptions", exemptionColumns, "source")
	list.Flags().String("source", "", "only exemptions from file or api")

	create := &cobra.Command{
		Use:   "create",
		Short: "Exempt one caller: exactly one of --api-key, --user, --tenant, --ip",
		Example: `  sluice admin exemptions create --ip 203.0.113.0/24 --reason "partner crawler"
  sluice admin exemptions create --api-key k-monitor --reason "uptime checks" --expires-at 2026-12-31T00:00:00Z`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			var body object
			if err := bodyFromFlags(cmd, &body, "api-key", "user", "tenant", "ip", "reason", "expires-at"); err != nil {
				return err
			}
			b, _ := json.Marshal(body)
			a, err := c.Send(cmd.Context(), http.MethodPost, adminPath("exemptions"), b, changeFlags{})
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	cf := create.Flags()
	cf.String("api-key", "", "exempt API key")
	cf.String("user", "", "exempt user")
	cf.String("tenant", "", "exempt tenant")
	cf.String("ip", "", "exempt address or CIDR")
	cf.String("reason", "", "why, for the audit log (required)")
	cf.String("expires-at", "", "end the exemption at this RFC 3339 time (default: never)")

	get := &cobra.Command{
		Use: "get ID", Short: "Show an exemption and its ETag", Args: cobra.ExactArgs(1),
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
			a, err := c.Get(cmd.Context(), adminPath("exemptions", args[0]), nil)
			if err != nil {
				return err
			}
			return o.showResource(cmd, a)
		}),
	}
	del := &cobra.Command{Use: "delete ID", Aliases: []string{"rm"}, Short: "Delete an exemption now", Args: cobra.ExactArgs(1)}
	delChange := changeFlagsOf(del)
	del.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		a, err := c.Send(cmd.Context(), http.MethodDelete, adminPath("exemptions", args[0]), nil, *delChange)
		if err != nil {
			return err
		}
		return o.showDeleted(cmd, "exemption "+args[0], a)
	})
	cmd.AddCommand(list, create, get, del, exemptionPatchCommand(o))
	return cmd
}
