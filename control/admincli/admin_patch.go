package admincli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/policy"
)

// overridePatchCommands are `overrides patch` and `overrides extend`: changes in place (one
// transaction on the server), so extending a ban never lifts it in between.
func overridePatchCommands(o *adminOptions) []*cobra.Command {
	patch := &cobra.Command{
		Use:   "patch ID",
		Short: "Change an override in place: its expiry, value, limit, burst or reason",
		Example: `  sluice admin overrides patch 42 --ttl 2h --reason "still abusive"
  sluice admin overrides patch 43 --value 0.05
  sluice admin overrides patch 44 --limit 800 --unset burst --if-match 17`,
		Args: cobra.ExactArgs(1),
	}
	pf := patch.Flags()
	pf.String("ttl", "", "expire this long from now: 30m, 1h, 7d")
	pf.String("expires-at", "", "expire at this RFC 3339 time")
	pf.Float64("value", 0, "multiplier: the new factor")
	pf.Int64("limit", 0, "custom: the new limit")
	pf.Int64("burst", 0, "custom: the new burst")
	pf.String("reason", "", "the override's new reason, also the audit log's")
	pf.StringSlice("unset", nil, "remove value, limit or burst (repeatable)")
	ifMatch := pf.String("if-match", "", `change only if the override's ETag is still this (as "get" shows it)`)
	patch.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		var body object
		if err := bodyFromFlags(cmd, &body, "ttl", "expires-at", "value", "limit", "burst", "reason"); err != nil {
			return err
		}
		unset, _ := cmd.Flags().GetStringSlice("unset")
		for _, u := range unset {
			body.SetRaw(u, json.RawMessage("null"))
		}
		b, _ := json.Marshal(body)
		if string(b) == "{}" {
			return fmt.Errorf("nothing to change: give --ttl, --expires-at, --value, --limit, --burst, --reason or --unset")
		}
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPatch, Path: adminPath("overrides", args[0]), Body: b,
			ContentType: "application/merge-patch+json", IfMatch: *ifMatch})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})

	extend := &cobra.Command{
		Use:   "extend ID",
		Short: "Push an override's expiry later by --by (from its current expiry), in place",
		Example: `  sluice admin overrides extend 42 --by 1h
  sluice admin overrides extend 42 --by 7d --reason "repeat offender"`,
		Args: cobra.ExactArgs(1),
	}
	by := extend.Flags().String("by", "1h", "how much later: 30m, 1h, 7d")
	reason := extend.Flags().String("reason", "", "the override's new reason, also the audit log's")
	extend.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		d, err := policy.ParseDuration(*by)
		if err != nil || d <= 0 {
			return fmt.Errorf("--by %q: want a duration > 0 such as 30m, 1h or 7d", *by)
		}
		cur, err := c.Get(cmd.Context(), adminPath("overrides", args[0]), nil)
		if err != nil {
			return err
		}
		var ov struct {
			ExpiresAt time.Time `json:"expires_at"`
		}
		if err := json.Unmarshal(cur.Body, &ov); err != nil || ov.ExpiresAt.IsZero() {
			return fmt.Errorf("override %s: the answer has no expires_at", args[0])
		}
		var body object
		body.Set("expires_at", ov.ExpiresAt.Add(d).UTC().Format(time.RFC3339Nano))
		if *reason != "" {
			body.Set("reason", *reason)
		}
		b, _ := json.Marshal(body)
		// If-Match the version read: a change in between is reported (exit 3), not overwritten.
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPatch, Path: adminPath("overrides", args[0]), Body: b,
			ContentType: "application/merge-patch+json", IfMatch: cur.ETag()})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})
	return []*cobra.Command{patch, extend}
}

// exemptionPatchCommand is `exemptions patch`.
func exemptionPatchCommand(o *adminOptions) *cobra.Command {
	patch := &cobra.Command{
		Use:   "patch ID",
		Short: "Change an exemption in place: its expiry or reason",
		Example: `  sluice admin exemptions patch 7 --ttl 30d
  sluice admin exemptions patch 7 --never-expire --reason "permanent partner"`,
		Args: cobra.ExactArgs(1),
	}
	pf := patch.Flags()
	pf.String("ttl", "", "expire this long from now: 30m, 1h, 7d")
	pf.String("expires-at", "", "expire at this RFC 3339 time")
	never := pf.Bool("never-expire", false, "remove the expiry")
	pf.String("reason", "", "the exemption's new reason, also the audit log's")
	ifMatch := pf.String("if-match", "", `change only if the exemption's ETag is still this (as "get" shows it)`)
	patch.RunE = o.run(func(cmd *cobra.Command, c *adminClient, args []string) error {
		var body object
		if err := bodyFromFlags(cmd, &body, "ttl", "expires-at", "reason"); err != nil {
			return err
		}
		if *never {
			body.SetRaw("expires_at", json.RawMessage("null"))
		}
		b, _ := json.Marshal(body)
		if string(b) == "{}" {
			return fmt.Errorf("nothing to change: give --ttl, --expires-at, --never-expire or --reason")
		}
		a, err := c.Do(cmd.Context(), request{Method: http.MethodPatch, Path: adminPath("exemptions", args[0]), Body: b,
			ContentType: "application/merge-patch+json", IfMatch: *ifMatch})
		if err != nil {
			return err
		}
		return o.showResource(cmd, a)
	})
	return patch
}
