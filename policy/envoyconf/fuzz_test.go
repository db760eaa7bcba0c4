package envoyconf

import (
	"errors"
	"strings"
	"testing"
)

func FuzzLoad(f *testing.F) {
	f.Add([]byte(matchConfig), "key2", "value9")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "k", "aXbc")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, replaces: [{name: x}]}\n"), "k", "")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, 2.5, ~, .inf, 0x1f, yes]}\n"), "k", "v")
	f.Add([]byte("domain: d\ndescriptors: [\n"), "k", "v")
	f.Add([]byte(aliasBomb), "k", "v")
	f.Add([]byte(""), "", "")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		c, err := Load(map[string][]byte{"f.yaml": data}, true)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			var le *LoadError
			if !errors.As(err, &le) || !strings.HasPrefix(le.Error(), "f.yaml:") {
				t.Fatalf("error %q is not a LoadError naming the file", err)
			}
			return
		}
		for _, d := range c.Domains() {
			entries := []Entry{{key, value}, {key, value}}
			for n := range 3 {
				m := c.Match(d, entries[:n])
				if m.Limit != nil && (m.Limit.Domain != d || m.Limit.ID == "") {
					t.Fatalf("limit %+v in domain %q", m.Limit, d)
				}
				m.CounterValues(entries[:n], func(string, string) {})
			}
			Replaced(c.Limits(d))
		}
	})
}

// FuzzParseDomain: any document either is refused with a LoadError or becomes JSON that is
// a file of the same meaning, which ParseDomain takes again unchanged.
func FuzzParseDomain(f *testing.F) {
	f.Add([]byte(matchConfig))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: 010\n    metadata: {a: [1, 2.5, ~, x]}\n    rate_limit: {unit: Second, requests_per_unit: 1_0}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - {key: k, shadow_mode: yes, rate_limit: {unlimited: true}}\n"))
	f.Add([]byte(`{"domain":"d","descriptors":[{"key":"k","value":"v*","share_threshold":true,"rate_limit":{"unit":"minute","requests_per_unit":3}}]}`))
	f.Add([]byte(aliasBomb))
	f.Fuzz(func(t *testing.T, data []byte) {
		name, doc, err := ParseDomain("body", data)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %q is not a LoadError", err)
			}
			return
		}
		a, _ := Load(map[string][]byte{"a": data}, false)
		b, err := Load(map[string][]byte{"b": doc}, false)
		if err != nil || !sameDomain(a.domains[name], b.domains[name]) {
			t.Fatalf("the JSON %s of %q loads differently: %v", doc, data, err)
		}
		name2, doc2, err := ParseDomain("body", doc)
		if err != nil || name2 != name || string(doc2) != string(doc) {
			t.Fatalf("ParseDomain of its own JSON %s: %s, %s, %v", doc, name2, doc2, err)
		}
	})
}
