package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// readyz reads GET /readyz.
func (s *server) readyz(t *testing.T) (int, map[string]string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + s.http + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("/readyz answer %q: %v", raw, err)
	}
	return resp.StatusCode, m
}

// waitReady polls /readyz until it answers code, failing after a generous 15 s.
func (s *server) waitReady(t *testing.T, code int) map[string]string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, body := s.readyz(t)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %v after 15 s, want %d", got, body, code)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReadyzFollowsRedis: /readyz is 503 naming the store while Redis is dead, and 200 again
// once it is back, through the breaker and hot-key guards; the memory store is always up.
func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, "rules:\n  - {name: r, key: [user], algorithm: gcra, limit: 1000, period: 1s, on_store_error: open}\n")
	s := start(t, path, filepath.Join(dir, "data"), "SLUICE_STORE=redis://"+redis.Addr, "SLUICE_HOT_KEYS=true")

	body := s.waitReady(t, 200)
	if body["status"] != "ready" || body["store"] != "up" || body["policy_version"] == "" {
		t.Fatalf("/readyz with Redis up: %v", body)
	}
	redis.Kill()
	body = s.waitReady(t, 503)
	if body["status"] != "not ready" || body["store"] != "down" || !strings.HasPrefix(body["error"], "store: ") || body["policy_version"] == "" {
		t.Fatalf("/readyz with Redis dead: %v", body)
	}
	// Decisions go on meanwhile, by on_store_error.
	if code, _, d := s.post("/v1/check", `{"user":"u"}`); code != 200 || d["degraded"] != true {
		t.Errorf("check with Redis dead: %d %v", code, d)
	}
	redis.Restart(t)
	body = s.waitReady(t, 200)
	if body["store"] != "up" || body["error"] != "" {
		t.Fatalf("/readyz with Redis back: %v", body)
	}

	m := start(t, "", filepath.Join(dir, "memory-data"))
	if code, body := m.readyz(t); code != 200 || body["store"] != "up" {
		t.Fatalf("/readyz on the memory store: %d %v", code, body)
	}
}
