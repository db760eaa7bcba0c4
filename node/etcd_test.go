package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

func TestParseEtcdURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, url       string
		endpoints       []string
		prefix, display string
		user, pass      string
		tls             bool
		err             string
	}{
		{name: "one host", url: "etcd://127.0.0.1:2379/sluice/policy", endpoints: []string{"http://127.0.0.1:2379"}, prefix: "/sluice/policy/", display: "etcd://127.0.0.1:2379/sluice/policy"},
		{name: "trailing slash", url: "etcd://e:2379/sluice/", endpoints: []string{"http://e:2379"}, prefix: "/sluice/", display: "etcd://e:2379/sluice/"},
		{name: "cluster", url: "etcd://a:2379,b:2379,c:2379/p", endpoints: []string{"http://a:2379", "http://b:2379", "http://c:2379"}, prefix: "/p/", display: "etcd://a:2379,b:2379,c:2379/p"},
		{name: "tls and user", url: "etcd+https://ann:s3cret@e:2379/p", endpoints: []string{"https://e:2379"}, prefix: "/p/", user: "ann", pass: "s3cret", tls: true, display: "etcd+https://ann:xxxxx@e:2379/p"},
		{name: "no prefix", url: "etcd://e:2379", err: "no key prefix"},
		{name: "root prefix", url: "etcd://e:2379/", err: "no key prefix"},
		{name: "no host", url: "etcd:///p", err: "no etcd host"},
		{name: "empty host in list", url: "etcd://a:2379,,b/p", err: "bad etcd host"},
		{name: "password kept out of errors", url: "etcd://ann:s3cret@/p", err: "no etcd host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, prefix, display, err := parseEtcdURL(c.url)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(cfg.Endpoints, " ") != strings.Join(c.endpoints, " ") || prefix != c.prefix || display != c.display {
				t.Fatalf("got %v %q %q, want %v %q %q", cfg.Endpoints, prefix, display, c.endpoints, c.prefix, c.display)
			}
			if cfg.Username != c.user || cfg.Password != c.pass || (cfg.TLS != nil) != c.tls {
				t.Fatalf("user %q pass %q tls %v", cfg.Username, cfg.Password, cfg.TLS != nil)
			}
		})
	}
}

const (
	etcdNative  = "rules:\n  - {name: per-user, key: [user], algorithm: fixed_window, limit: %d, period: 1h}\n"
	etcdEnvoy   = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"
	etcdInvalid = "rules:\n  - {name: per-user, key: [user], algorithm: fixed_window, limit: -1, period: 1h}\n"
)

func limitPolicy(n int) string { return fmt.Sprintf(etcdNative, n) }

// etcdNode is a node whose policy comes from an etcd prefix: a real Limiter and Runtime on a
// SQLite control store, and the etcd source's watch running.
type etcdNode struct {
	lim *sluice.Limiter
	rt  *follower.Runtime
	reg *prometheus.Registry
}

