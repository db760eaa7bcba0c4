// Package redistest starts real, throwaway redis-server processes (single servers and clusters)
// on loopback ports for tests, and stops them when the test ends.
package redistest

import (
	"bytes"
	"errors"
	"fmt"
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

// RequireEnv is the environment variable that turns a missing redis-server or redis-cli from a
// skipped test into a failed one, so CI cannot pass by silently testing nothing.
const RequireEnv = "SLUICE_REQUIRE_REDIS"

const (
	// startTimeout bounds how long a server may take to answer PING. AOF replay of the tiny
	// data sets tests write takes milliseconds; 10 s only trips on a broken start.
	startTimeout = 10 * time.Second
	// stopTimeout bounds Stop: a primary with lagging replicas may wait for them on SIGTERM
	// (shutdown-timeout), so Stop falls back to SIGKILL rather than hang the test.
	stopTimeout = 15 * time.Second
	// startAttempts is how often Start picks a new port when the chosen one was taken between
	// probing and binding (another process may grab a freed ephemeral port).
	startAttempts = 3
)

// Option configures Start and StartCluster.
type Option func(*config)

type config struct {
	aof     bool
	cluster bool
	extra   []string
	// sentinel, when set, makes the process a Sentinel monitoring master under this name.
	sentinel       string
	sentinelMaster string
}

// WithAOF turns on the append-only file with appendfsync everysec. A write normally reaches the
// OS before its reply, so a killed process (Kill, then Restart) keeps it; only an OS crash
// could lose the last second, which tests cannot simulate.
func WithAOF() Option { return func(c *config) { c.aof = true } }

// WithConfig appends redis.conf lines (such as "maxmemory 1mb"). They come after the package's
// own lines, so they override them.
func WithConfig(lines ...string) Option {
	return func(c *config) { c.extra = append(c.extra, lines...) }
}

// withCluster makes the server a cluster node; only StartCluster uses it, since a lone cluster
// node serves no slots until a cluster is created around it.
func withCluster() Option { return func(c *config) { c.cluster = true } }

// Server is one redis-server process. Addr, Port and Dir stay the same across Restart. Its
// methods are safe for concurrent use.
type Server struct {
	// Addr is "127.0.0.1:Port".
	Addr string
	// Port is the client port; a cluster node also listens on Port+10000 for the cluster bus.
	Port int
	// Dir is the server's working directory: redis.conf, redis.log, the AOF and nodes.conf.
	Dir string

	bin  string
	conf config

	mu   sync.Mutex // guards proc
	proc *process   // nil when not running
}

// process is one run of redis-server; Restart makes a new one.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // cmd.Wait's result, readable after done is closed
}

// Start starts a redis-server on a free 127.0.0.1 port in a fresh temporary directory, waits
// until it answers PING, and stops it when the test ends. When redis-server is not installed
// the test is skipped, or fails if SLUICE_REQUIRE_REDIS=1.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{bin: need(t, "redis-server"), Dir: t.TempDir()}
	for _, o := range opts {
		o(&s.conf)
	}
	// Registered before the first launch so a process is killed even if Start fails half way.
	// It runs before t.TempDir's own cleanup (LIFO), so the directory is removed only after
	// the process that writes into it is gone.
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("redistest: %s log tail:\n%s", s.Addr, s.logTail())
		}
		release(s.Port, s.conf.cluster)
	})
	for attempt := 1; ; attempt++ {
		port, err := freePort(s.conf.cluster)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Port, s.Addr = port, "127.0.0.1:"+strconv.Itoa(port)
		if err := s.writeConfig(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		err = s.launch()
		if err == nil {
			return s
		}
		inUse := s.portInUse()
		release(port, s.conf.cluster)
		s.Port = 0
		if !inUse || attempt == startAttempts {
			t.Fatalf("redistest: %v", err)
		}
	}
}

// StartSentinel starts a Sentinel that monitors master under name, and stops it when the test
// ends. Clients find the master through it: redis-sentinel://ADDR/name.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	return Start(t, func(c *config) { c.sentinel, c.sentinelMaster = name, master.Addr })
}

// need returns the path of binary name, or ends the test: Skip normally, Fatal when the
// environment demands Redis.
func need(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("redistest: %s not found (%v) and %s=1", name, err, RequireEnv)
	}
	t.Skipf("redistest: %s not installed (%v); install Redis 7 or set %s=1 to make this a failure", name, err, RequireEnv)
	return ""
}

