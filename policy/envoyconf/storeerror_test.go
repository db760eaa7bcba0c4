package envoyconf

import (
	"strings"
	"testing"
)

// TestOnStoreError: the extension field is read on a domain and on descriptors, inherited by
// the descriptors nested below, and a bad value is an error naming the field and its line.
func TestOnStoreError(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"e.yaml": `
domain: e
on_store_error: closed
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    on_store_error: local
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: d
        on_store_error: open
        rate_limit: {unit: second, requests_per_unit: 1}
`, "p.yaml": `
domain: p
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
`}, false)
	cases := []struct {
		domain  string
		entries []Entry
		want    StoreErrorMode
	}{
		{"e", []Entry{{"a", "1"}}, FailClosed},
		{"e", []Entry{{"b", "1"}}, FailLocal},
		{"e", []Entry{{"b", "1"}, {"c", "1"}}, FailLocal},
		{"e", []Entry{{"b", "1"}, {"d", "1"}}, FailOpen},
		{"p", []Entry{{"a", "1"}}, FailOpen},
	}
	for _, tc := range cases {
		m := c.Match(tc.domain, tc.entries)
		if m.Limit == nil || m.Limit.OnStoreError != tc.want {
			t.Errorf("%s %v: limit %+v, want on_store_error %s", tc.domain, tc.entries, m.Limit, tc.want)
		}
		if got := c.StoreErrorMode(tc.domain, tc.entries); got != tc.want {
			t.Errorf("StoreErrorMode(%s, %v) = %s, want %s", tc.domain, tc.entries, got, tc.want)
		}
	}
	// Where no node matches (a per-request override of an unknown key), the domain's mode.
	for domain, want := range map[string]StoreErrorMode{"e": FailClosed, "p": FailOpen, "unknown": FailOpen} {
		if got := c.StoreErrorMode(domain, []Entry{{"zzz", "1"}}); got != want {
			t.Errorf("StoreErrorMode(%s, unmatched) = %s, want %s", domain, got, want)
		}
	}

	_, err := Load(map[string][]byte{"bad.yaml": []byte("domain: x\non_store_error: later\ndescriptors:\n  - key: k\n    on_store_error: [open]\n")}, false)
	for _, want := range []string{
		`bad.yaml:2: on_store_error: "later" is not open, closed or local`,
		`bad.yaml:5: descriptors[0].on_store_error: must be a string`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
}
