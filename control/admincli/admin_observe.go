package admincli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
)

var auditColumns = []column{
	{"ID", "id", cellPlain},
	{"AT", "at", cellTime},
	{"ACTOR", "actor", cellPlain},
	{"ACTION", "action", cellPlain},
	{"KIND", "kind", cellPlain},
	{"TARGET", "target", cellPlain},
	{"REASON", "reason", cellPlain},
}

var usageColumns = []column{
	{"RULE", "rule", cellPlain},
	{"SCOPE", "scope", cellPlain},
	{"ALGORITHM", "algorithm", cellPlain},
	{"STATE", "state", cellPlain},
	{"LIMIT", "limit", cellPlain},
	{"REMAINING", "remaining", cellPlain},
	{"IN_FLIGHT", "in_flight", cellPlain}, // concurrency limits only
	{"RESET_AFTER", "reset_after_ms", cellMillis},
	{"RETRY_AFTER", "retry_after_ms", cellMillis},
}

var historyColumns = []column{
	{"AT", "at", cellTime},
	{"ALLOWED", "allowed", cellPlain},
	{"DENIED", "denied", cellPlain},
	{"SOFT", "soft", cellPlain},
}

var violationColumns = []column{
	{"AT", "at", cellTime},
	{"RULE", "rule", cellPlain},
	{"STATE", "state", cellPlain},
	{"COUNT", "count", cellPlain},
	{"LIMIT", "limit", cellPlain},
	{"TENANT", "tenant", cellPlain},
	{"USER", "user", cellPlain},
	{"API_KEY", "api_key", cellPlain},
	{"IP", "ip", cellPlain},
	{"ENDPOINT", "endpoint", cellPlain},
}

var nodeColumns = []column{
	{"ID", "id", cellPlain},
	{"ADDR", "addr", cellPlain},
	{"POLICY_VERSION", "policy_version", cellPlain},
	{"SEEN_AT", "seen_at", cellTime},
}

// timeHelp is the help of every time filter.
const timeHelp = "an RFC 3339 time, or a duration meaning that long ago: 90m, 24h, 7d"

func auditCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Who changed what, newest first",
		Example: `  sluice admin audit --since 24h
  sluice admin audit --actor abuse-detector --kind override --limit 20
  sluice admin audit --target api-writes -o json`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, []string{"since", "until"}, "since", "until", "actor", "action", "kind", "target", "limit", "before-id")
			a, err := c.Get(cmd.Context(), adminPath("audit"), q)
			if err != nil {
				return err
			}
			return o.showList(cmd, a, "events", auditColumns)
		}),
	}
	f := cmd.Flags()
	f.String("since", "", "events at or after this: "+timeHelp)
	f.String("until", "", "events before this: "+timeHelp)
	f.String("actor", "", "only this actor: a token name, abuse-detector, system, file:PATH")
	f.String("action", "", "only create, update, delete, expire, burst_detected_warning or burst_detected_blocked")
	f.String("kind", "", "only rule, override, exemption, identity, token, policy_files, penalty or domain")
	f.String("target", "", "only this target: a rule or token name, an override or exemption id, KIND/VALUE")
	f.Int("limit", 0, "at most this many events (server default 100, at most 1000)")
	f.Int64("before-id", 0, "page back: only events older than this id")
	return cmd
}

func usageCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "The quota of a caller now: every limit that applies, what remains and when it resets",
		Example: `  sluice admin usage --tenant acme --endpoint /api/items --method POST
  sluice admin usage history --tenant acme --from 7d --step 1h`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, nil, "tenant", "user", "api-key", "ip", "endpoint", "method", "tier")
			a, err := c.Get(cmd.Context(), adminPath("usage"), q)
			if err != nil {
				return err
			}
			if o.jsonOut() {
				return writeRaw(out(cmd), a.Body)
			}
			return printUsage(cmd, a.Body)
		}),
	}
	f := cmd.Flags()
	for _, name := range []string{"tenant", "user", "api-key", "ip", "endpoint", "method", "tier"} {
		f.String(name, "", "request attribute "+name)
	}

	history := &cobra.Command{
		Use:   "history",
		Short: "Allowed, denied and soft decisions per minute, hour or day, fleet-wide",
		Args:  cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, []string{"from", "to"}, "rule", "tenant", "from", "to", "step")
			a, err := c.Get(cmd.Context(), adminPath("usage", "history"), q)
			if err != nil {
				return err
			}
			return o.showList(cmd, a, "points", historyColumns)
		}),
	}
	hf := history.Flags()
	hf.String("rule", "", "only this rule")
	hf.String("tenant", "", "only this tenant")
	hf.String("from", "", "first point: "+timeHelp+" (default: an hour, a day or 30 days before --to, by --step)")
	hf.String("to", "", "end, excluded: "+timeHelp+" (default now)")
	hf.String("step", "", "width of a point: 1m (default), 1h or 1d")
	cmd.AddCommand(history)
	return cmd
}

