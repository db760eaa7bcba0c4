package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
)

// TestServeFollowsItsSQLiteControlStore: with no --control, serve keeps its control store in
// <data-dir>/control.db; a change written to it (here by another process) is enforced, a
// policy file reload keeps it and is audited, and /admin/v1/ answers 404 until the admin API
// is mounted.
func TestServeFollowsItsSQLiteControlStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, nativePolicy)
	dataDir := filepath.Join(dir, "data")
	s := start(t, path, dataDir)

	code, body := s.readyz(t)
	// The first start made the bootstrap admin token: control version 1.
	if code != 200 || body["control_store"] != "up" || !strings.HasSuffix(body["policy_version"], ".1") {
		t.Fatalf("/readyz: %d %v", code, body)
	}
	if got := s.getStatus("/admin/v1/rules"); got != 401 {
		t.Errorf("/admin/v1/rules without a token answered %d, want 401", got)
	}
	if info, err := os.Stat(filepath.Join(dataDir, "admin.token")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("the first start's admin token file: %v, %v", info, err)
	}

	st, err := sqlite.Open(t.Context(), filepath.Join(dataDir, sqlite.FileName), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateOverride(t.Context(), control.Change{Actor: "e2e"}, control.Override{
		Tenant: "acme", Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour), Source: control.SourceAPI, Reason: "e2e",
	}); err != nil {
		t.Fatal(err)
	}
	// Written by another process: the server's version poll (every second) sees it.
	waitCode(t, s, `{"tenant":"acme","user":"u"}`, 429, 5*time.Second)

	writeFile(t, path, nativePolicy+"  - {name: extra, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}\n")
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := st.Audit(t.Context(), control.AuditFilter{Kind: control.KindPolicyFiles})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 2 && evs[0].Actor == "file:"+path && evs[0].Before != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("policy_files audit events after a reload: %+v", evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _, _ := s.post("/v1/check", `{"tenant":"acme","user":"u"}`); code != 429 {
		t.Errorf("acme answered %d after the files reload: the control store's ban was lost", code)
	}
	s.stop()
}

// TestServeWithControlStoreDown: a PostgreSQL control store that does not answer at start
// does not keep serve from starting; it decides on its files and /readyz names the control
// store down while staying 200.
func TestServeWithControlStoreDown(t *testing.T) {
	dir := t.TempDir()
	url := "postgres://sluice@" + freePort(t) + "/sluice?sslmode=disable&connect_timeout=1"
	s := start(t, "", filepath.Join(dir, "data"), "SLUICE_CONTROL="+url)
	if code, _, _ := s.post("/v1/check", `{"user":"u"}`); code != 200 {
		t.Fatalf("check answered %d with the control store down", code)
	}
	code, body := s.readyz(t)
	if code != 200 || body["status"] != "ready" || body["control_store"] != "down" || !strings.Contains(body["error"], "control_store") {
		t.Errorf("/readyz with the control store down: %d %v", code, body)
	}
	if !strings.Contains(s.get("/metrics"), "sluice_control_store_up 0") {
		t.Error("sluice_control_store_up is not 0")
	}
	s.stop()
}

// waitCode posts body to /v1/check until it answers code.
func waitCode(t *testing.T, s *server, body string, code int, limit time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		got, _, m := s.post("/v1/check", body)
		if got == code {
			return
		}
		select {
		case <-ctx.Done():
			b, _ := json.Marshal(m)
			t.Fatalf("check %s answered %d %s for %v, want %d", body, got, b, limit, code)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// getStatus returns the status of GET path.
func (s *server) getStatus(path string) int {
	s.t.Helper()
	resp, err := http.Get("http://" + s.http + path)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
