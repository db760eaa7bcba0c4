package adminapi

import (
	"encoding/json"
	"testing"
)

// FuzzMergePatch: whatever target and patch, applying never panics, and what it gives is one
// JSON object in which no member the patch set to null remains.
func FuzzMergePatch(f *testing.F) {
	f.Add(`{"a":1,"b":{"c":2}}`, `{"b":{"c":null,"d":[1]},"e":"x"}`)
	f.Add(`{"limit":9007199254740993}`, `{"limit":null}`)
	f.Add(`{}`, `{"a":{"b":{"c":{}}}}`)
	f.Add(`{"a":"x"}`, `{"a":{"b":null}}`)
	f.Fuzz(func(t *testing.T, target, patch string) {
		tm, err := readObject([]byte(target))
		if err != nil {
			return
		}
		pm, err := readObject([]byte(patch))
		if err != nil {
			return
		}
		out, err := mergePatch(tm, pm)
		if err != nil {
			return
		}
		b := writeObject(out)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("merged %s into %s: %s is not a JSON object: %v", patch, target, b, err)
		}
		for _, m := range pm {
			if m.value.Kind() == 'n' {
				if _, ok := v[m.name]; ok {
					t.Fatalf("member %q set to null remains: %s", m.name, b)
				}
			}
		}
	})
}

func TestMergePatchKeepsNumbersAndOrder(t *testing.T) {
	tm, _ := readObject([]byte(`{"name":"r","limit":9007199254740993,"period":"1m"}`))
	pm, _ := readObject([]byte(`{"burst":9007199254740995,"period":"1h"}`))
	out, err := mergePatch(tm, pm)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(writeObject(out)), `{"name":"r","limit":9007199254740993,"period":"1h","burst":9007199254740995}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
