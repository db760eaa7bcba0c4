package httplimit_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store/memory"
)

// holdPolicy: one job at a time per caller, and a rate limit beside it.
const holdPolicy = `
rules:
  - {name: jobs, key: [ip], algorithm: concurrency, limit: 1}
  - {name: rate, key: [ip], algorithm: token_bucket, limit: 100, period: 1h}
`

// realLimiter is a Limiter on the real clock: the middleware renews leases by real timers.
func realLimiter(t *testing.T) *sluice.Limiter {
	t.Helper()
	l, err := sluice.New(memory.New(), testutil.Snapshot(t, holdPolicy))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// rateLeft looks at what the caller has left of the rate limit.
func rateLeft(t *testing.T, l *sluice.Limiter, ip string) int64 {
	t.Helper()
	var d sluice.Decision
	if err := l.Quota(t.Context(), &sluice.Request{IP: ip, Endpoint: "/job", Method: "GET"}, &d); err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Results {
		if r.Rule == "rate" {
			return r.Remaining
		}
	}
	t.Fatal("no rate result")
	return 0
}

// blocking is a handler that signals it started and returns when released.
type blocking struct{ started, release chan struct{} }

func (b blocking) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	close(b.started)
	<-b.release
	w.Write([]byte("done"))
}

// TestHoldSlots: a held slot refuses a second request while the handler runs, and returns
// when it returns; the rate limit stays charged for the request that ran and not for the
// one refused.
func TestHoldSlots(t *testing.T) {
	t.Parallel()
	l := realLimiter(t)
	mw := httplimit.New(l, httplimit.WithHold(time.Minute))
	b := blocking{make(chan struct{}), make(chan struct{})}
	done := make(chan int)
	go func() { done <- get(mw.Handler(b), "/job", "10.0.0.1:5", nil).Code }()
	<-b.started
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.1:6", nil); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a second job while one runs: %d, Retry-After %q; want 429 with one", w.Code, w.Header().Get("Retry-After"))
	}
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.2:5", nil); w.Code != http.StatusOK {
		t.Fatalf("another caller's job: %d", w.Code)
	}
	close(b.release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the held request: %d", code)
	}
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.1:7", nil); w.Code != http.StatusOK {
		t.Fatalf("after the first job returned: %d, want 200 (its slot freed)", w.Code)
	}
	if got := rateLeft(t, l, "10.0.0.1"); got != 98 {
		t.Fatalf("rate limit: %d left, want 98 (two jobs ran, the refused one took nothing)", got)
	}
}

// TestHoldSlotsPanic: a handler that panics frees its slot; the panic goes on.
func TestHoldSlotsPanic(t *testing.T) {
	t.Parallel()
	l := realLimiter(t)
	mw := httplimit.New(l, httplimit.WithHold(time.Minute))
	panicking := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler failed") })
	func() {
		defer func() {
			if r := recover(); r != "handler failed" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		get(mw.Handler(panicking), "/job", "10.0.0.1:5", nil)
	}()
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.1:6", nil); w.Code != http.StatusOK {
		t.Fatalf("after a handler panicked: %d, want 200 (its slot freed)", w.Code)
	}
}

// TestHoldSlotsRenewed: a handler that runs for more than twice the lease's ttl keeps its
// slot, renewed every third of the ttl (a 2 s margin for a late timer on a busy machine).
func TestHoldSlotsRenewed(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("holds a request for 7 s")
	}
	l := realLimiter(t)
	const ttl = 3 * time.Second
	mw := httplimit.New(l, httplimit.WithHold(ttl))
	b := blocking{make(chan struct{}), make(chan struct{})}
	done := make(chan int)
	go func() { done <- get(mw.Handler(b), "/job", "10.0.0.1:5", nil).Code }()
	<-b.started
	time.Sleep(7 * time.Second)
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.1:6", nil); w.Code != http.StatusTooManyRequests {
		t.Fatalf("7 s into a held request with a ttl of 3 s: %d, want 429 (the slot renewed)", w.Code)
	}
	close(b.release)
	<-done
	if w := get(mw.Handler(&next{}), "/job", "10.0.0.1:7", nil); w.Code != http.StatusOK {
		t.Fatalf("after it returned: %d", w.Code)
	}
}
