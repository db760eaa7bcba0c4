package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCgroup lays out /proc/self/cgroup and /sys/fs/cgroup in a temporary folder: files maps a
// path under the cgroup root to its content.
func fakeCgroup(t *testing.T, self string, files map[string]string) cgroupPaths {
	t.Helper()
	dir := t.TempDir()
	cg := cgroupPaths{procCgroup: filepath.Join(dir, "proc-self-cgroup"), root: filepath.Join(dir, "cgroup")}
	if self != "" {
		if err := os.WriteFile(cg.procCgroup, []byte(self), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range files {
		full := filepath.Join(cg.root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cg
}

func TestResolveMemory(t *testing.T) {
	const v1Self = "4:memory:/docker/abc\n3:cpu:/\n0::/\n"
	const v2Self = "0::/kubepods/pod1/ctr\n"
	for _, c := range []struct {
		name       string
		flag       string
		gcPercent  int
		env        map[string]string
		self       string
		files      map[string]string
		wantLimit  int64
		wantSource string
		wantGC     int
		wantFollow bool
	}{
		{name: "auto, cgroup v2 root", flag: "auto", self: "0::/\n", files: map[string]string{"memory.max": "300000000\n"},
			wantLimit: 270_000_000, wantSource: "cgroup", wantGC: 400},
		{name: "auto, cgroup v2 own folder wins over root", flag: "auto", self: v2Self,
			files:     map[string]string{"memory.max": "max\n", "kubepods/pod1/ctr/memory.max": "1073741824\n"},
			wantLimit: 966367641, wantSource: "cgroup", wantGC: 400},
		{name: "auto, cgroup v2 max is none", flag: "auto", self: "0::/\n", files: map[string]string{"memory.max": "max\n"},
			wantSource: "none", wantGC: 400, wantFollow: true},
		{name: "auto, cgroup v1 own folder", flag: "auto", self: v1Self,
			files:     map[string]string{"memory/docker/abc/memory.limit_in_bytes": "524288000\n"},
			wantLimit: 471859200, wantSource: "cgroup", wantGC: 400},
		{name: "auto, cgroup v1 namespaced root", flag: "auto", self: v1Self,
			files:     map[string]string{"memory/memory.limit_in_bytes": "524288000\n"},
			wantLimit: 471859200, wantSource: "cgroup", wantGC: 400},
		{name: "auto, cgroup v1 unlimited", flag: "auto", self: v1Self,
			files:      map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"},
			wantSource: "none", wantGC: 400, wantFollow: true},
		{name: "auto, no cgroup files", flag: "auto", wantSource: "none", wantGC: 400, wantFollow: true},
		{name: "decimal size", flag: "270MB", wantLimit: 270_000_000, wantSource: "flag", wantGC: 400},
		{name: "binary size", flag: "1GiB", wantLimit: 1 << 30, wantSource: "flag", wantGC: 400},
		{name: "bytes", flag: "536870912", wantLimit: 1 << 29, wantSource: "flag", wantGC: 400},
		{name: "off", flag: "off", files: map[string]string{"memory.max": "300000000\n"}, wantSource: "off", wantGC: 100},
		{name: "zero", flag: "0", wantSource: "off", wantGC: 100},
		{name: "auto without a cgroup, explicit gc percent", flag: "auto", gcPercent: 200, wantSource: "none", wantGC: 200},
		{name: "explicit gc percent", flag: "1GiB", gcPercent: 150, wantLimit: 1 << 30, wantSource: "flag", wantGC: 150},
		{name: "GOMEMLIMIT wins", flag: "270MB", env: map[string]string{"GOMEMLIMIT": "512MiB"},
			wantLimit: 512 << 20, wantSource: "GOMEMLIMIT", wantGC: 400},
		{name: "GOMEMLIMIT off wins", flag: "270MB", env: map[string]string{"GOMEMLIMIT": "off"},
			wantSource: "GOMEMLIMIT", wantGC: 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			cg := fakeCgroup(t, c.self, c.files)
			lookup := func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
			m, err := resolveMemory(c.flag, c.gcPercent, lookup, cg)
			if err != nil {
				t.Fatal(err)
			}
			if m.limit != c.wantLimit || m.source != c.wantSource || m.gcPercent != c.wantGC || m.followHeap != c.wantFollow {
				t.Errorf("got limit %d from %q, gc %d, follow %v; want %d from %q, gc %d, follow %v",
					m.limit, m.source, m.gcPercent, m.followHeap, c.wantLimit, c.wantSource, c.wantGC, c.wantFollow)
			}
		})
	}
}

func TestResolveMemoryRefuses(t *testing.T) {
	for _, c := range []struct {
		name      string
		flag      string
		gcPercent int
		files     map[string]string
		want      string
	}{
		{name: "not a size", flag: "lots", want: `--memory-limit: "lots" is not a size`},
		{name: "negative", flag: "-5MB", want: "--memory-limit"},
		{name: "too small", flag: "1MB", want: "below the least useful limit"},
		{name: "too large", flag: "100EiB", want: "--memory-limit"},
		{name: "damaged cgroup file", flag: "auto", files: map[string]string{"memory.max": "lots\n"}, want: "--memory-limit auto: read"},
		{name: "negative gc percent", flag: "off", gcPercent: -1, want: "--gc-percent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cg := fakeCgroup(t, "0::/\n", c.files)
			_, err := resolveMemory(c.flag, c.gcPercent, func(string) (string, bool) { return "", false }, cg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// Without a container limit, auto's soft limit is 1.75 times the live heap, never below 224 MiB.
func TestFollowLimit(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live uint64
		want int64
	}{
		{0, 224 * mib},
		{50 * mib, 224 * mib},
		{128 * mib, 224 * mib},
		{136 * mib, 238 * mib}, // about 1M keys' live heap
		{8 << 30, 14 << 30},
	} {
		if got := followLimit(c.live); got != c.want {
			t.Errorf("followLimit(%d MiB) = %d MiB, want %d MiB", c.live/mib, got/mib, c.want/mib)
		}
	}
}
