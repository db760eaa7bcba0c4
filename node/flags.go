package node

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagEnv names the variables of the flags registered with a plain default: applyFlagEnv
// sets each through the flag's own parser once the command line is read, so that a bad
// value stops serve naming the variable instead of being ignored, and a flag given on the
// command line wins.
var flagEnv = map[string]string{
	"gc-percent":        "SLUICE_GC_PERCENT",
	"grpc-workers":      "SLUICE_GRPC_WORKERS",
	"hot-key-overage":   "SLUICE_HOT_KEY_OVERAGE",
	"max-body":          "SLUICE_MAX_BODY",
	"pprof":             "SLUICE_PPROF",
	"snapshot-interval": "SLUICE_SNAPSHOT_INTERVAL",
}

// applyFlagEnv sets the flags of flagEnv not given on the command line from their variables.
func applyFlagEnv(flags *pflag.FlagSet) error {
	for name, env := range flagEnv {
		v, ok := os.LookupEnv(env)
		if !ok {
			continue
		}
		f := flags.Lookup(name)
		if f == nil || f.Changed {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			return fmt.Errorf("%s (--%s): invalid value %q: %w", env, name, v, err)
		}
	}
	return nil
}

// flagGroups orders serve's flags by concern in its help, which pflag would list
// alphabetically in one block of 50-odd lines. Every flag is in exactly one group
// (TestServeHelpGroupsEveryFlag).
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Listeners and requests", []string{"http", "admin-http", "grpc", "grpc-reflection", "tls-cert", "tls-key", "tls-client-ca", "max-body", "max-inflight", "grpc-workers"}},
	{"Policy", []string{"config", "shadow", "envoy-attributes"}},
	{"Envoy domains from xDS", []string{"envoy-xds", "envoy-xds-node-id", "envoy-xds-node-metadata", "envoy-xds-retry", "envoy-xds-retry-max", "envoy-xds-tls", "envoy-xds-ca", "envoy-xds-cert", "envoy-xds-key", "envoy-xds-san", "envoy-xds-headers", "envoy-xds-max-message", "envoy-xds-force-start"}},
	{"Stores", []string{"store", "data-dir", "snapshot-interval", "store-timeout", "store-timeout-max", "allowances", "hot-keys", "hot-key-threshold", "hot-key-overage", "fleet-size"}},
	{"Control plane", []string{"control", "admin-token-file", "trusted-proxies", "wait-timeout", "node-id", "audit-retention", "violations-retention", "events-flush", "events-queue"}},
	{"Abuse detection", []string{"abuse-detection", "abuse-interval", "abuse-window", "abuse-threshold", "abuse-min-requests", "abuse-multiplier", "abuse-penalty", "abuse-max-penalties"}},
	{"Regions", []string{"region", "regions", "region-sync", "region-timeout", "region-ca", "region-token-file"}},
	{"Logs, metrics and traces", []string{"log-level", "log-format", "statsd", "statsd-prefix", "statsd-tags", "otlp-endpoint", "otlp-insecure", "otlp-ca", "otlp-cert", "otlp-key", "trace-sample-ratio", "pprof"}},
	{"Go runtime", []string{"memory-limit", "gc-percent"}},
}

// groupedUsage writes serve's usage with its flags under flagGroups' titles; a flag missing
// from them is listed under "Other", never dropped.
func groupedUsage(cmd *cobra.Command) error {
	w := cmd.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s [flags]\n", cmd.CommandPath())
	all := cmd.Flags()
	seen := map[string]bool{}
	section := func(title string, names []string) {
		fs := pflag.NewFlagSet(title, pflag.ContinueOnError)
		for _, n := range names {
			if f := all.Lookup(n); f != nil {
				fs.AddFlag(f)
				seen[n] = true
			}
		}
		if fs.HasFlags() {
			fs.SortFlags = false
			fmt.Fprintf(w, "\n%s:\n%s", title, fs.FlagUsages())
		}
	}
	for _, g := range flagGroups {
		section(g.title, g.flags)
	}
	var rest []string
	all.VisitAll(func(f *pflag.Flag) {
		if !seen[f.Name] {
			rest = append(rest, f.Name)
		}
	})
	section("Other", rest)
	_, err := io.WriteString(w, "\n"+strings.TrimSpace(envNote)+"\n")
	return err
}

const envNote = `
Each flag's variable is named at the end of its help; a flag on the command line wins over it.`
