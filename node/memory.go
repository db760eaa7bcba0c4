package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"
)

// memoryFlags are the settings of the Go runtime's memory use: a soft limit, and the GC target
// chosen against it.
type memoryFlags struct {
	limit string
}

// memoryLimitShare is the share of a container's memory limit that auto takes as the soft
// limit: the rest is left to what the Go heap does not count (stacks, the runtime's own
// structures, pages not yet returned), so that the kernel's OOM killer is not the limit.
const memoryLimitShare = 0.9

// gcPercentLimited is the GC target auto picks under a soft memory limit, which bounds the
// heap: the collector then runs rarely while the live heap is small (at 100 it took ~20% of the
// CPU under load). gcPercentUnlimited is Go's own, for an operator who turned the limit off.
const (
	gcPercentLimited   = 400
	gcPercentUnlimited = 100
)

// followHeapFloor is the least soft limit auto sets on a node without a container limit: the
// limit follows the live heap (followHeapRatio times it, never below this), so a small heap is
// collected rarely and a large one holds a little less than Go's default 100% would. A fixed 400% without a limit let the heap
// grow to five times what is live (1.33M keys held 576 MB RSS); a fixed 100% costs the CPU
// above; and a limit, unlike a GC target, also makes the runtime return freed pages (1M keys:
// ~352 MiB RSS at 100%, ~280 MiB under a limit of the same heap size). Process memory the limit
// does not count (the binary, ~30 MiB idle) comes on top, hence 7/4 rather than 2: 1M keys
// (~129 MiB live) then stay under 300 MB.
const (
	followHeapFloor = 224 << 20
	followHeapRatio = 1.75
)

// followHeapEvery is how often the soft limit is fitted to the live heap.
const followHeapEvery = time.Second

func (m *memoryFlags) register(f *pflag.FlagSet) {
	f.StringVar(&m.limit, "memory-limit", EnvDefault("SLUICE_MEMORY_LIMIT", "auto"), "soft limit of the Go heap and runtime, e.g. 270MB or 1GiB: the collector works harder as memory nears it; auto = 90% of the container's (cgroup) memory limit when there is one; 0 or off = none; GOMEMLIMIT wins when set (SLUICE_MEMORY_LIMIT)")
}

// memorySettings is what the process runs with: a soft limit (0 for none), where it came from,
// and the GC target.
type memorySettings struct {
	limit     int64
	source    string
	gcPercent int
	// followHeap: with no container limit and none asked for, the soft limit follows the live heap.
	followHeap bool
}

// cgroupPaths are where a process reads its cgroup memory limit; tests point them at a
// temporary folder.
type cgroupPaths struct {
	procCgroup string // /proc/self/cgroup
	root       string // /sys/fs/cgroup
}

var systemCgroup = cgroupPaths{procCgroup: "/proc/self/cgroup", root: "/sys/fs/cgroup"}

// resolveMemory decides the soft memory limit and GC target from the flags, the environment
// (lookup is os.LookupEnv outside tests) and the cgroup files. gcPercent is --gc-percent; 0
// means auto.
func resolveMemory(flag string, gcPercent int, lookup func(string) (string, bool), cg cgroupPaths) (memorySettings, error) {
	var m memorySettings
	if v, ok := lookup("GOMEMLIMIT"); ok && v != "" {
		// The runtime has applied it already (and refuses to start on a bad one); it is read
		// here only to report it and choose the GC target.
		m.source = "GOMEMLIMIT"
		if n, err := humanize.ParseBytes(v); err == nil && n < math.MaxInt64 {
			m.limit = int64(n)
		}
	} else {
		limit, source, err := parseMemoryLimit(flag, cg)
		if err != nil {
			return m, err
		}
		m.limit, m.source = limit, source
	}
	switch {
	case gcPercent < 0:
		return m, fmt.Errorf("--gc-percent: %d: want 1 or more, or 0 for auto", gcPercent)
	case gcPercent > 0:
		m.gcPercent = gcPercent
	case m.limit > 0 || m.source == "none":
		m.gcPercent = gcPercentLimited
	default:
		m.gcPercent = gcPercentUnlimited
	}
	// With no container limit and none asked for, the limit follows the live heap.
	m.followHeap = m.source == "none" && gcPercent == 0
	return m, nil
}

// followLimit is auto's soft memory limit without a container limit, for a live heap of live
// bytes: followHeapRatio times it, never below followHeapFloor.
func followLimit(live uint64) int64 {
	return int64(max(followHeapFloor, followHeapRatio*float64(live)))
}

