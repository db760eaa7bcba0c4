package key

import (
	"bytes"
	"strings"
	"testing"
)

func build(rule, version string, tagged bool, tenant, identity string, parts ...string) []byte {
	k := AppendHead(nil, rule, version)
	if tagged {
		k = AppendValue(k, tenant)
		k = AppendTag(k, 'u', identity)
	}
	for _, p := range parts {
		k = AppendValue(k, p)
	}
	return k
}

func TestKeysDoNotCollide(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		a, b []string
	}{
		{"separator moves between parts", []string{"a:b", "c"}, []string{"a", "b:c"}},
		{"escape character", []string{`a\`, "c"}, []string{"a", `\c`}},
		{"escaped separator spelled out", []string{`a\c`}, []string{"a:"}},
		{"empty parts", []string{"", "ab"}, []string{"a", "b"}},
		{"hash marker", []string{"#" + strings.Repeat("0", 32)}, []string{strings.Repeat("x", 200)}},
		{"long values differing at the end", []string{strings.Repeat("x", 200) + "1"}, []string{strings.Repeat("x", 200) + "2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ka, kb := build("r", "1", false, "", "", c.a...), build("r", "1", false, "", "", c.b...)
			if bytes.Equal(ka, kb) {
				t.Fatalf("%q and %q both give key %q", c.a, c.b, ka)
			}
		})
	}
}

func TestHashTag(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		key  []byte
		want string
	}{
		{"caller key", build("per-user", "1", true, "acme", "john", "acme", "john"), "u=john"},
		{"braces in values cannot forge a tag", build("per-user", "1", true, "a{b}", "{x}", "{y}"), `u=\ox\x`},
		{"global key has no tag", build("global", "1", false, "", ""), "sl:global:1"},
		{"empty braces are no tag", []byte("a{}b"), "a{}b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := string(HashTag(c.key)); got != c.want {
				t.Errorf("HashTag(%q) = %q, want %q", c.key, got, c.want)
			}
		})
	}
}

func TestKeyLengthIsBounded(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat(":{#}", 100_000)
	k := build(huge, huge, true, huge, huge, huge, huge)
	if len(k) > 6*(MaxPart+8) {
		t.Fatalf("key of %d bytes from huge values", len(k))
	}
}

// FuzzKeysInjective checks that different attribute tuples never share a key and that keys
// stay bounded, whatever bytes the values hold.
func FuzzKeysInjective(f *testing.F) {
	f.Add("r", "a:b", "c", "a", "b:c")
	f.Add("r", `a\`, "c", "a", `\c`)
	f.Add("r{", "}", "#", "", "")
	f.Add("x", strings.Repeat("z", 97), "", strings.Repeat("z", 96), "z")
	f.Fuzz(func(t *testing.T, rule, a1, a2, b1, b2 string) {
		ka := build(rule, "1", true, a1, a2, a1, a2)
		kb := build(rule, "1", true, b1, b2, b1, b2)
		if (a1 != b1 || a2 != b2) && bytes.Equal(ka, kb) {
			t.Fatalf("(%q, %q) and (%q, %q) share key %q", a1, a2, b1, b2, ka)
		}
		if (a1 == b1 && a2 == b2) && !bytes.Equal(ka, kb) {
			t.Fatalf("one tuple gave two keys %q and %q", ka, kb)
		}
		if tag := HashTag(ka); bytes.Count(tag, []byte("{")) != 0 || bytes.Count(tag, []byte("}")) != 0 {
			t.Fatalf("tag %q of %q holds a brace", tag, ka)
		}
		if len(ka) > 3+6*(2*MaxPart+4) {
			t.Fatalf("key of %d bytes", len(ka))
		}
	})
}
