package store

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// TestFingerprint: every part of an op changes the fingerprint, and the value is fixed: records
// in Redis and in snapshots outlive the process, so an encoding change must change
// fingerprintVersion (and this golden value) knowingly.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 10, 20, time.Second)
	gcra, _ := algorithm.NewParams(algorithm.GCRA, 10, 20, time.Second)
	burst, _ := algorithm.NewParams(algorithm.TokenBucket, 10, 21, time.Second)
	limit, _ := algorithm.NewParams(algorithm.TokenBucket, 11, 20, time.Second)
	period, _ := algorithm.NewParams(algorithm.TokenBucket, 10, 20, time.Minute)
	base := []Op{{Key: []byte("sl:a:1:{u=ann}"), Params: &p, Cost: 1}, {Key: []byte("sl:b:1"), Params: &p, Cost: 1}}
	fp, _ := FingerprintOf(base, nil)
	if got, want := hex.EncodeToString(fp[:]), "220ef3d7e2f1951a51ae60083d3cb445"; got != want {
		t.Errorf("the fingerprint of a fixed batch changed (%s, was %s): bump fingerprintVersion if the encoding changed", got, want)
	}
	with := func(f func(ops []Op) []Op) []Op {
		ops := append([]Op(nil), base...)
		return f(ops)
	}
	for _, tc := range []struct {
		name string
		ops  []Op
	}{
		{"key", with(func(o []Op) []Op { o[1].Key = []byte("sl:c:1"); return o })},
		{"key boundary", with(func(o []Op) []Op { o[0].Key, o[1].Key = []byte("sl:a:1:{u=ann}sl"), []byte(":b:1"); return o })},
		{"algorithm", with(func(o []Op) []Op { o[0].Params = &gcra; return o })},
		{"limit", with(func(o []Op) []Op { o[0].Params = &limit; return o })},
		{"burst", with(func(o []Op) []Op { o[0].Params = &burst; return o })},
		{"period", with(func(o []Op) []Op { o[0].Params = &period; return o })},
		{"cost", with(func(o []Op) []Op { o[1].Cost = 2; return o })},
		{"shadow", with(func(o []Op) []Op { o[1].Shadow = true; return o })},
		{"order", with(func(o []Op) []Op { o[0], o[1] = o[1], o[0]; return o })},
		{"an op less", base[:1]},
		{"an op more", with(func(o []Op) []Op { return append(o, o[1]) })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if other, _ := FingerprintOf(tc.ops, nil); other == fp {
				t.Errorf("changing the %s leaves the fingerprint as it was", tc.name)
			}
		})
	}
	// The scratch buffer is reused and does not change the result.
	scratch := make([]byte, 0, 8)
	for range 3 {
		var again Fingerprint
		if again, scratch = FingerprintOf(base, scratch); again != fp {
			t.Fatal("the fingerprint depends on the scratch buffer")
		}
	}
}

// TestFingerprintAllocatesNothing: with its scratch buffer kept, the fingerprint costs an
// idempotent check no allocation. (Not parallel: AllocsPerRun counts the whole process.)
func TestFingerprintAllocatesNothing(t *testing.T) {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 10, 20, time.Second)
	ops := []Op{{Key: []byte("sl:a:1:{u=ann}"), Params: &p, Cost: 1}, {Key: []byte("sl:b:1"), Params: &p, Cost: 1}}
	_, scratch := FingerprintOf(ops, nil)
	if allocs := testing.AllocsPerRun(100, func() { _, scratch = FingerprintOf(ops, scratch) }); allocs != 0 {
		t.Errorf("FingerprintOf with a warm scratch buffer allocates %v times", allocs)
	}
}
