package overload

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testkit/testutil"
)

func TestGateRefusesPastItsSize(t *testing.T) {
	t.Parallel()
	var rejected int
	g := NewGate(2, func(string) { rejected++ })
	release := make(chan struct{})
	inside := make(chan struct{}, 2)
	h := g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		<-release
	}))
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/check", nil))
		}()
	}
	<-inside
	<-inside
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || rejected != 1 {
		t.Fatalf("third request: %d %v (rejected %d)", w.Code, w.Header(), rejected)
	}
	// Health answers even when full.
	hw := httptest.NewRecorder()
	g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })).ServeHTTP(hw, httptest.NewRequest("GET", "/healthz", nil))
	if hw.Code != 200 {
		t.Fatalf("healthz when full: %d", hw.Code)
	}
	close(release)
	wg.Wait()
	w = httptest.NewRecorder()
	h2 := g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
	h2.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", nil))
	if w.Code != 200 {
		t.Fatalf("after the others left: %d", w.Code)
	}

	full := NewGate(0, nil)
	_, err := full.UnaryInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/sluice.v1.RateLimiter/Check"},
		func(context.Context, any) (any, error) { return nil, nil })
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC when full: %v", err)
	}
}

// TestGateCoversDecisions: every HTTP path that decides is gated, Envoy's /json as well as
// /v1/; health checks, Envoy's /healthcheck among them, answer when the gate is full.
func TestGateCoversDecisions(t *testing.T) {
	t.Parallel()
	full := NewGate(0, nil).HTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
	tests := []struct {
		method, path string
		want         int
	}{
		{"POST", "/v1/check", http.StatusServiceUnavailable},
		{"POST", "/v1/quota", http.StatusServiceUnavailable},
		{"POST", "/json", http.StatusServiceUnavailable},
		{"GET", "/healthz", 200},
		{"GET", "/readyz", 200},
		{"GET", "/healthcheck", 200},
		{"GET", "/metrics", 200},
	}
	for _, tc := range tests {
		w := httptest.NewRecorder()
		full.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		if w.Code != tc.want {
			t.Errorf("%s %s with the gate full: %d, want %d", tc.method, tc.path, w.Code, tc.want)
		}
	}
}

func TestAdminCallsAreLimited(t *testing.T) {
	t.Parallel()
	a := NewAdmin(testutil.Limiter(t, AdminPolicy, testutil.NewClock()))
	h := a.HTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
	codesSeen := map[int]int{}
	for range 15 {
		r := httptest.NewRequest("POST", "/v1/reset", nil)
		r.RemoteAddr = "192.0.2.1:5000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codesSeen[w.Code]++
	}
	if codesSeen[200] != 10 || codesSeen[429] != 5 {
		t.Fatalf("15 resets in an instant from one IP: %v, want 10 allowed (the burst) and 5 refused", codesSeen)
	}
	r := httptest.NewRequest("POST", "/v1/check", nil)
	r.RemoteAddr = "192.0.2.1:5000"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Fatalf("checks are not admin calls: %d", w.Code)
	}
}
