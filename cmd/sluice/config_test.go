package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigValidateReportsEveryMistake runs `sluice config validate` on a native file with
// several mistakes: each is one line, file:line: field: message, on the field's own line.
func TestConfigValidateReportsEveryMistake(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	yml := `rules:
  - name: a
    limit: 10
    period: 1ns
    burst: 9223372036854775807
  - name: b
    limit: 5
    perod: 1s
    tiers:
      free: {limit: 0}
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := configCommand()
	cmd.SilenceErrors, cmd.SilenceUsage = true, true // as the root command is
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"validate", path})
	if err := cmd.Execute(); err == nil {
		t.Fatalf("validate accepted the file: %s", stdout.String())
	}
	want := []string{
		path + ":4: rules[0].period: must be from 1ms",
		path + ":5: rules[0].burst: must be from 1 to 1099511627776",
		path + ":6: rules[1].period: required",
		path + ":8: rules[1].perod: unknown field",
		path + ":10: rules[1].tiers.free.limit: must be from 1",
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), stderr.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q\n        want %q...", i, lines[i], w)
		}
	}
}
