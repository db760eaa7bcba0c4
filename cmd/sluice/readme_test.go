package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/policy"
)

// The README says what the binary does: every flag of serve is in its table and every flag in
// the table exists, and the rules and domains its examples name exist where it says they do.
func TestReadmeMatchesTheBinary(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("flag table", func(t *testing.T) {
		documented := map[string]bool{}
		for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllSubmatch(readme, -1) {
			documented[string(m[1])] = true
		}
		// Rows may list related flags together: "| `--hot-keys`, `--hot-key-threshold` ...".
		for _, m := range regexp.MustCompile("(?m)^\\|[^|\\n]*").FindAll(readme, -1) {
			for _, f := range regexp.MustCompile("`--([a-z0-9-]+)`").FindAllSubmatch(m, -1) {
				documented[string(f[1])] = true
			}
		}
		var flags []string
		serveCommand().Flags().VisitAll(func(f *pflag.Flag) { flags = append(flags, f.Name) })
		for _, name := range flags {
			if !documented[name] {
				t.Errorf("serve --%s is missing from the README's flag table", name)
			}
		}
		for name := range documented {
			if !slices.Contains(flags, name) {
				t.Errorf("the README's flag table lists --%s, which serve does not have", name)
			}
		}
	})
	t.Run("make test names what install-deps installs", func(t *testing.T) {
		script, err := os.ReadFile("../../scripts/install-deps.sh")
		if err != nil {
			t.Fatal(err)
		}
		var pkgs []string
		for _, m := range regexp.MustCompile(`need\+=\(([^)]*)\)`).FindAllSubmatch(script, -1) {
			pkgs = append(pkgs, strings.Fields(string(m[1]))...)
		}
		if len(pkgs) < 5 {
			t.Fatalf("found %v in install-deps.sh: the pattern is broken", pkgs)
		}
		// The paragraph itself, not the whole README: curl or prometheus named in another
		// section would not tell a reader of `make test` what it installs.
		_, para, ok := strings.Cut(string(readme), "\nRun the whole test suite with `make test`")
		para, _, _ = strings.Cut(para, "\n\n")
		if !ok {
			t.Fatal("the README has no paragraph starting \"Run the whole test suite with `make test`\"")
		}
		for _, p := range pkgs {
			if !strings.Contains(para, "`"+p+"`") {
				t.Errorf("install-deps.sh installs %s, which the README's make test paragraph does not name", p)
			}
		}
		if !regexp.MustCompile(`about \d+ minutes on \d+ cores`).MatchString(strings.ReplaceAll(para, "\n", " ")) {
			t.Errorf("the README's make test paragraph does not say how long it takes:\n%s", para)
		}
	})
	t.Run("example rules exist in the built-in policy", func(t *testing.T) {
		files, err := policy.ParseFiles(map[string][]byte{"built-in": node.DefaultPolicy})
		if err != nil {
			t.Fatal(err)
		}
		snap := files.Snapshot()
		for _, m := range regexp.MustCompile(`"rule":"([^"]+)"`).FindAllSubmatch(readme, -1) {
			if snap.Rule(string(m[1])) == nil {
				t.Errorf("the README's example names rule %q, which the built-in policy lacks", m[1])
			}
		}
	})
	t.Run("example domains exist in examples/envoy", func(t *testing.T) {
		snap, err := policy.Load("../../examples/envoy")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"domain":"([^"]+)"`).FindAllSubmatch(readme, -1) {
			if !slices.Contains(snap.Envoy().Domains(), string(m[1])) {
				t.Errorf("the README's example names domain %q, which examples/envoy lacks", m[1])
			}
		}
	})
}
