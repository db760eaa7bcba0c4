package sketch

import (
	"fmt"
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
	sortCounters(heavy)
	if len(heavy) != 2 || heavy[0].Key != "heavy" || heavy[1].Key != "medium" {
		t.Fatalf("heavy hitters %v, want heavy and medium", heavy)
	}
	// medium was seen 500 times, heavy 1,000: what Drain reports bounds that.
	for i, seen := range []int64{1000, 500} {
		if c := heavy[i]; c.Count < seen || c.Count-c.Err > seen {
			t.Errorf("%s: count %d err %d, seen %d times", c.Key, c.Count, c.Err, seen)
		}
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

// TestSpaceSavingInvariants feeds random streams, uniform and skewed, to sketches of several
// sizes and checks after every add what Space-Saving promises and the heap keeps: the counts sum
// to the adds, each counted key's count bounds its true count from above and count - err from
// below, every key seen more than n/k times is held, and the heap's root is a smallest count.
func TestSpaceSavingInvariants(t *testing.T) {
	t.Parallel()
	for _, k := range []int{1, 2, 7, 64} {
		for _, skew := range []float64{1.01, 1.5} {
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			zipf := rand.NewZipf(rng, skew+0.01, 1, 499)
			s := New(k)
			truth := map[string]int64{}
			var n int64
			for range 3000 {
				key := "k" + strconv.FormatUint(zipf.Uint64(), 10)
				add := int64(1 + rng.IntN(3))
				s.AddN([]byte(key), add)
				truth[key] += add
				n += add
				if err := checkSketch(s, truth, n); err != "" {
					t.Fatalf("k=%d skew %.2f after %d adds: %s", k, skew, n, err)
				}
			}
		}
	}
}

func checkSketch(s *SpaceSaving, truth map[string]int64, n int64) string {
	var sum int64
	for slot, key := range s.keys {
		sum += s.counts[slot]
		if got := s.index[key]; int(got) != slot {
			return fmt.Sprintf("index[%s] = %d, want slot %d", key, got, slot)
		}
		if s.counts[slot] < truth[key] || s.counts[slot]-s.errs[slot] > truth[key] {
			return fmt.Sprintf("%s: count %d err %d, true %d", key, s.counts[slot], s.errs[slot], truth[key])
		}
	}
	if sum != n {
		return fmt.Sprintf("counts sum to %d, want %d adds", sum, n)
	}
	for key, c := range truth {
		if _, held := s.index[key]; !held && c*int64(cap(s.keys)) > n {
			return fmt.Sprintf("%s seen %d of %d times is not held by %d counters", key, c, n, cap(s.keys))
		}
	}
	for i, slot := range s.heap {
		if int(s.at[slot]) != i {
			return fmt.Sprintf("slot %d is at heap place %d, recorded %d", slot, i, s.at[slot])
		}
		if i > 0 && s.counts[s.heap[(i-1)/2]] > s.counts[slot] {
			return fmt.Sprintf("heap place %d counts %d, below its parent's %d", i, s.counts[slot], s.counts[s.heap[(i-1)/2]])
		}
	}
	return ""
}

// BenchmarkAdd adds to sketches of k counters: "held" cycles 80 keys, which stay counted after
// the first pass (an increment); "new" cycles 65,536 keys, so nearly every add is a key the
// sketch does not hold and takes over the smallest counter; "zipf" draws from 100,000 keys with
// a few heavy ones, as a node's traffic does.
func BenchmarkAdd(b *testing.B) {
	distinct := make([][]byte, 1<<16)
	for i := range distinct {
		distinct[i] = []byte("key-" + strconv.Itoa(i))
	}
	held := distinct[:80]
	zipf := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 99_999)
	drawn := make([][]byte, 1<<16)
	for i := range drawn {
		drawn[i] = []byte("key-" + strconv.FormatUint(zipf.Uint64(), 10))
	}
	for _, k := range []int{64, 256, 1024, 4096} {
		for _, stream := range []struct {
			name string
			keys [][]byte
		}{{"held", held}, {"new", distinct}, {"zipf", drawn}} {
			b.Run(stream.name+"/k="+strconv.Itoa(k), func(b *testing.B) {
				s := New(k)
				b.ReportAllocs()
				for i := range b.N {
					s.Add(stream.keys[i%len(stream.keys)])
				}
			})
		}
	}
}
