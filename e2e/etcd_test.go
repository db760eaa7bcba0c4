package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
)

// TestEtcdPolicy runs sluice with --config etcd://...: the keys under the prefix are its
// policy, a valid change is enforced, an invalid one is counted and the running policy kept,
// and a restarted etcd is followed again.
func TestEtcdPolicy(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	put := func(key, value string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Put(ctx, key, value); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	limit := func(n string) string {
		return "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: " + n + ", period: 1h}\n"
	}
	put("/sluice/policy/native.yaml", limit("1"))
	put("/sluice/policy/envoy.yaml", envoyPolicy)

	s := start(t, "etcd://"+e.Addr+"/sluice/policy", filepath.Join(t.TempDir(), "data"))
	v1 := s.policyVersion()
	s.post("/v1/check", `{"user":"u"}`)
	if code, _, _ := s.post("/v1/check", `{"user":"u"}`); code != 429 {
		t.Fatalf("second request at limit 1: %d", code)
	}

	put("/sluice/policy/native.yaml", limit("3"))
	v2 := waitVersionChange(t, s, v1)
	if code, _, body := s.post("/v1/check", `{"user":"u"}`); code != 200 || body["remaining"] != 1.0 {
		t.Fatalf("after raising to 3: %d %v", code, body)
	}

	put("/sluice/policy/native.yaml", "rules:\n  - {name: r, key: [user], limit: -1, period: 1h}\n")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.get("/metrics"), `sluice_policy_reloads_total{result="error"}`) {
		if time.Now().After(deadline) {
			t.Fatal("bad policy not counted in sluice_policy_reloads_total within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := s.policyVersion(); v != v2 {
		t.Fatalf("version %s after a bad change, want %s kept", v, v2)
	}
	if !strings.Contains(s.log.String(), "/sluice/policy/native.yaml:2: rules[0].limit: must be from 1") {
		t.Errorf("log does not name the key and the bad field:\n%s", s.log)
	}

	e.Restart(t)
	put("/sluice/policy/native.yaml", limit("10"))
	waitVersionChange(t, s, v2)
	if code, _, body := s.post("/v1/check", `{"user":"u"}`); code != 200 || body["remaining"] != 7.0 {
		t.Fatalf("after etcd restarted and the limit raised to 10: %d %v", code, body)
	}
}

// TestEtcdUnreachableStopsServe: a configured policy source that cannot be read at start stops
// serve, as an unreadable policy file does, with an error naming the source.
func TestEtcdUnreachableStopsServe(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	e.Kill() // its port is now one nothing answers on
	url := "etcd://" + e.Addr + "/sluice/policy"
	cmd := exec.Command(binary, "serve", "--config", url, "--http", freePort(t), "--grpc", freePort(t), "--data-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("serve started without its policy source:\n%s", out)
	}
	if !strings.Contains(string(out), "load policy: "+url) {
		t.Fatalf("error does not name the source %s:\n%s", url, out)
	}
}
