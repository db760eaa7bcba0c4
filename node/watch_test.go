package node

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// TestPolicyEvent: which names in the watched folder may change the policy.
func TestPolicyEvent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte("rules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name            string
		config, changed string
		want            bool
	}{
		{"a YAML file of the folder", dir, filepath.Join(dir, "limits.yaml"), true},
		{"a .yml file of the folder", dir, filepath.Join(dir, "limits.yml"), true},
		{"another file of the folder", dir, filepath.Join(dir, "README.md"), false},
		{"an editor's swap file", dir, filepath.Join(dir, ".limits.yaml.swp"), false},
		{"ConfigMap swap, folder config", dir, filepath.Join(dir, "..data"), true},
		{"ConfigMap swap, file config", file, filepath.Join(dir, "..data"), true},
		{"ConfigMap's new timestamped folder", dir, filepath.Join(dir, "..2026_11_23_08_00_00.000000001"), false},
		{"ConfigMap's temporary link", dir, filepath.Join(dir, "..data_tmp"), false},
		{"the file config itself", file, file, true},
		{"a neighbour of the file config", file, filepath.Join(dir, "other.yaml"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := policyEvent(tc.config, tc.changed); got != tc.want {
				t.Errorf("policyEvent(%q, %q) = %v, want %v", tc.config, tc.changed, got, tc.want)
			}
		})
	}
}

// TestConfigMapUpdateIsSeen updates a folder the way the kubelet updates a ConfigMap volume
// (see configMapData) under a real fsnotify watcher of it, as serve's watcher does: some event
// of the update is a policy event, for a --config naming the folder and for one naming a file
// in it, and the policy read afterwards is the new one.
func TestConfigMapUpdateIsSeen(t *testing.T) {
	t.Parallel()
	for _, asFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("file=%v", asFile), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			v1 := "rules:\n  - {name: a, key: [user], algorithm: gcra, limit: 1, period: 1s}\n"
			v2 := "rules:\n  - {name: a, key: [user], algorithm: gcra, limit: 2, period: 1s}\n"
			atomicWrite(t, dir, map[string]string{"policy.yaml": v1})
			config := dir
			if asFile {
				config = filepath.Join(dir, "policy.yaml")
			}
			before, err := loadFiles(config)
			if err != nil {
				t.Fatal(err)
			}

			w, err := fsnotify.NewWatcher()
			if err != nil {
				t.Skipf("no fsnotify here: %v", err)
			}
			defer w.Close()
			if err := w.Add(dir); err != nil {
				t.Fatal(err)
			}
			atomicWrite(t, dir, map[string]string{"policy.yaml": v2})

			var seen []string
			deadline := time.After(10 * time.Second)
			for {
				select {
				case ev := <-w.Events:
					seen = append(seen, ev.String())
					if !policyEvent(config, ev.Name) {
						continue
					}
					after, err := loadFiles(config)
					if err != nil {
						t.Fatal(err)
					}
					if after.Version == before.Version {
						t.Fatalf("the policy read after %v is still the old one", ev)
					}
					return
				case err := <-w.Errors:
					t.Fatal(err)
				case <-deadline:
					t.Fatalf("no policy event among %q", seen)
				}
			}
		})
	}
}

var atomicWrites atomic.Int64

// atomicWrite writes files into dir as the kubelet's atomic writer does for a ConfigMap
// volume: a new timestamped folder, a ..data_tmp symlink to it renamed over ..data, a visible
// symlink per file through ..data, and the previous folder removed.
func atomicWrite(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	old, _ := os.Readlink(filepath.Join(dir, configMapData))
	ts := fmt.Sprintf("..2026_11_23_08_00_00.%09d", atomicWrites.Add(1))
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, configMapData)); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join(configMapData, name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}