// followHeap fits the soft memory limit to the live heap every followHeapEvery until ctx ends.
// The runtime reports the live heap as of the last collection; a heap that outgrows the limit
// between two fittings makes the collector work harder (at most half the CPU, the runtime's
// cap) until the next. The limit changes only when it moves by a tenth.
func followHeap(ctx context.Context, log *slog.Logger) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	current := followLimit(0)
	debug.SetMemoryLimit(current)
	t := time.NewTicker(followHeapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			log.Warn("memory: the runtime reports no live heap; the soft limit stays", "memory_limit", current)
			return
		}
		if l := followLimit(sample[0].Value.Uint64()); 10*abs(l-current) >= current {
			debug.SetMemoryLimit(l)
			current = l
		}
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// parseMemoryLimit reads --memory-limit: auto, 0 or off, or a size (270MB is 270·10⁶ bytes,
// 270MiB 270·2²⁰; a bare number is bytes).
func parseMemoryLimit(v string, cg cgroupPaths) (int64, string, error) {
	switch s := strings.ToLower(strings.TrimSpace(v)); s {
	case "auto", "":
		n, err := cgroupMemoryLimit(cg)
		if err != nil {
			return 0, "", fmt.Errorf("--memory-limit auto: %w", err)
		}
		if n == 0 {
			return 0, "none", nil
		}
		return int64(float64(n) * memoryLimitShare), "cgroup", nil
	case "0", "off", "none":
		return 0, "off", nil
	}
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return 0, "", fmt.Errorf("--memory-limit: %q is not a size such as 270MB or 1GiB, auto or off", v)
	}
	if n == 0 {
		return 0, "off", nil
	}
	if n > math.MaxInt64 {
		return 0, "", fmt.Errorf("--memory-limit: %q is too large", v)
	}
	const minLimit = 16 << 20
	if n < minLimit {
		// Below this the collector would run without pause and the process make no progress.
		return 0, "", fmt.Errorf("--memory-limit: %q is below the least useful limit, 16MiB", v)
	}
	return int64(n), "flag", nil
}

// unlimitedCgroup is where cgroup v1 values mean no limit: v1 writes a page-rounded
// LONG_MAX there.
const unlimitedCgroup = 1 << 62

// cgroupMemoryLimit returns the process's cgroup memory limit in bytes, 0 when there is none:
// cgroup v2's memory.max, else v1's memory.limit_in_bytes, in the process's own cgroup when
// its folder is visible, else at the root of the mount (a container's own cgroup namespace).
func cgroupMemoryLimit(cg cgroupPaths) (uint64, error) {
	v2, v1, err := ownCgroups(cg.procCgroup)
	if err != nil {
		return 0, err
	}
	candidates := []string{
		filepath.Join(cg.root, v2, "memory.max"),
		filepath.Join(cg.root, "memory.max"),
		filepath.Join(cg.root, "memory", v1, "memory.limit_in_bytes"),
		filepath.Join(cg.root, "memory", "memory.limit_in_bytes"),
	}
	for _, p := range candidates {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", p, err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read %s: %q is not a number of bytes", p, s)
		}
		if n >= unlimitedCgroup {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}

// ownCgroups returns the process's cgroup v2 path and v1 memory cgroup path from
// /proc/self/cgroup ("0::/path" and "N:memory:/path"); empty when absent.
func ownCgroups(path string) (v2, v1 string, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil // not Linux, or no /proc: no cgroup to read
	}
	if err != nil {
		return "", "", fmt.Errorf("read cgroups: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		ctrls, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if id == "0" && ctrls == "" {
			v2 = p
		}
		for c := range strings.SplitSeq(ctrls, ",") {
			if c == "memory" {
				v1 = p
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("read %s: %w", path, err)
	}
	return v2, v1, nil
}

// applyMemory sets the runtime's soft memory limit and GC target, GOGC and GOMEMLIMIT winning
// when set, and logs what it chose.
func applyMemory(ctx context.Context, c Config, log *slog.Logger) error {
	m, err := resolveMemory(c.memory.limit, c.gcPercent, os.LookupEnv, systemCgroup)
	if err != nil {
		return err
	}
	if m.source != "GOMEMLIMIT" && m.limit > 0 {
		debug.SetMemoryLimit(m.limit)
	}
	gc := "GOGC"
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(m.gcPercent)
		gc = strconv.Itoa(m.gcPercent)
	}
	if _, set := os.LookupEnv("GOGC"); set {
		m.followHeap = false // the operator chose how the collector runs
	}
	if m.followHeap {
		m.source = "live heap: 1.75 times it, at least 224 MiB"
		m.limit = followLimit(0)
		go followHeap(ctx, log)
	}
	log.Info("memory settings", "memory_limit", m.limit, "memory_limit_source", m.source, "gc_percent", gc)
	return nil
}
