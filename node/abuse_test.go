package node

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/abuse"
	"github.com/sluicehq/sluice/control/sqlite"
)

// parseAbuse parses the --abuse-* flags from args and the environment as serve does, and
// validates them.
func parseAbuse(args ...string) (abuseFlags, error) {
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	var a abuseFlags
	addAbuseFlags(f, &a)
	if err := f.Parse(args); err != nil {
		return a, err
	}
	if err := applyAbuseEnv(f); err != nil {
		return a, err
	}
	return a, a.validate()
}

func TestAbuseFlags(t *testing.T) {
	defaults := abuseFlags{enabled: true, cfg: abuse.DefaultConfig()}
	short := defaults
	short.cfg.Interval, short.cfg.Window, short.cfg.MinRequests = time.Second, time.Minute, 20
	fromEnv := defaults
	fromEnv.enabled, fromEnv.cfg.Threshold, fromEnv.cfg.Penalty, fromEnv.cfg.Multiplier = false, 0.9, 10*time.Minute, 0.25
	fromEnv.cfg.Interval, fromEnv.cfg.Window, fromEnv.cfg.MinRequests = 30*time.Second, 2*time.Hour, 500
	flagWins := defaults
	flagWins.cfg.Threshold = 0.7
	capped := defaults
	capped.cfg.MaxPenalties = 5
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want abuseFlags
		err  []string // what the error names
	}{
		{name: "defaults", want: defaults},
		{name: "short flags", args: []string{"--abuse-interval", "1s", "--abuse-window", "1m", "--abuse-min-requests", "20"}, want: short},
		{name: "every ABUSE_ variable", env: map[string]string{
			"ABUSE_DETECTION": "false", "ABUSE_INTERVAL": "30s", "ABUSE_WINDOW": "2h", "ABUSE_THRESHOLD": "0.9",
			"ABUSE_MIN_REQUESTS": "500", "ABUSE_MULTIPLIER": "0.25", "ABUSE_PENALTY": "10m",
		}, want: fromEnv},
		{name: "a flag wins over its variable", env: map[string]string{"ABUSE_THRESHOLD": "0.9"}, args: []string{"--abuse-threshold=0.7"}, want: flagWins},
		{name: "a variable that does not parse", env: map[string]string{"ABUSE_THRESHOLD": "most"}, err: []string{"ABUSE_THRESHOLD", "--abuse-threshold"}},
		{name: "a bad boolean variable", env: map[string]string{"ABUSE_DETECTION": "maybe"}, err: []string{"ABUSE_DETECTION", "--abuse-detection"}},
		{name: "a variable out of range", env: map[string]string{"ABUSE_MULTIPLIER": "3"}, err: []string{"--abuse-multiplier"}},
		{name: "threshold 1.5", args: []string{"--abuse-threshold=1.5"}, err: []string{"--abuse-threshold"}},
		{name: "threshold not a number", args: []string{"--abuse-threshold=high"}, err: []string{"abuse-threshold"}},
		{name: "interval 0", args: []string{"--abuse-interval=0"}, err: []string{"abuse-interval"}},
		{name: "interval below a second", args: []string{"--abuse-interval=10ms"}, err: []string{"--abuse-interval"}},
		{name: "window below a minute", args: []string{"--abuse-window=30s"}, err: []string{"--abuse-window"}},
		{name: "min requests 0", args: []string{"--abuse-min-requests=0"}, err: []string{"--abuse-min-requests"}},
		{name: "multiplier 1", args: []string{"--abuse-multiplier=1"}, err: []string{"--abuse-multiplier"}},
		{name: "penalty 40 days", args: []string{"--abuse-penalty=40d"}, err: []string{"--abuse-penalty"}},
		{name: "penalty not a duration", args: []string{"--abuse-penalty=soon"}, err: []string{"abuse-penalty"}},
		{name: "max penalties", args: []string{"--abuse-max-penalties=5"}, want: capped},
		{name: "max penalties from its variable", env: map[string]string{"SLUICE_ABUSE_MAX_PENALTIES": "5"}, want: capped},
		{name: "max penalties 0", args: []string{"--abuse-max-penalties=0"}, err: []string{"--abuse-max-penalties"}},
		{name: "max penalties variable not a number", env: map[string]string{"SLUICE_ABUSE_MAX_PENALTIES": "many"}, err: []string{"SLUICE_ABUSE_MAX_PENALTIES", "--abuse-max-penalties"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range abuseEnv {
				t.Setenv(e.env, "") // restored after the test
				os.Unsetenv(e.env)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, err := parseAbuse(tc.args...)
			if len(tc.err) > 0 {
				for _, w := range tc.err {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Errorf("error %v; want one naming %s", err, w)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestAPIOverridesCount: an override created through the admin API's store counts in
// sluice_overrides_applied_total{source="api"}; a failed one does not.
func TestAPIOverridesCount(t *testing.T) {
	st, err := sqlite.Open(t.Context(), sqlite.Path(t.TempDir()), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	ab, err := startAbuse(t.Context(), abuseFlags{cfg: abuse.DefaultConfig()}, st, "n", reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ab.Close()
	api := ab.CountOverrides(st)
	o := control.Override{Tenant: "acme", Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour), Reason: "r", Source: control.SourceAPI}
	ch := control.Change{Actor: "alice"}
	if _, err := api.CreateOverride(context.Background(), ch, o); err != nil {
		t.Fatal(err)
	}
	if _, err := api.CreateOverride(context.Background(), ch, o); err == nil { // same target: a conflict
		t.Fatal("a second override on one target")
	}
	if got := counterValue(t, reg, "sluice_overrides_applied_total", map[string]string{"type": "ban", "source": "api"}); got != 1 {
		t.Errorf("sluice_overrides_applied_total{type=ban,source=api} = %v, want 1", got)
	}
}

// counterValue reads one series of a counter from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := labels[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}
