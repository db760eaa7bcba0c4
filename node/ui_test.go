package node

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// TestHeartbeatStatsFit keeps a heartbeat's stats within what the control store takes: whole
// when they fit, without the top lists when those make them too long.
func TestHeartbeatStatsFit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("u", fleetstats.MaxKeyLen)
	for _, tc := range []struct {
		name     string
		rules    int
		callers  int
		wantTops bool
	}{
		{"small", 3, 5, true},
		{"most rules by default, longest keys", fleetstats.DefaultMaxRules, fleetstats.DefaultTopReport, true},
		// A collector keeping more rules than the default: past 1 MiB with the top lists.
		{"600 rules, longest keys", 600, fleetstats.DefaultTopReport, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fleetstats.New(fleetstats.Options{Node: "n1", Store: "memory", MaxRules: tc.rules})
			for r := range tc.rules {
				for u := range tc.callers {
					c.Observe(usage.Observation{Rule: fmt.Sprintf("rule-%d", r), Tenant: "acme", User: fmt.Sprintf("%d-%s", u, long)})
				}
			}
			b := heartbeatStats(c, slog.New(slog.DiscardHandler))()
			if len(b) == 0 || len(b) > control.MaxNodeStatsLen {
				t.Fatalf("%d bytes, want 1 to %d", len(b), control.MaxNodeStatsLen)
			}
			var s fleetstats.NodeStats
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			if len(s.Rules) != tc.rules {
				t.Fatalf("%d rules, want %d", len(s.Rules), tc.rules)
			}
			if got := len(s.Rules[0].Top.Counters) > 0; got != tc.wantTops {
				t.Errorf("top lists sent: %v, want %v", got, tc.wantTops)
			}
			if s.Rules[0].Total.Allowed != int64(tc.callers) {
				t.Errorf("rule-0 allowed %d, want %d", s.Rules[0].Total.Allowed, tc.callers)
			}
		})
	}
}

// TestMountUI serves the dashboard at /ui/ and sends GET / there, and nothing else.
func TestMountUI(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	mountUI(mux)
	for _, tc := range []struct {
		method, path string
		code         int
		location     string
	}{
		{"GET", "/", http.StatusFound, "/ui/"},
		{"GET", "/ui", http.StatusTemporaryRedirect, "/ui/"},
		{"GET", "/ui/", http.StatusOK, ""},
		{"GET", "/ui/app.js", http.StatusOK, ""},
		{"POST", "/", http.StatusTeapot, ""},
		{"GET", "/v1/other", http.StatusTeapot, ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
			if rec.Code != tc.code || rec.Header().Get("Location") != tc.location {
				t.Errorf("%d Location %q, want %d %q", rec.Code, rec.Header().Get("Location"), tc.code, tc.location)
			}
		})
	}
}
