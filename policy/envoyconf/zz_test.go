package envoyconf

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestZZSlow(t *testing.T) {
	files, _ := filepath.Glob("/tmp/slow-*.bin")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		start := time.Now()
		var n yaml.Node
		err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&n)
		t.Logf("yaml: %v %v", time.Since(start), err)
		start = time.Now()
		_, err = Load(map[string][]byte{"f.yaml": b}, true)
		t.Logf("load: %v %v", time.Since(start), err)
	}
}
