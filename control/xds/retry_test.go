package xds

import (
	"testing"
	"time"
)

// TestRetryWait: the wait doubles at each failure in a row, from the base up to the longest,
// and stays at the base when the longest is not above it.
func TestRetryWait(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, c := range []struct {
		failures      int
		base, longest time.Duration
		want          time.Duration
	}{
		{1, 3 * s, 3 * s, 3 * s},
		{10, 3 * s, 3 * s, 3 * s},
		{5, 3 * s, 0, 3 * s},
		{1, 10 * s, 60 * s, 10 * s},
		{2, 10 * s, 60 * s, 20 * s},
		{3, 10 * s, 60 * s, 40 * s},
		{4, 10 * s, 60 * s, 60 * s},
		{1000, 10 * s, 60 * s, 60 * s},
	} {
		if got := retryWait(c.failures, c.base, c.longest); got != c.want {
			t.Errorf("retryWait(%d, %v, %v) = %v, want %v", c.failures, c.base, c.longest, got, c.want)
		}
	}
}
