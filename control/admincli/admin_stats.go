package admincli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// fleetView is what `admin stats` prints of GET /admin/v1/stats (telemetry/fleetstats.Fleet
// on the wire): the CLI reads the admin API's JSON, not the telemetry layer's types.
type fleetView struct {
	At    time.Time `json:"at"`
	P99Ms float64   `json:"p99_ms"`
	Rules []struct {
		Rule  string                                  `json:"rule"`
		Rate  struct{ Allowed, Soft, Denied float64 } `json:"rate"`
		Total struct{ Allowed, Soft, Denied int64 }   `json:"total"`
	} `json:"rules"`
	Nodes []struct {
		Node      string    `json:"node"`
		Store     string    `json:"store"`
		StoreUp   bool      `json:"store_up"`
		Breaker   string    `json:"breaker"`
		P99Ms     float64   `json:"p99_ms"`
		Decisions int64     `json:"decisions"`
		At        time.Time `json:"at"`
	} `json:"nodes"`
}

// topView is what `admin top` prints of GET /admin/v1/top.
type topView struct {
	Rules []struct {
		Rule      string `json:"rule"`
		Consumers []struct {
			Tenant   string `json:"tenant"`
			Consumer string `json:"consumer"`
			Count    int64  `json:"count"`
			Error    int64  `json:"error"`
		} `json:"consumers"`
	} `json:"rules"`
}

func statsCommand(o *adminOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Decisions per second and totals per rule over the fleet, and each node's store, breaker and p99",
		Example: `  sluice admin stats
  sluice admin stats -o json`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			a, err := c.Get(cmd.Context(), adminPath("stats"), nil)
			if err != nil {
				return err
			}
			if o.jsonOut() {
				return writeRaw(out(cmd), a.Body)
			}
			var f fleetView
			if err := json.Unmarshal(a.Body, &f); err != nil {
				return fmt.Errorf("read the answer: %w", err)
			}
			w := out(cmd)
			fmt.Fprintf(w, "at      %s\np99_ms  %s\n\n", f.At.UTC().Format("2006-01-02T15:04:05Z"), ftoa(f.P99Ms))
			rows := [][]string{{"RULE", "ALLOWED/S", "SOFT/S", "DENIED/S", "ALLOWED", "SOFT", "DENIED"}}
			for _, r := range f.Rules {
				rows = append(rows, []string{sanitize(r.Rule), ftoa(r.Rate.Allowed), ftoa(r.Rate.Soft), ftoa(r.Rate.Denied),
					itoa(r.Total.Allowed), itoa(r.Total.Soft), itoa(r.Total.Denied)})
			}
			if err := writeTable(w, rows); err != nil {
				return err
			}
			fmt.Fprintln(w)
			rows = [][]string{{"NODE", "STORE", "STORE_UP", "BREAKER", "P99_MS", "DECISIONS", "AT"}}
			for _, n := range f.Nodes {
				rows = append(rows, []string{sanitize(n.Node), sanitize(n.Store), strconv.FormatBool(n.StoreUp), sanitize(n.Breaker),
					ftoa(n.P99Ms), itoa(n.Decisions), n.At.UTC().Format("2006-01-02T15:04:05Z")})
			}
			return writeTable(w, rows)
		}),
	}
}

func topCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Each rule's heaviest consumers over the last minute, fleet-wide",
		Long: `Each rule's heaviest consumers over the last minute, merged from every node's bounded
summary. COUNT is at most what the consumer sent, COUNT-ERROR at least.`,
		Example: `  sluice admin top
  sluice admin top --rule api-writes --limit 20`,
		Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, nil, "rule", "limit")
			a, err := c.Get(cmd.Context(), adminPath("top"), q)
			if err != nil {
				return err
			}
			if o.jsonOut() {
				return writeRaw(out(cmd), a.Body)
			}
			var top topView
			if err := json.Unmarshal(a.Body, &top); err != nil {
				return fmt.Errorf("read the answer: %w", err)
			}
			rows := [][]string{{"RULE", "TENANT", "CONSUMER", "COUNT", "ERROR"}}
			for _, r := range top.Rules {
				for _, c := range r.Consumers {
					rows = append(rows, []string{sanitize(r.Rule), sanitize(c.Tenant), sanitize(c.Consumer), itoa(c.Count), itoa(c.Error)})
				}
			}
			return writeTable(out(cmd), rows)
		}),
	}
	f := cmd.Flags()
	f.String("rule", "", "only this rule")
	f.Int("limit", 0, "at most this many consumers per rule (server default 10, at most 100)")
	return cmd
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
