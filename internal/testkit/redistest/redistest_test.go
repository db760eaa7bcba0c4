package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// must fails the test on a command error.
func must(t *testing.T, s *Server, args ...string) string {
	t.Helper()
	reply, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%s %v: %v", s.Addr, args, err)
	}
	return reply
}

// assertRefused checks that nothing listens on addr any more.
func assertRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
}

func TestStartPingStop(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") || s.Port == 0 {
		t.Fatalf("Addr %q, Port %d: want a 127.0.0.1 port", s.Addr, s.Port)
	}
	if got := must(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	if !s.Running() {
		t.Fatal("Running() = false after Start")
	}
	s.Stop()
	if s.Running() {
		t.Fatal("Running() = true after Stop")
	}
	assertRefused(t, s.Addr)
	s.Stop() // a second Stop, and the cleanup's Kill, must be harmless
}

func TestKillRefusesConnections(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Kill()
	assertRefused(t, s.Addr)
}

func TestRestart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		opts   []Option
		crash  bool // Kill before Restart instead of letting Restart Stop
		wantOK bool // whether the key survives
	}{
		{"aof survives stop", []Option{WithAOF()}, false, true},
		// With everysec the write() reaches the page cache before the reply, so a process
		// crash loses nothing (only an OS crash could).
		{"aof survives kill", []Option{WithAOF()}, true, true},
		// Without AOF (and save "") nothing persists: proves Restart really restarted.
		{"no aof loses key", nil, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, tc.opts...)
			port := s.Port
			if got := must(t, s, "SET", "k", "v with spaces\r\n"); got != "OK" {
				t.Fatalf("SET = %q", got)
			}
			if tc.crash {
				s.Kill()
			}
			s.Restart(t)
			if s.Port != port {
				t.Fatalf("port changed from %d to %d", port, s.Port)
			}
			got, err := s.Do("GET", "k")
			switch {
			case tc.wantOK && (err != nil || got != "v with spaces\r\n"):
				t.Fatalf("GET after restart = %q, %v; want the value", got, err)
			case !tc.wantOK && !errors.Is(err, ErrNil):
				t.Fatalf("GET after restart = %q, %v; want ErrNil", got, err)
			}
		})
	}
}

// TestPause checks a paused server keeps its port but answers nothing, answers again after
// Resume, and that Stop does not wait out its SIGKILL fallback on a paused server.
func TestPause(t *testing.T) {
	t.Parallel()
	s := Start(t)
	t.Cleanup(s.Resume)
	s.Pause()
	if err := ping(s.Addr); err == nil {
		t.Fatal("a paused server answered PING")
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("PING to a paused server: %v, want a timeout (the port stays open)", err)
	}
	s.Resume()
	if got := must(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING after Resume = %q", got)
	}
	s.Pause()
	start := time.Now()
	s.Stop()
	if d := time.Since(start); d > stopTimeout/2 {
		t.Fatalf("Stop of a paused server took %v", d)
	}
	assertRefused(t, s.Addr)
}

func TestOptionsReachConfig(t *testing.T) {
	t.Parallel()
	s := Start(t, WithAOF(), WithConfig("maxmemory 1mb", `maxmemory-policy "allkeys-lru"`))
	mem := InfoFields(must(t, s, "INFO", "memory"))
	if mem["maxmemory"] != "1048576" || mem["maxmemory_policy"] != "allkeys-lru" {
		t.Fatalf("maxmemory %q policy %q, want 1048576 allkeys-lru", mem["maxmemory"], mem["maxmemory_policy"])
	}
	if p := InfoFields(must(t, s, "INFO", "persistence")); p["aof_enabled"] != "1" {
		t.Fatalf("aof_enabled = %q, want 1", p["aof_enabled"])
	}
}

