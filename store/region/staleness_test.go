package region

import "testing"

// TestStalenessAge: the age of a peer's newest counts is how much later than the fastest
// recent Sync they came, whatever the skew between the two clocks; older news changes nothing.
func TestStalenessAge(t *testing.T) {
	for _, skew := range []int64{0, 3_000_000, -3_000_000} {
		var s staleness
		const transit = 50_000
		at := int64(10_000_000)
		for range 5 {
			at += 100_000
			s.arrived(at-transit+skew, at)
		}
		if got := s.age.Load(); got != 0 {
			t.Errorf("skew %d: age %d after on-time Syncs, want 0", skew, got)
		}
		at += 100_000
		s.arrived(at-transit-900_000+skew, at) // read 900 ms before it could have arrived
		if got := s.age.Load(); got != 900_000 {
			t.Errorf("skew %d: age %d after a Sync 900 ms late, want 900000", skew, got)
		}
		s.arrived(at-1, at-50_000) // older news from another node of the region
		if got := s.age.Load(); got != 900_000 {
			t.Errorf("skew %d: an older arrival changed the age to %d", skew, got)
		}
		at += 100_000
		s.arrived(at-transit+skew, at)
		if got := s.age.Load(); got != 0 {
			t.Errorf("skew %d: age %d once Syncs are on time again, want 0", skew, got)
		}
	}
}

// TestStalenessDelay: the delay the reservation covers is a high quantile of the recent
// measured ones, so one slow call among fast ones does not widen it, and a run of slow ones
// does.
func TestStalenessDelay(t *testing.T) {
	var s staleness
	for range staleSamples - 1 {
		s.measured(10_000)
	}
	s.measured(2_000_000)
	if got := s.delay.Load(); got != 10_000 {
		t.Errorf("one slow call among %d: delay %d, want 10000", staleSamples, got)
	}
	for range staleSamples / 2 {
		s.measured(400_000)
	}
	if got := s.delay.Load(); got < 400_000 {
		t.Errorf("after a run of slow calls: delay %d, want 400000 or more", got)
	}
}
