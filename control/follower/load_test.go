package follower_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
)

// slowStore is a control store that takes need to read whole. Given a shorter deadline its
// Load fails as a real read cut off by its deadline does, but at once, so that the test does
// not wait the deadlines out; given enough, it reads and moves clock on by need, the clock
// the runtime times its loads with.
type slowStore struct {
	control.Store
	need  time.Duration
	clock *fakeClock

	mu        sync.Mutex
	deadlines []time.Duration // what each Load was given
}

func (s *slowStore) Load(ctx context.Context) (*control.State, error) {
	dl, ok := ctx.Deadline()
	left := time.Until(dl)
	s.mu.Lock()
	s.deadlines = append(s.deadlines, left)
	s.mu.Unlock()
	if ok && left < s.need {
		return nil, fmt.Errorf("load: identities: %w", context.DeadlineExceeded)
	}
	s.clock.Advance(s.need)
	return s.Store.Load(ctx)
}

// shortLoads counts the Loads given less than need.
func (s *slowStore) shortLoads() (n int, all []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.deadlines {
		if d < s.need {
			n++
		}
	}
	return n, slices.Clone(s.deadlines)
}

// TestLoadLargerThanTimeout: a store that answers but takes longer to read whole than the
// Timeout is still read (issue 29: 20,000 entries on a busy machine ran past the deadline at
// every try, and the node never took the new policy). Start holds until it is read, the store
// is never reported down, and later loads are given enough from the start.
func TestLoadLargerThanTimeout(t *testing.T) {
	clock := &fakeClock{}
	clock.ns.Store(time.Now().UnixNano())
	base := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})
	ban(t, base, "acme")
	st := &slowStore{Store: base, need: 5 * follower.DefaultTimeout / 2, clock: clock}

	n := startNode(t, st, "node-a", files(t, basePolicy), func(o *follower.Options) { o.Now = clock.Now })
	if n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) || !n.rt.Up() {
		short, all := st.shortLoads()
		t.Fatalf("after Start: acme allowed %v, up %v (policy %s; deadlines given %v, %d too short)",
			n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}), n.rt.Up(), n.lim.Policy().Version, all, short)
	}
	startShort, _ := st.shortLoads()

	ban(t, base, "beta")
	n.waitDenied(t, sluice.Request{Tenant: "beta", User: "u"}, time.Now(), 10*time.Second)
	if !n.rt.Up() {
		t.Error("the store was reported down")
	}
	short, all := st.shortLoads()
	t.Logf("deadlines given: %v", all)
	if short != startShort {
		t.Errorf("%d loads after the start were given less than the store needs (%v); deadlines %v", short-startShort, st.need, all)
	}
}

// hangingStore is a control store whose Load, and Version too when all is set, answer only
// when their deadline passes. Otherwise Version answers at once, so that the probe's own
// deadline plays no part in how many Loads are tried.
type hangingStore struct {
	control.Store
	all bool

	mu        sync.Mutex
	deadlines []time.Duration
}

func (s *hangingStore) Load(ctx context.Context) (*control.State, error) {
	dl, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, time.Until(dl))
	s.mu.Unlock()
	<-ctx.Done()
	return nil, fmt.Errorf("load: rules: %w", ctx.Err())
}

func (s *hangingStore) Version(ctx context.Context) (int64, error) {
	if !s.all {
		return 1, nil
	}
	<-ctx.Done()
	return 0, fmt.Errorf("control version: %w", ctx.Err())
}

// TestLoadOfHangingStoreReportsDown: stretching the deadline for a large store does not hide
// a store that hangs. One that answers nothing is reported down after one Load and one probe;
// one that answers its version but never finishes a read is reported down once the deadline
// has doubled up to MaxLoadTimeout.
func TestLoadOfHangingStoreReportsDown(t *testing.T) {
	const timeout = 20 * time.Millisecond
	for _, c := range []struct {
		name  string
		all   bool
		loads int // the Loads before the store is reported down
	}{
		{"store hangs", true, 1},
		{"only Load hangs", false, 4}, // 20, 40, 80, 160 ms
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &hangingStore{Store: openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{}), all: c.all}
			n := startNode(t, st, "node-a", files(t, basePolicy), func(o *follower.Options) {
				o.Timeout = timeout
				o.MaxLoadTimeout = 8 * timeout
				o.PollInterval = time.Hour // only Start's load
			})
			if n.rt.Up() {
				t.Fatal("a hanging store reported up")
			}
			if err := n.rt.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
				t.Errorf("Health = %v, want the load's deadline", err)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if len(st.deadlines) != c.loads {
				t.Fatalf("%d loads before the store was reported down, want %d (deadlines %v)", len(st.deadlines), c.loads, st.deadlines)
			}
			// Only the upper bound: how much of a deadline is left when Load starts depends
			// on the scheduler.
			for i, d := range st.deadlines {
				if want := timeout << i; d > want {
					t.Errorf("load %d was given %v, want at most %v (deadlines %v)", i, d, want, st.deadlines)
				}
			}
		})
	}
}