func TestReplyErrors(t *testing.T) {
	t.Parallel()
	s := Start(t)
	var re ReplyError
	if _, err := s.Do("NOSUCHCOMMAND"); !errors.As(err, &re) {
		t.Fatalf("unknown command: err = %v, want ReplyError", err)
	}
	if got := must(t, s, "INCRBY", "n", "41"); got != "41" {
		t.Fatalf("INCRBY = %q", got)
	}
	if got := must(t, s, "MGET", "n", "missing", "n"); got != "41\n\n41" {
		t.Fatalf("MGET = %q, want the elements one per line, a nil one empty", got)
	}
	replies, errs, err := pipeline(s.Addr, []string{"SELECT", "1"}, []string{"GET", "n"}, []string{"NOSUCHCOMMAND"}, []string{"PING"})
	if err != nil {
		t.Fatal(err)
	}
	// GET runs in db 1 on the same connection, so n (written to db 0) is missing there.
	if replies[0] != "OK" || !errors.Is(errs[1], ErrNil) || !errors.As(errs[2], &re) || replies[3] != "PONG" {
		t.Fatalf("pipeline = %q, %v", replies, errs)
	}
}

// TestMoveSlot moves a slot with keys in it to another primary: the keys go with it, every
// node names the new owner, and a key on the slot answers there.
func TestMoveSlot(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := StartCluster(t, 3, 0)
	const slot = 15495 // "{a}"'s
	if got := must(t, c.Nodes[0], "CLUSTER", "KEYSLOT", "{a}"); got != "15495" {
		t.Fatalf("CLUSTER KEYSLOT {a} = %s", got)
	}
	from := c.Owner(t, slot)
	for i := range 25 {
		must(t, from, "SET", fmt.Sprint("{a}", i), "v")
	}
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	batches := 0
	c.MoveSlot(t, slot, to, 10, func() { batches++ })
	if batches != 3 {
		t.Errorf("25 keys moved in %d batches of 10, want 3", batches)
	}
	if got := c.Owner(t, slot); got != to {
		t.Fatalf("slot %d on %s after the move, want %s", slot, got.Addr, to.Addr)
	}
	if got := must(t, to, "GET", "{a}24"); got != "v" {
		t.Fatalf("GET {a}24 on the new owner = %q", got)
	}
	if _, err := from.Do("GET", "{a}24"); err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("GET {a}24 on the old owner: err = %v, want MOVED", err)
	}
}

// TestCluster starts a 3-primary cluster and a 3-primary, 1-replica-each cluster and checks
// every node agrees on the shape.
func TestCluster(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		primaries, replicas int
		long                bool // skipped under -short
	}{
		{"3 primaries", 3, 0, false},
		{"3 primaries 1 replica each", 3, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.long && testing.Short() {
				t.Skip("slow cluster test skipped in -short mode")
			}
			start := time.Now()
			c := StartCluster(t, tc.primaries, tc.replicas)
			t.Logf("cluster of %d nodes ok after %v", len(c.Nodes), time.Since(start).Round(time.Millisecond))

			n := tc.primaries * (1 + tc.replicas)
			if len(c.Nodes) != n || len(c.Addrs) != n {
				t.Fatalf("%d nodes, %d addrs; want %d", len(c.Nodes), len(c.Addrs), n)
			}
			roles := map[string]int{}
			for i, s := range c.Nodes {
				if c.Addrs[i] != s.Addr {
					t.Fatalf("Addrs[%d] = %q, node has %q", i, c.Addrs[i], s.Addr)
				}
				ci := InfoFields(must(t, s, "CLUSTER", "INFO"))
				if ci["cluster_state"] != "ok" || ci["cluster_slots_ok"] != "16384" {
					t.Fatalf("%s: state %q slots_ok %q", s.Addr, ci["cluster_state"], ci["cluster_slots_ok"])
				}
				roles[InfoFields(must(t, s, "INFO", "replication"))["role"]]++
			}
			if roles["master"] != tc.primaries || roles["slave"] != tc.primaries*tc.replicas {
				t.Fatalf("roles %v, want %d masters and %d replicas", roles, tc.primaries, tc.primaries*tc.replicas)
			}
			// A key is served by exactly one primary; every other primary redirects.
			served, moved := 0, 0
			for _, s := range c.Nodes {
				if InfoFields(must(t, s, "INFO", "replication"))["role"] != "master" {
					continue
				}
				_, err := s.Do("SET", "k", "v")
				var re ReplyError
				switch {
				case err == nil:
					served++
				case errors.As(err, &re) && strings.HasPrefix(string(re), "MOVED "):
					moved++
				default:
					t.Fatalf("%s SET: %v", s.Addr, err)
				}
			}
			if served != 1 || moved != tc.primaries-1 {
				t.Fatalf("SET served by %d primaries, MOVED by %d; want 1 and %d", served, moved, tc.primaries-1)
			}
		})
	}
}

