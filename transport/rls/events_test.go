package rls_test

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
	"github.com/sluicehq/sluice/transport/rls"
)

// TestEventsCountDecisionsNotLooks: ShouldRateLimit decisions are counted for the usage
// history under the limit's domain/id; a descriptor of hits_addend 0 (a look) is not.
func TestEventsCountDecisionsNotLooks(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "control.db"), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := usage.New(usage.Options{Writer: node.UsageWriter(st), Flush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close(t.Context())
	srv, _ := newServer(t, rls.Options{Events: rec}, nil)
	for range 4 { // 3 a minute per client
		if _, err := srv.ShouldRateLimit(t.Context(), edge(desc("client_id", "acme"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.ShouldRateLimit(t.Context(), edge(descHits(0, desc("client_id", "acme")))); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Rule: "edge/client_id", Step: 24 * time.Hour})
	if err != nil || len(pts) != 1 {
		t.Fatalf("UsageHistory = %+v, %v; want one point", pts, err)
	}
	if got, want := pts[0], (control.UsagePoint{At: pts[0].At, Allowed: 3, Denied: 1}); !reflect.DeepEqual(got, want) {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
}
