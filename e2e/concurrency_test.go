package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

const slotPolicy = `
rules:
  - {name: gpus, match: {endpoint: /gpu}, key: [tenant], algorithm: concurrency, limit: 3}
`

// TestConcurrencyAcrossNodes: two sluice processes share a Redis and a concurrency limit of 3
// per tenant. Slots taken on either count on both; a node killed with SIGKILL while holding
// two leaves them held until their ttl, not before (the first reservation it lets through
// comes at least the ttl after the slots were taken) and not never (within 15 s of it).
func TestConcurrencyAcrossNodes(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, slotPolicy)
	env := []string{"SLUICE_STORE=redis://" + redis.Addr}
	a, b := start(t, path, filepath.Join(dir, "a"), env...), start(t, path, filepath.Join(dir, "b"), env...)
	const ttl = 4 * time.Second
	reserve := func(s *server, ttl string) (int, string) {
		t.Helper()
		code, _, m := s.post("/v1/reserve", `{"tenant":"acme","endpoint":"/gpu","ttl":"`+ttl+`"}`)
		lease, _ := m["lease"].(string)
		if code == 200 && !strings.HasPrefix(lease, "ls_") {
			t.Fatalf("reserve: 200 without a lease: %v", m)
		}
		return code, lease
	}
	free := func(s *server) float64 {
		t.Helper()
		_, _, m := s.post("/v1/quota", `{"tenant":"acme","endpoint":"/gpu"}`)
		r := m["results"].([]any)[0].(map[string]any)
		if r["in_flight"] != 3-m["remaining"].(float64) {
			t.Fatalf("quota: in_flight %v beside remaining %v of 3", r["in_flight"], m["remaining"])
		}
		return m["remaining"].(float64)
	}
	taken := time.Now()
	for i := range 2 {
		if code, _ := reserve(a, ttl.String()); code != 200 {
			t.Fatalf("slot %d on a: %d", i, code)
		}
	}
	code, held := reserve(b, "1m")
	if code != 200 {
		t.Fatalf("third slot on b: %d", code)
	}
	if code, _ := reserve(b, "1m"); code != 429 {
		t.Fatalf("a fourth slot of 3 on b: %d, want 429", code)
	}
	if got := free(a); got != 0 {
		t.Fatalf("node a sees %v slots free, want 0", got)
	}
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
	if code, _ := reserve(b, "1m"); code != 429 {
		t.Fatalf("right after a died holding 2 slots: %d, want 429 (its slots are held until their ttl)", code)
	}
	deadline := taken.Add(ttl + 15*time.Second)
	for {
		code, _ := reserve(b, "1m")
		if code == 200 {
			if waited := time.Since(taken); waited < ttl {
				t.Fatalf("a dead node's slot came back %s after it was taken, before its ttl %s", waited, ttl)
			}
			break
		}
		if code != 429 || time.Now().After(deadline) {
			t.Fatalf("a dead node's slots, %s after they were taken with a ttl of %s: %d", time.Since(taken), ttl, code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a's second slot, taken a moment after the first, comes back too: then one is free
	// (one just taken, b's first still held).
	for free(b) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a dead node's second slot, %s after it was taken with a ttl of %s: %v free, want 1", time.Since(taken), ttl, free(b))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _, m := b.post("/v1/release", `{"tenant":"acme","lease":"`+held+`"}`); code != 200 {
		t.Fatalf("release: %d %v", code, m)
	}
	if got := free(b); got != 2 {
		t.Fatalf("after a release: %v free, want 2", got)
	}
	m := b.get("/metrics")
	if !strings.Contains(m, `sluice_concurrency_slots_total{event="taken"} 2`) || !strings.Contains(m, `sluice_concurrency_slots_total{event="freed"} 1`) ||
		!strings.Contains(m, `sluice_concurrency_slots_total{event="refused"}`) {
		t.Fatalf("node b's slot metrics:\n%s", grepLines(m, "slots"))
	}
}
