package follower_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
)

// slowStore is a control store that takes parts×step to read whole, longer than the runtime's
// Timeout, and reports its progress after each part when progress is set.
type slowStore struct {
	control.Store
	parts    int
	step     time.Duration
	progress bool
	loads    atomic.Int64
}

func (s *slowStore) Load(ctx context.Context) (*control.State, error) {
	s.loads.Add(1)
	for range s.parts {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("load: identities: %w", ctx.Err())
		case <-time.After(s.step):
		}
		if s.progress {
			control.ReportProgress(ctx)
		}
	}
	return s.Store.Load(ctx)
}

// TestLoadLargerThanTimeout: a store that answers but takes longer to read whole than the
// Timeout is still read (issue 29: 20,000 entries on a busy machine ran past the deadline at
// every try, and the node never took the new policy). Start holds until it is read, the store
// is not reported down, and the next change is read too. A store that reports its progress
// is given Timeout per part; one that does not, a deadline that doubles.
func TestLoadLargerThanTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	for _, c := range []struct {
		name     string
		parts    int
		step     time.Duration
		progress bool
	}{
		{"reports progress", 20, timeout / 4, true},
		{"reports nothing", 1, 3 * timeout, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})
			ban(t, base, "acme")
			st := &slowStore{Store: base, parts: c.parts, step: c.step, progress: c.progress}
			n := startNode(t, st, "node-a", files(t, basePolicy), func(o *follower.Options) { o.Timeout = timeout })
			if n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) || !n.rt.Up() {
				t.Fatalf("after Start: acme allowed, up %v (policy %s, %d loads)", n.rt.Up(), n.lim.Policy().Version, st.loads.Load())
			}
			ban(t, base, "beta")
			n.waitDenied(t, sluice.Request{Tenant: "beta", User: "u"}, time.Now(), 30*time.Second)
			if !n.rt.Up() {
				t.Error("the store was reported down")
			}
			t.Logf("%d loads for the start and one change", st.loads.Load())
		})
	}
}

// hangingStore is a control store whose Load, and Version too when all is set, answer only
// when they are cut off. Otherwise Version answers at once, so that the probe's own deadline
// plays no part in how many Loads are tried.
type hangingStore struct {
	control.Store
	all   bool
	loads atomic.Int64
}

func (s *hangingStore) Load(ctx context.Context) (*control.State, error) {
	s.loads.Add(1)
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

// TestLoadOfHangingStoreReportsDown: reading a large store whole does not hide a store that
// hangs. One that answers nothing is reported down after one Load and one probe; one that
// answers its version but never makes progress reading is reported down once the deadline has
// doubled up to MaxLoadTimeout.
func TestLoadOfHangingStoreReportsDown(t *testing.T) {
	const timeout = 20 * time.Millisecond
	for _, c := range []struct {
		name  string
		all   bool
		loads int64 // the Loads before the store is reported down
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
			if got := st.loads.Load(); got != c.loads {
				t.Errorf("%d loads before the store was reported down, want %d", got, c.loads)
			}
		})
	}
}
