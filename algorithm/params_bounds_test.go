package algorithm

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestNewParamsExtremes feeds NewParams the ends of every input's range: each is either
// refused with ErrParams or derives positive integers, never a wrapped product.
func TestNewParamsExtremes(t *testing.T) {
	t.Parallel()
	counts := []int64{math.MinInt64, -1, 0, 1, MaxLimit, MaxLimit + 1, math.MaxInt64}
	periods := []time.Duration{math.MinInt64, -time.Second, 0, time.Nanosecond, MinPeriod - 1, MinPeriod,
		time.Second + time.Nanosecond, MaxPeriod, MaxPeriod + time.Microsecond, math.MaxInt64}
	for _, kind := range Kinds {
		for _, n := range counts {
			for _, b := range counts {
				for _, period := range periods {
					p, err := NewParams(kind, n, b, period)
					if err != nil {
						if !errors.Is(err, ErrParams) {
							t.Fatalf("%s %d/%d per %s: error %v does not wrap ErrParams", kind, n, b, period, err)
						}
						continue
					}
					if n < 0 || n > MaxLimit || period < MinPeriod || period > MaxPeriod {
						t.Fatalf("%s %d/%d per %s accepted", kind, n, b, period)
					}
					if p.Limit != n || p.Burst < 0 || p.Burst > MaxLimit || p.Period != period.Microseconds() ||
						p.tick <= 0 || p.periodTicks <= 0 || p.scale < 0 || p.rate < 0 || p.capacity < 0 || p.capacity > exactBound {
						t.Fatalf("%s %d/%d per %s: derived %+v", kind, n, b, period, p)
					}
				}
			}
		}
	}
}
