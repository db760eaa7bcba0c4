package policy

import (
	"strings"
	"testing"
)

// TestMergeDomains: one Envoy domain in two files is an error naming both, unless MergeDomains
// is given; then both files' descriptors apply, and a descriptor defined in both is still an
// error.
func TestMergeDomains(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{
		"a.yaml": []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"),
		"b.yaml": []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n"),
	}
	if _, err := ParseFiles(files); err == nil || !strings.Contains(err.Error(), "edge") {
		t.Fatalf("without merging: err = %v, want the domain named", err)
	}
	f, err := ParseFiles(files, MergeDomains())
	if err != nil {
		t.Fatal(err)
	}
	limits := f.Snapshot().Envoy().Limits("edge")
	if len(limits) != 2 {
		t.Fatalf("merged domain has %d limits, want 2 (one from each file)", len(limits))
	}
	files["c.yaml"] = []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	if _, err := ParseFiles(files, MergeDomains()); err == nil || !strings.Contains(err.Error(), "already defined") {
		t.Fatalf("a descriptor in two merged files: err = %v", err)
	}
}
