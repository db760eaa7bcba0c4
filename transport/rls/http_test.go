package rls_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/transport/rls"
)

// postJSON sends body to h as POST /json and returns the status and body.
func postJSON(t *testing.T, h http.Handler, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

// TestJSONMatchesGRPC: /json decides as ShouldRateLimit over gRPC does. The same requests go
// to two servers with the same policy and clock, one over gRPC and one as JSON: every answer
// is the same message, and the status follows the overall code as in the reference (200 OK,
// 429 OVER_LIMIT).
func TestJSONMatchesGRPC(t *testing.T) {
	t.Parallel()
	o := rls.Options{ResponseHeaders: true}
	client, _ := newClient(t, o)
	srv, _ := newServer(t, o, nil)
	h := srv.JSONHandler(0)

	requests := []*rlsv3.RateLimitRequest{
		edge(desc("client_id", "c1")),
		edge(desc("client_id", "c1"), desc("path", "/export")),
		hits(2, edge(desc("client_id", "c1"))), // 3 + 2 hits of 3 a minute: over
		edge(desc("client_id", "gold")),
		edge(desc("path", "/export")), // the hour's 1 was taken above
		edge(desc("path", "/beta"), desc("path", "/beta")),
		edge(desc("client_id", "internal")),
		req("unknown-domain", desc("k", "v")),
		edge(descLimit(1, typev3.RateLimitUnit_SECOND, desc("client_id", "override"))), // per-request limit: 1 a second
		edge(descLimit(1, typev3.RateLimitUnit_SECOND, desc("client_id", "override"))),
	}
	for i, in := range requests {
		want, err := client.ShouldRateLimit(context.Background(), in)
		if err != nil {
			t.Fatalf("request %d over gRPC: %v", i, err)
		}
		body, err := protojson.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		code, out := postJSON(t, h, string(body))
		var got rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("request %d: answer %d %q is not a RateLimitResponse: %v", i, code, out, err)
		}
		if !proto.Equal(&got, want) {
			t.Errorf("request %d (%v):\n /json %v\n  gRPC %v", i, in, &got, want)
		}
		wantCode := http.StatusOK
		if want.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			wantCode = http.StatusTooManyRequests
		}
		if code != wantCode {
			t.Errorf("request %d: status %d for %v, want %d", i, code, want.GetOverallCode(), wantCode)
		}
	}
}

// TestJSONWireForm: the body is protobuf's JSON mapping, as the reference's (which marshals
// with protojson too): lowerCamelCase names, enums by name, durations as "50s"; requests may
// use the .proto's own names.
func TestJSONWireForm(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, rls.Options{}, nil)
	h := srv.JSONHandler(0)
	// The reference's own example, with snake_case hits_addend: 3 + 1 of 3 a minute.
	code, out := postJSON(t, h, `{"domain": "edge", "hits_addend": 3, "descriptors": [{"entries": [{"key": "client_id", "value": "c9"}]}]}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, out)
	}
	code, out = postJSON(t, h, `{"domain": "edge", "hitsAddend": 1, "descriptors": [{"entries": [{"key": "client_id", "value": "c9"}]}]}`)
	if code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", code, out)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	st := got["statuses"].([]any)[0].(map[string]any)
	if got["overallCode"] != "OVER_LIMIT" || st["code"] != "OVER_LIMIT" ||
		st["currentLimit"].(map[string]any)["unit"] != "MINUTE" ||
		st["currentLimit"].(map[string]any)["requestsPerUnit"] != 3.0 ||
		st["durationUntilReset"] != "50s" {
		t.Errorf("answer %s", out)
	}
}

// TestJSONBadInput: what is not a valid RateLimitRequest is 400 with {"error": ...} naming
// the problem, counted as rejected and consuming nothing; a body over the cap is 413.
func TestJSONBadInput(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	srv, _ := newServer(t, rls.Options{}, metrics.New(reg, "memory"))
	h := srv.JSONHandler(256)
	tests := []struct {
		name, body string
		code       int
		msg        string
	}{
		{name: "empty body", body: ``, code: 400, msg: "RateLimitRequest"},
		{name: "not JSON", body: `domain=edge`, code: 400, msg: "RateLimitRequest"},
		{name: "unknown field", body: `{"domain": "edge", "descriptor": []}`, code: 400, msg: "descriptor"},
		{name: "field twice", body: `{"domain": "edge", "domain": "other"}`, code: 400, msg: "domain"},
		{name: "wrong type", body: `{"domain": "edge", "hits_addend": "many"}`, code: 400, msg: "hitsAddend"},
		{name: "no domain", body: `{"descriptors": [{"entries": [{"key": "client_id", "value": "c1"}]}]}`, code: 400, msg: "domain"},
		{name: "no descriptors", body: `{"domain": "edge"}`, code: 400, msg: "descriptors"},
		{name: "refund", body: `{"domain": "edge", "descriptors": [{"entries": [{"key": "client_id", "value": "c1"}], "is_negative_hits": true}]}`, code: 400, msg: "is_negative_hits"},
		{name: "over the cap", body: `{"domain": "edge", "descriptors": [{"entries": [{"key": "client_id", "value": "` + strings.Repeat("x", 300) + `"}]}]}`, code: 413, msg: "larger"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := postJSON(t, h, tc.body)
			var e map[string]string
			if err := json.Unmarshal([]byte(out), &e); err != nil {
				t.Fatalf("body %q is not JSON: %v", out, err)
			}
			if code != tc.code || !strings.Contains(e["error"], tc.msg) {
				t.Errorf("%d %q, want %d naming %q", code, e["error"], tc.code, tc.msg)
			}
		})
	}
	if n := counterValue(t, reg, "sluice_requests_rejected_total", "api", "rls", "reason", "invalid"); n != float64(len(tests)) {
		t.Errorf("%v rejections counted, want %d", n, len(tests))
	}
	// Nothing was consumed: client c1 still has its 3 a minute.
	for i := range 3 {
		if code, out := postJSON(t, h, `{"domain": "edge", "descriptors": [{"entries": [{"key": "client_id", "value": "c1"}]}]}`); code != http.StatusOK {
			t.Fatalf("hit %d after the bad requests: %d %s", i+1, code, out)
		}
	}
}

// counterValue returns the gathered value of the counter name with the label pairs kv, or 0.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if labels[kv[i]] != kv[i+1] {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestHealthcheck: GET /healthcheck is 200 "OK", as the reference's, until Fail (shutdown),
// then 500.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	var h rls.Healthcheck
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthcheck", nil))
		body, _ := io.ReadAll(rec.Body)
		return rec.Code, string(body)
	}
	if code, body := get(); code != http.StatusOK || body != "OK" {
		t.Fatalf("serving: %d %q, want 200 \"OK\"", code, body)
	}
	h.Fail()
	if code, _ := get(); code != http.StatusInternalServerError {
		t.Fatalf("after Fail: %d, want 500", code)
	}
}
