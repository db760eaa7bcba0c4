package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestSplitControlPlaneDetected (issue 29): two nodes on one Redis, each with its own SQLite
// control store, see each other through their heartbeats in Redis: /readyz stays 200 (each
// still decides) and its control_plane check is down, and its error names the other node and the fix, and each
// logs it. A node alone on its Redis says nothing.
func TestSplitControlPlaneDetected(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, nativePolicy)
	env := []string{"SLUICE_STORE=redis://" + srv.Addr}
	a := start(t, path, filepath.Join(dir, "a"), append(env, "SLUICE_NODE_ID=node-a")...)
	alone := redistest.Start(t)
	solo := start(t, path, filepath.Join(dir, "solo"), "SLUICE_STORE=redis://"+alone.Addr, "SLUICE_NODE_ID=node-solo")
	b := start(t, path, filepath.Join(dir, "b"), append(env, "SLUICE_NODE_ID=node-b")...)
	for _, c := range []struct {
		n           *server
		name, other string
	}{{a, "node-a", "node-b"}, {b, "node-b", "node-a"}} {
		waitFor(t, 30*time.Second, c.other+" seen as a split control plane", func() bool {
			code, body := c.n.readyz(t)
			msg := body["error"]
			return code == 200 && body["control_plane"] == "down" && strings.Contains(msg, c.other) && strings.Contains(msg, "--control")
		})
		// The readiness check turns before the line is logged: wait for it rather than read
		// the log at once.
		waitFor(t, 10*time.Second, c.name+" logging the split and the fix", func() bool {
			log := c.n.log.String()
			return strings.Contains(log, "split control plane") && strings.Contains(log, "--control postgres://")
		})
	}
	time.Sleep(3 * time.Second) // a heartbeat or more of the node alone
	if code, body := solo.readyz(t); code != 200 || body["control_plane"] != "up" {
		t.Errorf("a node alone on its Redis: /readyz %d %v", code, body)
	}
}
