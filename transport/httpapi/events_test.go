package httpapi_test

import (
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// This file is in the external test package because node, whose usage writer it counts
// through, imports httpapi.

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
	s := httpapi.New(testutil.Limiter(t, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 3, period: 1m}
`, testutil.NewClock()), nil, httpapi.Options{Events: rec})
	post := func(path, body string) {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		s.ServeHTTP(httptest.NewRecorder(), r)
	}
	for range 4 { // per-user allows 3 a minute
		post("/v1/check", `{"tenant":"t","user":"u"}`)
	}
	post("/v1/quota", `{"tenant":"t","user":"u"}`)
	post("/v1/check", `{"tenant":"t","user":"u","cost":0}`)
	post("/v1/check", `{"tenant":"t","user":"u","cost":-1}`)
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
