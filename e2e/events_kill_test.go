package e2e

import (
	"net/url"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"
)

// TestCountsSurviveSIGKILL: a node killed with SIGKILL loses at most --events-flush (1 s by
// default) of its decision counts. It decides checks, stays idle a little over two flushes
// (room for a loaded machine), and is killed; restarted on the same data dir (its embedded
// control store), it reports every decision in the usage history. With the old 5 s flush the
// kill falls before the counts are written as often as not.
func TestCountsSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, nativePolicy)
	dataDir := filepath.Join(dir, "data")
	env := []string{"SLUICE_ADMIN_TOKEN=" + e2eAdminToken}
	n := start(t, path, dataDir, env...)
	// per-user allows 5 per hour, soft from 60%: of 8 checks, 2 normal, 3 soft, 3 denied.
	for u := range 20 {
		for range 8 {
			n.checkStatus(`{"tenant":"acme","user":"u` + string(rune('a'+u)) + `"}`)
		}
	}
	time.Sleep(2500 * time.Millisecond)
	n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	n = start(t, path, dataDir, env...)
	q := "rule=per-user&tenant=acme&step=1h&from=" + url.QueryEscape(time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339))
	want := map[string]int{"allowed": 20 * 2, "soft": 20 * 3, "denied": 20 * 3}
	if got := n.usageTotals(q); !reflect.DeepEqual(got, want) {
		t.Errorf("after SIGKILL 2.5 s after the last check: usage %v, want %v", got, want)
	}
	n.stop()
}