func startEtcdNode(t *testing.T, url string) *etcdNode {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := openPolicy(t.Context(), url, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.close() })
	ctrl, err := sqlite.Open(t.Context(), sqlite.Path(filepath.Join(t.TempDir(), "data")), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrl.Close() })
	lim, err := sluice.New(memory.New(), src.files.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	rt, err := follower.New(follower.Options{Store: ctrl, Limiter: lim, Files: src.files, FilesPath: src.name, NodeID: "n1", Addr: "127.0.0.1:1", Metrics: m, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rt.Start(ctx)
	done := make(chan struct{})
	go func() { defer close(done); src.watch(ctx, rt, m, log) }()
	t.Cleanup(func() { cancel(); <-done; rt.Close() })
	return &etcdNode{lim: lim, rt: rt, reg: reg}
}

// allowedN checks user u n times and returns how many were allowed.
func (n *etcdNode) allowedN(t *testing.T, u string, count int) int {
	t.Helper()
	allowed := 0
	for range count {
		var d sluice.Decision
		if err := n.lim.Check(t.Context(), &sluice.Request{User: u}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// reloads returns sluice_policy_reloads_total{result}.
func (n *etcdNode) reloads(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_policy_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// eventually polls cond for up to 15 s: watches and reconnections are asynchronous, and the
// bound is generous so that only a watch that never fires fails.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func etcdClient(t *testing.T, s *etcdtest.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func put(t *testing.T, c *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, value); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func TestEtcdPolicySource(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := etcdClient(t, s)
	put(t, c, "/sluice/policy/native.yaml", limitPolicy(2))
	put(t, c, "/sluice/policy/envoy.yaml", etcdEnvoy)
	put(t, c, "/sluice/policy-other/x.yaml", "not: [a policy") // beside the prefix: never read
	put(t, c, "/sluice/other.yaml", etcdInvalid)               // outside it: never read

	n := startEtcdNode(t, "etcd://"+s.Addr+"/sluice/policy")
	start := n.rt.Files().Version
	if snap := n.rt.Files().Snapshot(); len(snap.Rules()) != 1 || snap.Envoy() == nil {
		t.Fatalf("initial load: %s", Describe(snap))
	}
	if got := n.allowedN(t, "ann", 3); got != 2 {
		t.Fatalf("initial policy: %d of 3 allowed, want 2", got)
	}

	// A valid change is enforced.
	put(t, c, "/sluice/policy/native.yaml", limitPolicy(4))
	eventually(t, "the new policy", func() bool { return n.rt.Files().Version != start })
	if got := n.allowedN(t, "bob", 5); got != 4 {
		t.Fatalf("changed policy: %d of 5 allowed, want 4", got)
	}
	good := n.rt.Files().Version
	errorsBefore := n.reloads(t, "error")

	// An invalid change is counted and ignored; so is deleting every key.
	put(t, c, "/sluice/policy/native.yaml", etcdInvalid)
	eventually(t, "the invalid change counted", func() bool { return n.reloads(t, "error") > errorsBefore })
	if v := n.rt.Files().Version; v != good {
		t.Fatalf("version after an invalid change: %s, want %s kept", v, good)
	}
	errorsBefore = n.reloads(t, "error")
	if _, err := c.Delete(t.Context(), "/sluice/policy/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the emptied prefix counted", func() bool { return n.reloads(t, "error") > errorsBefore })
	if v := n.rt.Files().Version; v != good {
		t.Fatalf("version after deleting every key: %s, want %s kept", v, good)
	}
	if got := n.allowedN(t, "cid", 5); got != 4 {
		t.Fatalf("after refused changes: %d of 5 allowed, want the last good limit 4", got)
	}

	// etcd restarts: the watch resumes, and a change made afterwards is enforced.
	s.Restart(t)
	put(t, c, "/sluice/policy/native.yaml", limitPolicy(7))
	eventually(t, "the change after a restart", func() bool { return n.rt.Files().Version != good })
	if got := n.allowedN(t, "dan", 8); got != 7 {
		t.Fatalf("after restart: %d of 8 allowed, want 7", got)
	}
}

// startEtcdNodeAhead starts an etcd, writes a policy there 20 times (revisions the node will
// have seen, so that a member restored empty is behind its watch), and a node watching it.
func startEtcdNodeAhead(t *testing.T) (*etcdtest.Server, *clientv3.Client, *etcdNode) {
	t.Helper()
	s := etcdtest.Start(t)
	c := etcdClient(t, s)
	for range 20 {
		put(t, c, "/sluice/p/a.yaml", limitPolicy(2))
	}
	return s, c, startEtcdNode(t, "etcd://"+s.Addr+"/sluice/p")
}

// TestEtcdReconnectRereads shows that what changed while the node could not reach etcd is
// read when it reaches etcd again, even when the watch cannot replay it: the member it finds
// was restored with other data, at a revision the watch had already passed.
func TestEtcdReconnectRereads(t *testing.T) {
	t.Parallel()
	s, c, n := startEtcdNodeAhead(t)
	// A change seen shows the watch is running before the member goes away.
	start := n.rt.Files().Version
	put(t, c, "/sluice/p/a.yaml", limitPolicy(3))
	eventually(t, "the change before the restore", func() bool { return n.rt.Files().Version != start })
	start = n.rt.Files().Version

	// Replace the member's data with a fresh cluster holding another policy, at revision 2.
	s.RestartEmpty(t)
	c2 := etcdClient(t, s)
	put(t, c2, "/sluice/p/a.yaml", limitPolicy(9))
	eventually(t, "the policy read on reconnect", func() bool { return n.rt.Files().Version != start })
	if got := n.allowedN(t, "eve", 10); got != 9 {
		t.Fatalf("after reconnect: %d of 10 allowed, want 9", got)
	}
}

// TestEtcdReconnectThenChange: the node reconnects to a member with other data (a new
// cluster, empty, its revisions below those the node saw) before anything is written there;
// a change made after must still be seen, though its revision is below the old watch's.
func TestEtcdReconnectThenChange(t *testing.T) {
	t.Parallel()
	s, _, n := startEtcdNodeAhead(t)
	start := n.rt.Files().Version
	failed := n.reloads(t, "error")

	s.RestartEmpty(t)
	// The node read the empty prefix on reconnect (refused, counted as a failed reload).
	eventually(t, "the read of the empty cluster on reconnect", func() bool { return n.reloads(t, "error") > failed })
	put(t, etcdClient(t, s), "/sluice/p/a.yaml", limitPolicy(9))
	eventually(t, "the change after the reconnect", func() bool { return n.rt.Files().Version != start })
	if got := n.allowedN(t, "eve", 10); got != 9 {
		t.Fatalf("after the change: %d of 10 allowed, want 9", got)
	}
}

func TestEtcdUnreachableAtStart(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A port nothing listens on: Start and Kill an etcd to get one that was free.
	s := etcdtest.Start(t)
	s.Kill()
	begin := time.Now()
	_, err := openPolicy(t.Context(), "etcd://"+s.Addr+"/sluice/policy", log)
	if err == nil || !strings.Contains(err.Error(), "etcd://"+s.Addr+"/sluice/policy") {
		t.Fatalf("err = %v, want an error naming the source", err)
	}
	if d := time.Since(begin); d > 30*time.Second {
		t.Fatalf("took %v to fail", d)
	}
}

func TestEtcdEmptyOrInvalidAtStart(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := etcdClient(t, s)
	put(t, c, "/bad/p.yaml", etcdInvalid)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct{ name, prefix, want string }{
		{"empty prefix", "/empty", "no keys under /empty/"},
		{"invalid document", "/bad", "/bad/p.yaml:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openPolicy(t.Context(), "etcd://"+s.Addr+tc.prefix, log)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