// TestClusterFailover kills the primary of a slot and waits for its replica to take over,
// the scenario WaitOK exists for.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("slow cluster test skipped in -short mode")
	}
	c := StartCluster(t, 3, 1)
	// SET and WAIT share a connection because WAIT waits for the offset of that connection's
	// last write. Replication is asynchronous: without WAIT the kill can beat the write to the
	// replica, and the promoted replica rightly has no k.
	var primary *Server
	for _, s := range c.Nodes {
		replies, errs, err := pipeline(s.Addr, []string{"SET", "k", "v"}, []string{"WAIT", "1", "5000"})
		if err != nil {
			t.Fatalf("%s: %v", s.Addr, err)
		}
		if errs[0] != nil {
			continue // MOVED: another node owns k
		}
		if errs[1] != nil || replies[1] != "1" {
			t.Fatalf("%s: WAIT 1 = %q, %v; want 1 replica", s.Addr, replies[1], errs[1])
		}
		primary = s
		break
	}
	if primary == nil {
		t.Fatal("no node accepted SET k")
	}
	start := time.Now()
	primary.Kill()
	c.WaitOK(t)
	t.Logf("failover after %v", time.Since(start).Round(time.Millisecond))
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		got, err := s.Do("GET", "k")
		var re ReplyError
		if errors.As(err, &re) && strings.HasPrefix(string(re), "MOVED ") {
			continue
		}
		if err != nil || got != "v" {
			t.Fatalf("GET k on new primary %s = %q, %v; want v", s.Addr, got, err)
		}
		return
	}
	t.Fatal("no running node serves k after failover")
}

// fakeTB records how need ends a test; Skipf and Fatalf stop the goroutine as the real ones do.
type fakeTB struct {
	testing.TB
	skipped, fatal string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestMissingBinary checks a missing redis-server skips the test, unless SLUICE_REQUIRE_REDIS=1
// makes it fail. Not parallel: it sets environment variables.
func TestMissingBinary(t *testing.T) {
	for _, tc := range []struct {
		require   string
		wantFatal bool
	}{{"", false}, {"0", false}, {"1", true}} {
		t.Run("require="+tc.require, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.require)
			f := &fakeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				need(f, "redistest-no-such-binary")
			}()
			<-done
			if tc.wantFatal && f.fatal == "" || !tc.wantFatal && f.skipped == "" {
				t.Fatalf("skipped %q fatal %q; want fatal=%v", f.skipped, f.fatal, tc.wantFatal)
			}
		})
	}
}

// TestBadConfigFailsWithLog checks a server that cannot start fails the test quickly, with
// redis-server's own complaint in the message.
func TestBadConfigFailsWithLog(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		Start(f, WithConfig("no-such-directive yes"))
	}()
	<-done
	if !strings.Contains(f.fatal, "Bad directive or wrong number of arguments") {
		t.Fatalf("fatal = %q, want redis-server's config error", f.fatal)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("failing start took %v", d)
	}
}
