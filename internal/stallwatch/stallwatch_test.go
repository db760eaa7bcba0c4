package stallwatch

import (
	"testing"
	"time"
)

func TestDuring(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w := &Watch{gaps: [][2]time.Time{{at(10), at(40)}, {at(100), at(150)}}}
	cases := []struct {
		name       string
		start, end int
		want       time.Duration
	}{
		{"before any stall", 0, 10, 0},
		{"inside one", 15, 25, 10 * time.Millisecond},
		{"overlapping the start of one", 0, 20, 10 * time.Millisecond},
		{"across both", 0, 200, 80 * time.Millisecond},
		{"between them", 40, 100, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := w.During(at(c.start), at(c.end)); got != c.want {
				t.Errorf("During(%d ms, %d ms) = %v, want %v", c.start, c.end, got, c.want)
			}
		})
	}
}
