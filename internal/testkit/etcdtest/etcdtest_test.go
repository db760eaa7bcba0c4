package etcdtest

import (
	"net/http"
	"testing"
)

// TestStartRestart starts a server, restarts it on the same ports, and checks it is healthy
// each time and gone after Kill.
func TestStartRestart(t *testing.T) {
	s := Start(t)
	healthy := func() bool {
		resp, err := http.Get(s.Endpoint + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !healthy() || !s.Running() {
		t.Fatal("not healthy after Start")
	}
	s.Restart(t)
	if !healthy() {
		t.Fatal("not healthy after Restart")
	}
	s.Kill()
	if s.Running() || healthy() {
		t.Fatal("still answering after Kill")
	}
}
