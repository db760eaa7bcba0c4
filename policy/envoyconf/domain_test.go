package envoyconf

import (
	"errors"
	"strings"
	"testing"
)

func TestParseDomain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     string // the JSON; "" when an error is wanted
		field    string // the error's field
	}{
		{name: "YAML", in: "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
			want: `{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`},
		{name: "JSON stays as written, compacted", in: `{"domain": "edge", "descriptors": [{"key": "k", "value": "v*", "share_threshold": true, "rate_limit": {"unlimited": true}}]}`,
			want: `{"domain":"edge","descriptors":[{"key":"k","value":"v*","share_threshold":true,"rate_limit":{"unlimited":true}}]}`},
		{name: "numbers and quoted text keep their text", in: "domain: d\ndescriptors:\n  - key: k\n    value: 010\n  - key: k\n    value: '10'\n  - key: k\n    value: .5\n  - key: k\n    value: 1.0\n",
			want: `{"domain":"d","descriptors":[{"key":"k","value":"010"},{"key":"k","value":"10"},{"key":"k","value":".5"},{"key":"k","value":1.0}]}`},
		{name: "aliases are expanded", in: "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: minute, requests_per_unit: 5}\n  - key: b\n    rate_limit: *rl\n",
			want: `{"domain":"d","descriptors":[{"key":"a","rate_limit":{"unit":"minute","requests_per_unit":5}},{"key":"b","rate_limit":{"unit":"minute","requests_per_unit":5}}]}`},
		{name: "metadata and nulls", in: "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, x, null, true]}\n    rate_limit: ~\n",
			want: `{"domain":"d","descriptors":[{"key":"k","metadata":{"a":[1,"x",null,true]},"rate_limit":null}]}`},
		{name: "a YAML 1.1 boolean has no JSON spelling", in: "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    rate_limit: {unit: second, requests_per_unit: 1}\n", field: "document"},
		{name: "a hexadecimal number has none either", in: "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0x10}\n", field: "document"},
		{name: "a bad unit, named", in: `{"domain":"d","descriptors":[{"key":"k","rate_limit":{"unit":"fortnight","requests_per_unit":1}}]}`, field: "descriptors[0].rate_limit.unit"},
		{name: "an unknown field, named", in: `{"domain":"d","descriptor":[]}`, field: "descriptor"},
		{name: "no domain", in: `{"descriptors":[]}`, field: "domain"},
		{name: "a duplicate descriptor", in: `{"domain":"d","descriptors":[{"key":"k"},{"key":"k"}]}`, field: "descriptors[1]"},
		{name: "duplicate JSON names", in: `{"domain":"d","domain":"e"}`, field: "domain"},
		{name: "empty", in: ``, field: "domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name, got, err := ParseDomain("body", []byte(tc.in))
			if tc.want != "" {
				if err != nil || string(got) != tc.want {
					t.Fatalf("ParseDomain = %s, %v\nwant %s", got, err, tc.want)
				}
				if !strings.HasPrefix(tc.want, `{"domain":"`+name+`"`) {
					t.Errorf("name = %q", name)
				}
				// The JSON is a file of the same meaning.
				a, _ := Load(map[string][]byte{"a": []byte(tc.in)}, false)
				b, err := Load(map[string][]byte{"b": got}, false)
				if err != nil || !sameDomain(a.domains[name], b.domains[name]) {
					t.Errorf("the JSON loads differently: %v", err)
				}
				return
			}
			var le *LoadError
			if !errors.As(err, &le) || le.Field != tc.field {
				t.Fatalf("ParseDomain = %s, %v; want a LoadError for %s", got, err, tc.field)
			}
		})
	}
}

func TestWithDomains(t *testing.T) {
	t.Parallel()
	load := func(name, doc string) *Config {
		c, err := Load(map[string][]byte{name: []byte(doc)}, false)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	files := load("f.yaml", "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	api := load("api", `{"domain":"edge","descriptors":[{"key":"k","rate_limit":{"unit":"second","requests_per_unit":99}}]}`)
	other := load("api2", `{"domain":"api","descriptors":[{"key":"k","rate_limit":{"unit":"minute","requests_per_unit":7}}]}`)
	c := files.WithDomains(api, other)
	if got := strings.Join(c.Domains(), ","); got != "api,edge" {
		t.Errorf("Domains = %s, want api,edge", got)
	}
	if m := c.Match("edge", []Entry{{"k", "v"}}); m.Limit == nil || m.Limit.RequestsPerUnit != 1 {
		t.Errorf("edge matches %+v; want the file's limit of 1, which comes first", m.Limit)
	}
	if m := c.Match("api", []Entry{{"k", "v"}}); m.Limit == nil || m.Limit.RequestsPerUnit != 7 {
		t.Errorf("api matches %+v; want 7", m.Limit)
	}
	if got := (*Config)(nil).WithDomains(other).Domains(); len(got) != 1 {
		t.Errorf("nil.WithDomains = %v", got)
	}
	if len(files.Domains()) != 1 || len(api.Domains()) != 1 {
		t.Error("WithDomains changed its inputs")
	}
}
