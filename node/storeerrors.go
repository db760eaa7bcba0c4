package node

import (
	"log/slog"
	"sync"
	"time"
)

// storeErrorLogEvery is how often at most a store error is logged: a store that is down fails
// every request, and one line per request would bury everything else.
const storeErrorLogEvery = 10 * time.Second

// storeErrorLog logs store errors, the first at once and then at most one per
// storeErrorLogEvery with how many it left out, so that an operator sees why decisions fell back
// to on_store_error and not only that they did (sluice_store_errors_total).
type storeErrorLog struct {
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	last    time.Time
	skipped int
}

// record counts err and logs it unless one was logged within storeErrorLogEvery.
func (s *storeErrorLog) record(err error) {
	now := s.now()
	s.mu.Lock()
	if !s.last.IsZero() && now.Sub(s.last) < storeErrorLogEvery {
		s.skipped++
		s.mu.Unlock()
		return
	}
	skipped := s.skipped
	s.last, s.skipped = now, 0
	s.mu.Unlock()
	s.log.Warn("store call failed; its rules follow on_store_error", "err", err, "errors_not_logged", skipped)
}
