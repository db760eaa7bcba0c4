package sketch

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestSpaceSavingDrain(t *testing.T) {
	t.Parallel()
	s := New(4)
	for i := range 1000 {
		s.Add([]byte("heavy"))
		s.Add([]byte("k" + strconv.Itoa(i))) // a thousand keys seen once each
		if i%2 == 0 {
			s.Add([]byte("medium"))
		}
	}
	heavy := s.Drain(400)
	if len(heavy) != 2 || !(heavy[0] == "heavy" || heavy[1] == "heavy") {
		t.Fatalf("heavy hitters %v, want heavy and medium", heavy)
	}
	if got := s.Drain(1); len(got) != 0 {
		t.Fatalf("drain did not start a new interval: %v", got)
	}
}

func TestSummaryBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		k    int
		keys int
	}{
		{"fits", 16, 10},
		{"overflows", 8, 200},
		{"one counter", 1, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := New(tc.k)
			truth := map[string]int64{}
			r := rand.New(rand.NewPCG(1, uint64(tc.keys)))
			for range 5000 {
				// Zipf-like: key i with weight ~ 1/(i+1).
				i := int(float64(tc.keys) * r.Float64() * r.Float64() * r.Float64())
				k := "k" + strconv.Itoa(i)
				truth[k]++
				s.Add([]byte(k))
			}
			sum := s.Summary()
			if len(sum.Counters) > tc.k {
				t.Fatalf("%d counters, want at most %d", len(sum.Counters), tc.k)
			}
			for i, c := range sum.Counters {
				if c.Count < truth[c.Key] || c.Count-c.Err > truth[c.Key] {
					t.Errorf("%s: count %d err %d, true %d", c.Key, c.Count, c.Err, truth[c.Key])
				}
				if i > 0 && c.Count > sum.Counters[i-1].Count {
					t.Errorf("not sorted at %d: %+v", i, sum.Counters)
				}
			}
			// Any key above n/k is listed.
			listed := map[string]bool{}
			for _, c := range sum.Counters {
				listed[c.Key] = true
			}
			for k, n := range truth {
				if n > 5000/int64(tc.k) && !listed[k] {
					t.Errorf("%s seen %d times (> n/k) is not listed", k, n)
				}
			}
		})
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		k     int
		parts []Summary
		want  []Counter
		full  bool
	}{
		{
			name:  "not full: counts add",
			parts: []Summary{{Counters: []Counter{{"a", 5, 0}, {"b", 2, 0}}}, {Counters: []Counter{{"b", 4, 0}, {"c", 1, 0}}}},
			want:  []Counter{{"b", 6, 0}, {"a", 5, 0}, {"c", 1, 0}},
		},
		{
			name: "full: a missing key may hide under the other's min",
			parts: []Summary{
				{Counters: []Counter{{"a", 10, 0}, {"b", 3, 1}}, Full: true},
				{Counters: []Counter{{"c", 8, 0}, {"a", 2, 0}}, Full: true},
			},
			want: []Counter{{"a", 12, 0}, {"c", 11, 3}, {"b", 5, 3}},
			full: true,
		},
		{
			name:  "bounded to k",
			k:     2,
			parts: []Summary{{Counters: []Counter{{"a", 5, 0}, {"b", 2, 0}, {"c", 1, 0}}}, {Counters: []Counter{{"c", 3, 0}}}},
			want:  []Counter{{"a", 5, 0}, {"c", 4, 0}},
			full:  true,
		},
		{name: "nothing", want: []Counter{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Merge(tc.k, tc.parts...)
			if len(got.Counters) != len(tc.want) || got.Full != tc.full {
				t.Fatalf("got %+v, want %+v full=%v", got, tc.want, tc.full)
			}
			for i := range tc.want {
				if got.Counters[i] != tc.want[i] {
					t.Fatalf("got %+v, want %+v", got.Counters, tc.want)
				}
			}
		})
	}
}

// TestMergeKeepsBounds splits one stream over three sketches: the merged summary's bounds hold
// the true totals, as one sketch's would.
func TestMergeKeepsBounds(t *testing.T) {
	t.Parallel()
	truth := map[string]int64{}
	nodes := []*SpaceSaving{New(8), New(8), New(8)}
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 9000 {
		k := "k" + strconv.Itoa(int(100*r.Float64()*r.Float64()*r.Float64()))
		truth[k]++
		nodes[i%3].Add([]byte(k))
	}
	m := Merge(8, nodes[0].Summary(), nodes[1].Summary(), nodes[2].Summary())
	if len(m.Counters) != 8 {
		t.Fatalf("%d counters, want 8", len(m.Counters))
	}
	for _, c := range m.Counters {
		if c.Count < truth[c.Key] || c.Count-c.Err > truth[c.Key] {
			t.Errorf("%s: count %d err %d, true %d", c.Key, c.Count, c.Err, truth[c.Key])
		}
	}
	if m.Counters[0].Key != "k0" {
		t.Errorf("top key %s, want k0 (the heaviest)", m.Counters[0].Key)
	}
}

func BenchmarkAdd(b *testing.B) {
	s := New(64)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("key-" + strconv.Itoa(i%80))
	}
	b.ReportAllocs()
	for i := range b.N {
		s.Add(keys[i%len(keys)])
	}
}
