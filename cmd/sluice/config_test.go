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

// TestConfigValidateMessages: a limit or period written as 0 is out of range, not "required"
// (only a missing one is), and the summary of a valid file counts in the singular when it
// should (issue 30).
func TestConfigValidateMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := func(yml string) (stdout, stderr string, err error) {
		path := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := configCommand()
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		var o, e bytes.Buffer
		cmd.SetOut(&o)
		cmd.SetErr(&e)
		cmd.SetArgs([]string{"validate", path})
		err = cmd.Execute()
		return strings.ReplaceAll(o.String(), path, "P"), strings.ReplaceAll(e.String(), path, "P"), err
	}
	_, stderr, err := run(`rules:
  - {name: zero, key: [user], algorithm: fixed_window, limit: 0, period: 0s}
  - {name: missing, key: [user], algorithm: fixed_window}
`)
	if err == nil {
		t.Fatal("validate accepted limit: 0")
	}
	for _, want := range []string{
		"P:2: rules[0].limit: must be from 1 to 1099511627776, got 0\n",
		"P:2: rules[0].period: must be from 1ms to 400d (e.g. 1s, 1m, 1h, 1d), got 0s\n",
		"P:3: rules[1].limit: required: a whole number from 1 to 1099511627776\n",
		"P:3: rules[1].period: required (e.g. 1s, 1m, 1h, 1d)\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	stdout, _, err := run("rules:\n  - {name: one, key: [user], algorithm: fixed_window, limit: 1, period: 1m}\n")
	if err != nil || !strings.HasPrefix(stdout, "P: ok (1 rule, 0 Envoy domains, version ") {
		t.Errorf("valid file: %v, stdout %q; want \"P: ok (1 rule, 0 Envoy domains, ...\"", err, stdout)
	}
}
