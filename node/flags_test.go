package node

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestServeFlagsHaveVariables: serve's help says every flag can be set by the variable named
// at the end of its help, so each one names one (issue 30 found six without), and the six
// that ReadEnv applies do set their flag, lose to the command line, and refuse a bad value
// naming the variable.
func TestServeFlagsHaveVariables(t *testing.T) {
	cmd := &cobra.Command{Use: "serve"}
	var c Config
	c.RegisterFlags(cmd)
	named := regexp.MustCompile(`\(([A-Z][A-Z0-9_]+)(=true)?\)$`)
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !named.MatchString(f.Usage) {
			t.Errorf("--%s: its help ends with no (VARIABLE): %q", f.Name, f.Usage)
		}
	})
	for name, env := range flagEnv {
		if f := cmd.Flags().Lookup(name); f == nil || !strings.HasSuffix(f.Usage, "("+env+")") && !strings.HasSuffix(f.Usage, "("+env+"=true)") {
			t.Errorf("--%s: its help does not name %s", name, env)
		}
	}

	t.Setenv("SLUICE_GC_PERCENT", "150")
	t.Setenv("SLUICE_GRPC_WORKERS", "8")
	t.Setenv("SLUICE_HOT_KEY_OVERAGE", "0.1")
	t.Setenv("SLUICE_MAX_BODY", "1024")
	t.Setenv("SLUICE_PPROF", "true")
	t.Setenv("SLUICE_SNAPSHOT_INTERVAL", "5s")
	c = testConfig(t, "--max-body", "2048")
	if c.gcPercent != 150 || c.grpcWorkers != 8 || c.hotKeyOverage != 0.1 || !c.pprof || c.snapshotInterval != 5*time.Second {
		t.Errorf("from the environment: gc %d, workers %d, overage %v, pprof %v, snapshot %v", c.gcPercent, c.grpcWorkers, c.hotKeyOverage, c.pprof, c.snapshotInterval)
	}
	if c.maxBody != 2048 {
		t.Errorf("--max-body 2048 beside SLUICE_MAX_BODY=1024: %d, want the flag's", c.maxBody)
	}

	t.Setenv("SLUICE_SNAPSHOT_INTERVAL", "soon")
	cmd = &cobra.Command{Use: "serve"}
	c = Config{}
	c.RegisterFlags(cmd)
	if err := cmd.Flags().Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := c.ReadEnv(cmd.Flags()); err == nil || !strings.HasPrefix(err.Error(), `SLUICE_SNAPSHOT_INTERVAL (--snapshot-interval): invalid value "soon"`) {
		t.Errorf("a bad SLUICE_SNAPSHOT_INTERVAL: %v", err)
	}
}

// TestServeHelpGroupsEveryFlag: serve's help lists its flags by concern, every flag in
// exactly one group, and no group names a flag serve lacks.
func TestServeHelpGroupsEveryFlag(t *testing.T) {
	t.Parallel()
	cmd := &cobra.Command{Use: "serve"}
	var c Config
	c.RegisterFlags(cmd)
	in := map[string]int{}
	for _, g := range flagGroups {
		for _, n := range g.flags {
			in[n]++
			if cmd.Flags().Lookup(n) == nil {
				t.Errorf("group %q names --%s, which serve lacks", g.title, n)
			}
		}
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if in[f.Name] != 1 {
			t.Errorf("--%s is in %d groups, want 1", f.Name, in[f.Name])
		}
	})
	var b strings.Builder
	cmd.SetOut(&b)
	if err := cmd.Usage(); err != nil {
		t.Fatal(err)
	}
	help := b.String()
	var titles []int
	for _, g := range flagGroups {
		i := strings.Index(help, "\n"+g.title+":\n")
		if i < 0 {
			t.Fatalf("the help lacks the group %q:\n%s", g.title, help)
		}
		titles = append(titles, i)
	}
	if !slices.IsSorted(titles) {
		t.Errorf("groups out of order:\n%s", help)
	}
	if i, j := strings.Index(help, "--http "), strings.Index(help, "--abuse-detection "); i < 0 || j < 0 || i > j {
		t.Errorf("--http should come before --abuse-detection (by concern, not alphabetically):\n%s", help)
	}
}
