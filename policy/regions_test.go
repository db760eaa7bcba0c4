package policy

import (
	"strings"
	"testing"
)

func TestRegionsField(t *testing.T) {
	t.Parallel()
	const head = "rules:\n  - {name: quota, limit: 100, period: 1m, "
	cases := []struct {
		name, yml string
		mode      RegionMode
		home      string
		err       string
	}{
		{"absent is per region", head + "algorithm: fixed_window}\n", RegionLocal, "", ""},
		{"global fixed window", head + "algorithm: fixed_window, regions: global}\n", RegionGlobal, "", ""},
		{"global sliding window counter", head + "algorithm: sliding_window_counter, regions: global}\n", RegionGlobal, "", ""},
		{"home", head + "algorithm: token_bucket, regions: \"home:eu-west-1\"}\n", RegionHome, "eu-west-1", ""},
		{"global token bucket", head + "algorithm: token_bucket, regions: global}\n", 0, "", `rules[0].regions: rule "quota": global needs a window algorithm (fixed_window or sliding_window_counter), not token_bucket`},
		{"global default algorithm", head + "regions: global}\n", 0, "", `rules[0].regions: rule "quota": global needs a window algorithm`},
		{"global sliding log", head + "algorithm: sliding_window_log, regions: global}\n", 0, "", "not sliding_window_log"},
		{"home without a name", head + "regions: \"home:\"}\n", 0, "", `rules[0].regions: rule "quota": home:NAME: empty region name`},
		{"home with a bad name", head + "regions: \"home:a b\"}\n", 0, "", `rules[0].regions: rule "quota": home:NAME: region name "a b" holds a character`},
		{"unknown mode", head + "regions: everywhere}\n", 0, "", `rules[0].regions: rule "quota": "everywhere" is not global or home:NAME`},
		{"wrong case", head + "algorithm: fixed_window, regions: Global}\n", 0, "", `"Global" is not global or home:NAME`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			snap, err := LoadFiles(map[string][]byte{"policy.yaml": []byte(c.yml)})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want it to contain %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mode, home := snap.Rule("quota").Regions()
			if mode != c.mode || home != c.home {
				t.Fatalf("Regions() = %d %q, want %d %q", mode, home, c.mode, c.home)
			}
			if n := len(snap.RegionRules()); (n == 1) != (c.mode != RegionLocal) {
				t.Fatalf("RegionRules() holds %d rules for mode %d", n, c.mode)
			}
		})
	}
}
