package envoyconf

import (
	"fmt"
	"strings"
	"testing"
)

// statKeyDomains hold the configurations of the reference service's own tests of
// value_to_metric and detailed_metric (test/config/config_test.go), one domain each.
const statKeyDomains = `
domain: runtime
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
---
domain: default
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
---
domain: mid
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
---
domain: plain
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
---
domain: detailed
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
---
domain: configured
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
---
domain: wild
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: action
        value: write*
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 60}
---
domain: shared
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 60}
`

// TestAppendStatKey: the stats key of a request is the reference service's, for each of its
// own cases of value_to_metric and detailed_metric, and a limit without either keeps StatKey.
func TestAppendStatKey(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{}
	for i, doc := range strings.Split(statKeyDomains, "---\n") {
		files[fmt.Sprintf("d%d.yaml", i)] = []byte(doc)
	}
	c, err := Load(files, false)
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{kv[i], kv[i+1]})
		}
		return out
	}
	tests := []struct {
		domain   string
		entries  []Entry
		want     string
		perValue bool
	}{
		{"runtime", e("route", "draw", "http_method", "GET", "subject_id", "123"), "runtime.route_draw.http_method_GET.subject_id", true},
		{"default", e("k1", "A", "k2", "foo"), "default.k1_A.k2", true},
		{"mid", e("k1", "X", "k2", "Y", "k3", "Z"), "mid.k1.k2_Y.k3", true},
		{"plain", e("k1", "X", "k2", "Y"), "plain.k1.k2", false},
		{"detailed", e("route", "draw", "http_method", "GET", "subject_id", "123"), "detailed.route_draw.http_method_GET.subject_id_123", true},
		{"configured", e("route", "api", "http_method", "GET", "subject_id", "user123"), "configured.route_api.http_method_GET.subject_id", true},
		{"wild", e("user", "alice", "action", "readfile", "resource", "documents"), "wild.user_alice.action_readfile.resource", true},
		{"wild", e("user", "bob", "action", "writelog", "resource", "disk"), "wild.user_bob.action_write*.resource", true},
		{"shared", e("path", "/files/a.txt"), "shared.path_/files/*", true},
		{"shared", e("client", "c1"), "shared.client_c1", true},
		{"shared", e("client", ""), "shared.client_", true},
	}
	for _, tc := range tests {
		m := c.Match(tc.domain, tc.entries)
		if m.Limit == nil {
			t.Errorf("%s %v: no limit matched", tc.domain, tc.entries)
			continue
		}
		if got := m.Limit.PerValueStats(); got != tc.perValue {
			t.Errorf("%s %v: PerValueStats = %v, want %v", tc.domain, tc.entries, got, tc.perValue)
		}
		if got := string(m.Limit.AppendStatKey(nil, tc.entries)); got != tc.want {
			t.Errorf("%s %v: AppendStatKey = %q, want %q", tc.domain, tc.entries, got, tc.want)
		}
	}
}