// printUsage prints a quota decision: its summary, then one row per limit that applies.
func printUsage(cmd *cobra.Command, body []byte) error {
	o, err := parseObject(body)
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	summary := o[:0:0]
	for _, m := range o {
		if m.Name != "results" {
			summary = append(summary, m)
		}
	}
	b, _ := json.Marshal(summary)
	w := out(cmd)
	if err := printObject(w, b); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printList(w, body, "results", usageColumns)
}

func violationsCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "violations",
		Short: "Denied (hard) and soft decisions per minute, rule and caller, newest first, fleet-wide",
		Example: `  sluice admin violations --tenant acme --since 1h
  sluice admin violations --rule api-writes --limit 50 -o json`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, []string{"since", "until"}, "tenant", "user", "api-key", "ip", "rule", "since", "until", "limit", "after")
			a, err := c.Get(cmd.Context(), adminPath("violations"), q)
			if err != nil {
				return err
			}
			return o.showList(cmd, a, "violations", violationColumns)
		}),
	}
	f := cmd.Flags()
	f.String("tenant", "", "only this tenant")
	f.String("user", "", "only this user")
	f.String("api-key", "", "only this API key: the key, or its hashed prefix as violations show it")
	f.String("ip", "", "only this address")
	f.String("rule", "", "only this rule")
	f.String("since", "", "minutes at or after this: "+timeHelp)
	f.String("until", "", "minutes before this: "+timeHelp)
	f.Int("limit", 0, "at most this many minute counts (server default 100, at most 1000; with -o json, next is the cursor for --after)")
	f.String("after", "", "the page after this cursor (the previous page's next, with -o json)")
	return cmd
}

func nodesCommand(o *adminOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "The live nodes and the policy version each enforces",
		Args:  cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			a, err := c.Get(cmd.Context(), adminPath("nodes"), nil)
			if err != nil {
				return err
			}
			return o.showList(cmd, a, "nodes", nodeColumns)
		}),
	}
}

func resetCommand(o *adminOptions) *cobra.Command {
	var descriptors []string
	cmd := &cobra.Command{
		Use:   "reset",
		Short: "Restore the buckets a request with these attributes addresses (only --rule's when given)",
		Example: `  sluice admin reset --tenant acme
  sluice admin reset --user bob --rule api-writes`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			var body object
			if err := bodyFromFlags(cmd, &body, "tenant", "user", "api-key", "ip", "endpoint", "method", "tier"); err != nil {
				return err
			}
			if len(descriptors) > 0 {
				ds, err := keyValues("descriptor", descriptors)
				if err != nil {
					return err
				}
				body.Set("descriptors", ds)
			}
			if err := bodyFromFlags(cmd, &body, "rule"); err != nil {
				return err
			}
			b, _ := json.Marshal(body)
			a, err := c.Send(cmd.Context(), http.MethodPost, adminPath("reset"), b, changeFlags{})
			if err != nil {
				return err
			}
			if o.jsonOut() {
				return writeRaw(out(cmd), a.Body)
			}
			// A reset changes counters, not the policy: the version is the one it ran under.
			return printObject(out(cmd), a.Body, [2]string{"policy_version", a.PolicyVersion()})
		}),
	}
	f := cmd.Flags()
	for _, name := range []string{"tenant", "user", "api-key", "ip", "endpoint", "method", "tier"} {
		f.String(name, "", "request attribute "+strings.ReplaceAll(name, "-", "_"))
	}
	f.StringArrayVar(&descriptors, "descriptor", nil, "descriptor key=value (repeatable)")
	f.String("rule", "", "reset only this rule's buckets")
	return cmd
}
