package adminapi

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The reasons of sluice_admin_auth_failures_total.
const (
	// failureInvalid: a token that matches none.
	failureInvalid = "invalid"
	// failureLimited: a token that matches none, from an address over its failure limit.
	failureLimited = "limited"
)

// authFailures counts and logs failed authentications. The log is bounded (one line a second
// at most, with the number left unsaid), so that a guesser cannot fill a disk or drown the
// log; the counter counts every one.
type authFailures struct {
	counter *prometheus.CounterVec // nil: not counted

	mu      sync.Mutex
	last    time.Time
	unsaid  int
	logOnce time.Duration
}

// newAuthFailures registers sluice_admin_auth_failures_total with reg (nil: none).
func newAuthFailures(reg prometheus.Registerer) (*authFailures, error) {
	a := &authFailures{logOnce: time.Second}
	if reg == nil {
		return a, nil
	}
	a.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_admin_auth_failures_total",
		Help: "Calls refused for their token, by reason: invalid (matches no token) or limited (from an address over its failure limit), of the admin API and resets; region_invalid and region_limited of the Regions service.",
	}, []string{"reason"})
	if err := reg.Register(a.counter); err != nil {
		return nil, err
	}
	for _, r := range []string{failureInvalid, failureLimited, "region_" + failureInvalid, "region_" + failureLimited} {
		a.counter.WithLabelValues(r)
	}
	return a, nil
}

// CountAuthFailure counts a failed authentication made elsewhere in the node, under reason
// (the Regions service's, as region_invalid and region_limited), in
// sluice_admin_auth_failures_total; the caller logs it.
func (s *Server) CountAuthFailure(reason string) {
	if c := s.authFails.counter; c != nil {
		c.WithLabelValues(reason).Inc()
	}
}

// authFailed counts a failure of the client at ip, and logs it unless a line was written
// within the last second. The token is never logged.
func (s *Server) authFailed(ip, reason string) {
	a := s.authFails
	if a.counter != nil {
		a.counter.WithLabelValues(reason).Inc()
	}
	now := s.now()
	a.mu.Lock()
	if now.Sub(a.last) < a.logOnce && !a.last.IsZero() {
		a.unsaid++
		a.mu.Unlock()
		return
	}
	unsaid := a.unsaid
	a.last, a.unsaid = now, 0
	a.mu.Unlock()
	s.log.Warn("admin authentication failed", "client", ip, "reason", reason, "unlogged_before", unsaid)
}
