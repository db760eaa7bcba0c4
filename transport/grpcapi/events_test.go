package grpcapi_test

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
	"github.com/sluicehq/sluice/transport/grpcapi"
)

// This file is in the external test package because node, whose usage writer it counts
// through, imports grpcapi.

// TestEventsCountChecksNotLooks: Check decisions are counted for the usage history; GetQuota
// and a Check of cost 0 are not.
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
	l := testutil.Limiter(t, `
rules:
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 2, period: 1h}
`, testutil.NewClock())
	srv := grpcapi.New(l, nil, grpcapi.WithEvents(rec))
	for range 3 {
		if _, err := srv.Check(t.Context(), &sluicev1.CheckRequest{Tenant: "t", User: "u"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.GetQuota(t.Context(), &sluicev1.CheckRequest{Tenant: "t", User: "u"}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Check(t.Context(), &sluicev1.CheckRequest{Tenant: "t", User: "u", Cost: proto.Int64(0)}); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	pts, err := st.UsageHistory(t.Context(), control.UsageFilter{Step: 24 * time.Hour})
	if err != nil || len(pts) != 1 {
		t.Fatalf("UsageHistory = %+v, %v; want one point", pts, err)
	}
	if got, want := pts[0], (control.UsagePoint{At: pts[0].At, Allowed: 2, Denied: 1}); !reflect.DeepEqual(got, want) {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
}
