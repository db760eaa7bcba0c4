package benchmarks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	rssBin     = flag.String("rss-bin", "", "sluice binary for BenchmarkBinaryRSSPerKey; empty builds ../cmd/sluice")
	rssKeys    = flag.Int("rss-keys", 20_000, "distinct keys BenchmarkBinaryRSSPerKey creates (1000000 for the figure that counts)")
	rssFlags   = flag.String("rss-flags", "", "extra serve flags for BenchmarkBinaryRSSPerKey, space-separated, e.g. --memory-limit=270MB")
	rssClients = flag.Int("rss-clients", 8, "concurrent HTTP clients of BenchmarkBinaryRSSPerKey")
)

// rssPolicy is the load: a fixed window of 1,000 per hour keyed on user, so that every
// distinct user is a key held for the hour.
const rssPolicy = `
rules:
  - {name: per-user-per-hour, key: [user], algorithm: fixed_window, limit: 1000, period: 1h}
`

// BenchmarkBinaryRSSPerKey is memory as operators pay it: it starts `sluice serve` on the
// memory store on loopback, creates -rss-keys distinct keys over HTTP from -rss-clients
// clients, and reports the process's resident set (VmRSS) and its peak (VmHWM) from
// /proc/PID/status, in MiB and in bytes per key. Linux only. Run it once:
//
//	go test -run '^$' -bench BinaryRSSPerKey -benchtime 1x -args -rss-keys 1000000 -rss-bin BIN -rss-flags=--memory-limit=270MB
func BenchmarkBinaryRSSPerKey(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs Linux's /proc")
	}
	dir := b.TempDir()
	bin := *rssBin
	if bin == "" {
		bin = filepath.Join(dir, "sluice")
		build := exec.Command("go", "build", "-o", bin, "../cmd/sluice")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("build sluice: %v\n%s", err, out)
		}
	}
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(rssPolicy), 0o644); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		addr := freeAddr(b)
		args := []string{"serve", "--http", addr, "--grpc", freeAddr(b), "--data-dir", b.TempDir(), "--config", policy, "--log-level", "warn"}
		args = append(args, strings.Fields(*rssFlags)...)
		cmd := exec.Command(bin, args...)
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			cmd.Process.Kill()
			<-exited
		}
		if err := waitHealthy(addr, exited); err != nil {
			stop()
			b.Fatalf("%v\n%s", err, log.String())
		}
		base, _, err := procMemory(cmd.Process.Pid)
		if err != nil {
			stop()
			b.Fatal(err)
		}
		start := time.Now()
		if err := createKeys(addr, *rssKeys, *rssClients); err != nil {
			stop()
			b.Fatalf("%v\n%s", err, log.String())
		}
		elapsed := time.Since(start)
		time.Sleep(2 * time.Second) // a snapshot or two, and a collection, under the full set
		rss, hwm, err := procMemory(cmd.Process.Pid)
		stop()
		if err != nil {
			b.Fatal(err)
		}
		keys := float64(*rssKeys)
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
		b.ReportMetric(float64(hwm)/(1<<20), "hwm-MiB")
		b.ReportMetric(float64(base)/(1<<20), "idle-rss-MiB")
		b.ReportMetric(float64(rss)/keys, "rss-B/key")
		b.ReportMetric(float64(hwm)/keys, "hwm-B/key")
		b.ReportMetric(keys/elapsed.Seconds(), "keys/s")
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHealthy waits until the server at addr answers /healthz, or exits.
func waitHealthy(addr string, exited <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("sluice exited at start: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("sluice did not answer /healthz within 30 s")
}

// createKeys checks n distinct users once each, from clients concurrent keep-alive clients.
// Every check must be allowed: a denial would mean keys collided or state was lost.
func createKeys(addr string, n, clients int) error {
	tr := &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + addr + "/v1/check"
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, clients)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for c := range clients {
		wg.Go(func() {
			body := make([]byte, 0, 64)
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				body = strconv.AppendInt(append(body[:0], `{"tenant":"acme","user":"u`...), 1_000_000_000+i, 10)
				body = append(body, `"}`...)
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					errs[c] = fmt.Errorf("check %d: %w", i, err)
					cancel()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[c] = fmt.Errorf("check %d: status %d, want 200", i, resp.StatusCode)
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// procMemory reads a process's VmRSS and VmHWM from /proc/PID/status, in bytes.
func procMemory(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read process memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("read process memory: %s: %q", name, v)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("read process memory: %w", err)
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, errors.New("read process memory: no VmRSS or VmHWM")
	}
	return rss, hwm, nil
}