func (s *Server) writeConfig() error {
	if s.conf.sentinel != "" {
		// A Sentinel takes only its own directives and rewrites this file as it learns.
		host, port, _ := strings.Cut(s.conf.sentinelMaster, ":")
		data := strings.Join([]string{
			"bind 127.0.0.1", "port " + strconv.Itoa(s.Port), "protected-mode no", "daemonize no",
			"dir " + quote(s.Dir), "logfile " + quote(filepath.Join(s.Dir, "redis.log")),
			fmt.Sprintf("sentinel monitor %s %s %s 1", s.conf.sentinel, host, port),
			fmt.Sprintf("sentinel down-after-milliseconds %s 1000", s.conf.sentinel),
			fmt.Sprintf("sentinel failover-timeout %s 2000", s.conf.sentinel),
		}, "\n") + "\n"
		return os.WriteFile(s.confPath(), []byte(data), 0o600)
	}
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(s.Port),
		"protected-mode no",
		"daemonize no",
		// Absolute paths: redis chdirs to dir while parsing, so a relative logfile would
		// depend on the order of the lines.
		"dir " + quote(s.Dir),
		"logfile " + quote(filepath.Join(s.Dir, "redis.log")),
		// No RDB snapshots: persistence in tests is exactly what WithAOF asks for.
		`save ""`,
		// Replicas sync at once instead of after the 5 s default that waits for more replicas
		// to share one diskless transfer; it dominated cluster start-up with replicas.
		"repl-diskless-sync-delay 0",
	}
	if s.conf.aof {
		lines = append(lines, "appendonly yes", "appendfsync everysec")
	} else {
		lines = append(lines, "appendonly no")
	}
	if s.conf.cluster {
		lines = append(lines,
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			// Shorter than the 15 s default so failover tests finish in seconds; override
			// with WithConfig.
			"cluster-node-timeout 2000",
		)
	}
	lines = append(lines, s.conf.extra...)
	data := strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(s.confPath(), []byte(data), 0o600); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// quote writes s as a redis.conf double-quoted string.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func (s *Server) confPath() string { return filepath.Join(s.Dir, "redis.conf") }

// launch starts the process and waits for PING; on failure the process is gone and the error
// carries the log tail.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("%s: already running", s.Addr)
	}
	// stdio goes to a file rather than a pipe: errors before the logfile is open (a bad config
	// line) land there, and a file needs no goroutine to drain it.
	stdio, err := os.OpenFile(filepath.Join(s.Dir, "stdio.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer stdio.Close() // the child holds its own descriptor
	args := []string{s.confPath()}
	if s.conf.sentinel != "" {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = stdio, stdio
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := waitPing(s.Addr, p.done, startTimeout); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		if p.err != nil && !isKilled(p.err) {
			err = fmt.Errorf("%w (exit: %v)", err, p.err)
		}
		return fmt.Errorf("redis-server %s: %w\nlog tail:\n%s", s.Addr, err, s.logTail())
	}
	s.proc = p
	return nil
}

func isKilled(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
	}
	return false
}

// waitPing polls addr until it answers +PONG, the process exits, or timeout passes. A server
// replaying its AOF answers -LOADING, which counts as not ready yet.
func waitPing(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-exited:
			return errors.New("exited before answering PING")
		default:
		}
		if last = ping(addr); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %v", timeout, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Running reports whether the process is up (started and not yet stopped or killed by these
// methods; a crash on its own is noticed too).
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

// Kill sends SIGKILL and waits for the process to exit, as a crash would end it: no AOF
// rewrite, no goodbye to clients or cluster peers. It does nothing if the server is not running.
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

// Pause stops the process with SIGSTOP: it keeps its port and its connections open but
// answers nothing, as a server stalled by a fork, a swap storm or a partition that drops
// packets would. Resume lets it go on; Kill and Stop work on a paused server too. It does
// nothing if the server is not running.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause (SIGCONT). It is harmless on one that is not
// paused, so tests register it with t.Cleanup before they Pause.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.cmd.Process.Signal(sig)
	}
}

// Stop sends SIGTERM and waits for a clean shutdown (the AOF is flushed and fsynced). After
// 15 s it falls back to SIGKILL. It does nothing if the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGTERM)
	// A paused server would hold SIGTERM until it runs again.
	_ = s.proc.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-s.proc.done:
	case <-time.After(stopTimeout):
		_ = s.proc.cmd.Process.Signal(syscall.SIGKILL)
		<-s.proc.done
	}
	s.proc = nil
}

// Restart starts the server again with the same port, directory and configuration, so it
// reloads its AOF (and a cluster node its nodes.conf), and waits for PING. A running server is
// stopped first with Stop; call Kill before Restart to test recovery from a crash.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// portInUse reports whether the last start failed because the port (or the cluster bus port)
// was taken, the one failure a new port fixes.
func (s *Server) portInUse() bool {
	for _, name := range []string{"redis.log", "stdio.log"} {
		b, _ := os.ReadFile(filepath.Join(s.Dir, name))
		if bytes.Contains(b, []byte("Address already in use")) {
			// Later attempts must not see this attempt's message.
			_ = os.Remove(filepath.Join(s.Dir, name))
			return true
		}
	}
	return false
}

// logTail returns the last lines of the server's output, for error messages.
func (s *Server) logTail() string {
	const lines = 20
	var out []string
	for _, name := range []string{"stdio.log", "redis.log"} {
		b, err := os.ReadFile(filepath.Join(s.Dir, name))
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(l) > lines {
			l = l[len(l)-lines:]
		}
		out = append(out, "== "+name, strings.Join(l, "\n"))
	}
	if len(out) == 0 {
		return "(empty)"
	}
	return strings.Join(out, "\n")
}
