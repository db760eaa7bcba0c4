package httpapi

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// TestEventsCountChecksNotLooks: POST /v1/check decisions are counted for the usage history;
// /v1/quota, a cost of 0 and bad input are not.
func TestEventsCountChecksNotLooks(t *testing.T) {
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
	s := New(testutil.Limiter(t, testPolicy, testutil.NewClock()), nil, Options{Events: rec})
	for range 4 { // per-user allows 3 a minute
		post(s, "/v1/check", `{"tenant":"t","user":"u"}`)
	}
	post(s, "/v1/quota", `{"tenant":"t","user":"u"}`)
	post(s, "/v1/check", `{"tenant":"t","user":"u","cost":0}`)
	post(s, "/v1/check", `{"tenant":"t","user":"u","cost":-1}`)
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Rule: "per-user", Step: 24 * time.Hour})
	if err != nil || len(pts) != 1 {
		t.Fatalf("UsageHistory = %+v, %v; want one point", pts, err)
	}
	if got, want := pts[0], (control.UsagePoint{At: pts[0].At, Allowed: 3, Denied: 1}); !reflect.DeepEqual(got, want) {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
}
