package metrics_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The alerting rules and the Grafana dashboard in deploy/ name only metrics that Sluice
// defines: a renamed metric must not leave an alert that can never fire or a blank panel.
// (promtool check rules, in scripts/test.sh, checks the rules' syntax.)
func TestDashboardsNameRealMetrics(t *testing.T) {
	defined := definedMetrics(t)
	used := regexp.MustCompile(`\bsluice_[a-z0-9_]+`)
	for _, file := range []string{"../../deploy/prometheus/alerts.yaml", "../../deploy/grafana/sluice-dashboard.json"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(file, ".json") {
			var dash struct {
				Panels []struct {
					Title   string `json:"title"`
					Targets []struct {
						Expr string `json:"expr"`
					} `json:"targets"`
				} `json:"panels"`
			}
			if err := json.Unmarshal(raw, &dash); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for _, p := range dash.Panels {
				if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
					t.Errorf("%s: panel %q has no query", file, p.Title)
				}
			}
		}
		for _, name := range used.FindAllString(string(raw), -1) {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && defined[b] {
					base = b
				}
			}
			if !defined[base] {
				t.Errorf("%s uses %s, which no Sluice metric is named", file, name)
			}
		}
	}
}

// definedMetrics collects the metric names the module's Go code registers: Name: "sluice_..."
// in the client's Opts, or prometheus.NewDesc("sluice_...", ...) for a collector's own metrics
// (region's per-peer gauges).
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	def := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(sluice_[a-z0-9_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "benchmarks" || d.Name() == "deploy" || strings.HasPrefix(d.Name(), ".")) && path != "../.." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 5 {
		t.Fatalf("found only %d metric definitions: %v", len(names), names)
	}
	return names
}
