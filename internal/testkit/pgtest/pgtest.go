// Package pgtest starts real, throwaway PostgreSQL clusters for tests (initdb, then the server
// on a free 127.0.0.1 port with a private socket folder) and hands each test a fresh database.
//
// A test package shares one cluster, started on first use, and stops it in TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		url := pgtest.DB(t) // postgres://sluice@127.0.0.1:PORT/t_N?sslmode=disable
//	}
//
// Tests that stop and restart the server start their own cluster with Start.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequireEnv is the environment variable that turns a missing PostgreSQL server from a skipped
// test into a failed one, so CI cannot pass by silently testing nothing.
const RequireEnv = "SLUICE_REQUIRE_POSTGRES"

// Superuser is the cluster's superuser; it authenticates without a password (trust) on the
// loopback address and the private socket only.
const Superuser = "sluice"

const (
	// startTimeout bounds how long a fresh server may take to accept connections; on this
	// machine it takes well under a second.
	startTimeout = 30 * time.Second
	// stopTimeout bounds a fast shutdown before Stop falls back to SIGKILL.
	stopTimeout = 30 * time.Second
	// startAttempts is how often Start picks a new port when the chosen one was taken between
	// probing and binding.
	startAttempts = 3
)

// Cluster is one PostgreSQL server and its data directory. Its methods are safe for concurrent
// use; Port and Dir stay the same across Restart.
type Cluster struct {
	// Port is the server's port on 127.0.0.1.
	Port int
	// Dir holds the data directory (data/), the socket folder (sock/) and the log (server.log).
	Dir string

	bin  string              // folder with initdb and postgres
	cred *syscall.Credential // nil: run as ourselves

	mu   sync.Mutex
	proc *process
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// URL returns the connection URL of database db as the superuser.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, c.Port, db)
}

// Start initializes a cluster in a fresh temporary folder, starts it, and stops and removes it
// when the test ends. When PostgreSQL is not installed the test is skipped, or fails if
// SLUICE_REQUIRE_POSTGRES=1.
func Start(t testing.TB) *Cluster {
	t.Helper()
	c, err := start()
	if err != nil {
		if errors.Is(err, errNotInstalled) {
			missing(t, err)
		}
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: server log tail:\n%s", c.logTail())
		}
		c.destroy()
	})
	return c
}

var errNotInstalled = errors.New("PostgreSQL server binaries (initdb, postgres) not found")

// missing ends a test whose PostgreSQL is not installed: Skip, or Fatal under RequireEnv.
func missing(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("pgtest: %v and %s=1", err, RequireEnv)
	}
	t.Skipf("pgtest: %v; install Debian's postgresql or set %s=1 to make this a failure", err, RequireEnv)
}

// start is Start without a test: Main's shared cluster lives longer than any one test.
func start() (*Cluster, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parent folders are private to root, and the server may run as
	// another user, who must reach its data directory.
	dir, err := os.MkdirTemp("", "sluice-pgtest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, bin: bin, cred: cred}
	if err := c.init(); err != nil {
		c.destroy()
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		c.Port, err = freePort()
		if err == nil {
			err = c.launch()
		}
		if err == nil {
			return c, nil
		}
		if attempt == startAttempts || !strings.Contains(c.logTail(), "could not bind") {
			c.destroy()
			return nil, err
		}
	}
}

// findBin returns the folder holding initdb and postgres: the newest of Debian's
// /usr/lib/postgresql/*/bin, else where initdb on PATH lives (Debian does not put the server
// binaries on PATH, other systems do).
func findBin() (string, error) {
	var dirs []string
	if matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(matches) > 0 {
		slices.SortFunc(matches, func(a, b string) int { return versionOf(b) - versionOf(a) })
		dirs = append(dirs, matches...)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errNotInstalled
}

// versionOf reads N from /usr/lib/postgresql/N/bin.
func versionOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// credential returns whom the server runs as: PostgreSQL refuses to run as root, so a root
// test runs it as the postgres user the Debian package creates (or nobody).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root and no postgres or nobody user to run PostgreSQL as")
}

func (c *Cluster) dataDir() string { return filepath.Join(c.Dir, "data") }
func (c *Cluster) sockDir() string { return filepath.Join(c.Dir, "sock") }
func (c *Cluster) logPath() string { return filepath.Join(c.Dir, "server.log") }

// command builds a command of the cluster's binaries, run as the cluster's user.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.Dir
	// PG* variables of the caller's environment must not point the tools elsewhere.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	cmd.SysProcAttr = sysProcAttr(c.cred)
	return cmd
}

