// Package etcdtest starts real, throwaway etcd servers (one-node clusters) on loopback ports
// for tests, and stops them when the test ends.
package etcdtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns a missing etcd from a skipped test into a
// failed one, so CI cannot pass by silently testing nothing.
const RequireEnv = "SLUICE_REQUIRE_ETCD"

const (
	// startTimeout bounds how long a one-node cluster may take to elect itself and answer
	// /health; it takes well under a second here, so 20 s only trips on a broken start.
	startTimeout = 20 * time.Second
	// stopTimeout bounds Stop before it falls back to SIGKILL.
	stopTimeout = 15 * time.Second
	// startAttempts is how often Start picks new ports when one was taken between probing and
	// binding.
	startAttempts = 3
)

// Server is one etcd process. Addr, Endpoint and Dir stay the same across Restart. Its methods
// are safe for concurrent use.
type Server struct {
	// Addr is the client address, "127.0.0.1:PORT".
	Addr string
	// Endpoint is the client URL, "http://127.0.0.1:PORT".
	Endpoint string
	// Dir holds the data directory (data/) and the log (etcd.log).
	Dir string

	peer string // the peer URL
	bin  string

	mu   sync.Mutex
	proc *process // nil when not running
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
}

// Start starts etcd on free 127.0.0.1 ports with its data in a fresh temporary folder, waits
// until it is healthy, and stops it when the test ends. When etcd is not installed the test is
// skipped, or fails if SLUICE_REQUIRE_ETCD=1.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{bin: need(t), Dir: t.TempDir()}
	// Registered before the first launch so a process is killed even if Start fails half way,
	// and before t.TempDir's own cleanup runs (LIFO).
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("etcdtest: %s log tail:\n%s", s.Addr, s.logTail())
		}
	})
	for attempt := 1; ; attempt++ {
		client, err := freePort()
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		peer, err := freePort()
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(client)
		s.Endpoint = "http://" + s.Addr
		s.peer = "http://127.0.0.1:" + strconv.Itoa(peer)
		err = s.launch()
		if err == nil {
			return s
		}
		inUse := s.portInUse()
		// A failed first start may leave a half-made member in data/: start the next afresh.
		_ = os.RemoveAll(filepath.Join(s.Dir, "data"))
		if !inUse || attempt == startAttempts {
			t.Fatalf("etcdtest: %v", err)
		}
	}
}

// need returns the path of etcd, or ends the test: Skip normally, Fatal when the environment
// demands etcd.
func need(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("etcd")
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("etcdtest: etcd not found (%v) and %s=1", err, RequireEnv)
	}
	t.Skipf("etcdtest: etcd not installed (%v); install Debian's etcd-server or set %s=1 to make this a failure", err, RequireEnv)
	return ""
}

// launch starts the process and waits for /health; on failure the process is gone and the
// error carries the log tail.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("%s: already running", s.Addr)
	}
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(s.bin,
		"--name", "test",
		"--data-dir", filepath.Join(s.Dir, "data"),
		"--listen-client-urls", s.Endpoint,
		"--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", s.peer,
		"--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", "test="+s.peer,
		"--initial-cluster-state", "new",
		// No metrics or pprof listeners beyond the client one, and a small log.
		"--logger", "zap", "--log-level", "warn",
	)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := waitHealthy(s.Endpoint, p.done, startTimeout); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("etcd %s: %w\nlog tail:\n%s", s.Addr, err, s.logTail())
	}
	s.proc = p
	return nil
}

// waitHealthy polls GET /health until it reports a healthy member (one with a leader), the
// process exits, or timeout passes.
func waitHealthy(endpoint string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	last := errors.New("not polled")
	for {
		select {
		case <-exited:
			return errors.New("exited before it was healthy")
		default:
		}
		resp, err := client.Get(endpoint + "/health")
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body.Bytes(), []byte(`"health":"true"`)) {
				return nil
			}
			last = fmt.Errorf("/health: %d %s", resp.StatusCode, bytes.TrimSpace(body.Bytes()))
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy within %v: %v", timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Running reports whether the process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to exit, as a crash would end it. It does
// nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-s.proc.done
	s.proc = nil
}

// Stop sends SIGTERM and waits for a clean shutdown, falling back to SIGKILL after 15 s. It
// does nothing if the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.proc.done:
	case <-time.After(stopTimeout):
		_ = s.proc.cmd.Process.Signal(syscall.SIGKILL)
		<-s.proc.done
	}
	s.proc = nil
}

// Restart starts the server again on the same ports and data, so it keeps its keys and its
// revision, and waits until it is healthy. A running server is stopped first.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// RestartEmpty kills the server and starts a new one-member cluster on the same ports with an
// empty data directory, as if the member had been restored from another cluster's backup:
// its revisions start again from 1.
func (s *Server) RestartEmpty(t testing.TB) {
	t.Helper()
	s.Kill()
	if err := os.RemoveAll(filepath.Join(s.Dir, "data")); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	if err := s.launch(); err != nil {
		t.Fatalf("etcdtest: restart empty: %v", err)
	}
}

func (s *Server) logPath() string { return filepath.Join(s.Dir, "etcd.log") }

// portInUse reports whether the last start failed because a port was taken, the one failure
// new ports fix.
func (s *Server) portInUse() bool {
	b, _ := os.ReadFile(s.logPath())
	if bytes.Contains(b, []byte("address already in use")) {
		// Later attempts must not see this attempt's message.
		_ = os.Remove(s.logPath())
		return true
	}
	return false
}

// logTail returns the last lines of the server's log, for error messages.
func (s *Server) logTail() string {
	const lines = 20
	b, err := os.ReadFile(s.logPath())
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return "(empty)"
	}
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// freePort returns a 127.0.0.1 port nothing listens on, found by letting the kernel pick one.
// Another process may take it before etcd binds it; Start retries with new ports then.
func freePort() (int, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, fmt.Errorf("no free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