// init runs initdb. --no-sync and the server's fsync=off trade crash safety of the OS, which
// a throwaway cluster does not need, for speed; a killed server still keeps every commit.
func (c *Cluster) init() error {
	if err := os.Mkdir(c.sockDir(), 0o700); err != nil {
		return err
	}
	if c.cred != nil {
		for _, d := range []string{c.Dir, c.sockDir()} {
			if err := os.Chown(d, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return err
			}
		}
	}
	cmd := c.command("initdb", "-D", c.dataDir(), "-U", Superuser, "--auth=trust",
		"--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// launch starts the server and waits until it accepts connections. The server runs as this
// process's child rather than daemonized by pg_ctl start, so that Pdeathsig ends it even when
// the test binary dies without running its cleanups (a -timeout panic, kill -9); stopping
// sends SIGINT, which is what pg_ctl stop -m fast sends.
func (c *Cluster) launch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		return errors.New("pgtest: already running")
	}
	logf, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := c.command("postgres", "-D", c.dataDir(),
		"-p", strconv.Itoa(c.Port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+c.sockDir(),
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
		"-c", "shared_buffers=32MB",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := c.waitReady(p.done); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("postgres on port %d: %w\nlog tail:\n%s", c.Port, err, c.logTail())
	}
	c.proc = p
	return nil
}

// shmInUse is the server's complaint when the backends of a killed server are still exiting:
// each runs in its own session, so killing the server leaves them to notice its death, which
// takes them a few milliseconds.
const shmInUse = "pre-existing shared memory block"

// launchRetry is launch, retried while a killed predecessor's backends are still exiting.
func (c *Cluster) launchRetry() error {
	deadline := time.Now().Add(startTimeout)
	for {
		var mark int64
		if st, err := os.Stat(c.logPath()); err == nil {
			mark = st.Size()
		}
		err := c.launch()
		if err == nil || time.Now().After(deadline) || !strings.Contains(c.logFrom(mark), shmInUse) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logFrom returns the server log from byte offset off on.
func (c *Cluster) logFrom(off int64) string {
	b, err := os.ReadFile(c.logPath())
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// waitReady polls until the server answers a query, the process exits or startTimeout passes.
func (c *Cluster) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			return errors.New("exited before accepting connections")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v: %w", startTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Running reports whether the server process is up.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return false
	}
	select {
	case <-c.proc.done:
		return false
	default:
		return true
	}
}

// Stop shuts the server down (fast: clients are disconnected, commits are kept) and waits,
// falling back to SIGKILL after 30 s. It does nothing if the server is not running.
func (c *Cluster) Stop() { c.signal(syscall.SIGINT) }

// Kill ends the server with SIGKILL, as a crash would. It does nothing if it is not running.
func (c *Cluster) Kill() { c.signal(syscall.SIGKILL) }

func (c *Cluster) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return
	}
	_ = c.proc.cmd.Process.Signal(sig)
	select {
	case <-c.proc.done:
	case <-time.After(stopTimeout):
		_ = c.proc.cmd.Process.Kill()
		<-c.proc.done
	}
	c.proc = nil
}

// Restart starts a stopped or killed server again on the same port and data, and waits until
// it accepts connections. A running server is stopped first.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.Stop()
	if err := c.launchRetry(); err != nil {
		t.Fatalf("pgtest: restart: %v", err)
	}
}

// destroy stops the server and removes its folder.
func (c *Cluster) destroy() {
	c.Kill() // the data is thrown away, so no need for a clean shutdown
	_ = os.RemoveAll(c.Dir)
}

// CreateDB creates a new empty database and returns its URL; the test's cleanup drops it.
func (c *Cluster) CreateDB(t testing.TB) string {
	t.Helper()
	name := "t_" + strconv.FormatInt(dbSeq.Add(1), 10)
	if err := c.exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		if !c.Running() {
			return
		}
		// FORCE ends the connections a test left open (a pool closed late, a listener).
		if err := c.exec("DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return c.URL(name)
}

var dbSeq atomic.Int64

// exec runs one statement in the postgres database.
func (c *Cluster) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// logTail returns the last lines of the server log.
func (c *Cluster) logTail() string {
	const lines = 30
	b, err := os.ReadFile(c.logPath())
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return "(empty)"
	}
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// freePort returns a 127.0.0.1 port nothing listens on, picked by the kernel.
func freePort() (int, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// The package's shared cluster: started by the first DB call, stopped by Main.
var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
)

// DB returns the URL of a fresh database on the test package's shared cluster, starting the
// cluster on first use; the test's cleanup drops the database. The package's TestMain must
// call Main, which removes the cluster after the last test.
func DB(t testing.TB) string {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		if errors.Is(sharedErr, errNotInstalled) {
			missing(t, sharedErr)
		}
		t.Fatalf("pgtest: %v", sharedErr)
	}
	return shared.CreateDB(t)
}

// Main runs the package's tests and then stops and removes the shared cluster, if one was
// started; it exits with the tests' code. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.destroy()
	}
	os.Exit(code)
}
