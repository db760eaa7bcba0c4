package redistest

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// What the hang tests share: a deployment in which the server owning the test's keys can be
// paused, a load of concurrent callers, and a pause that cannot outlive the test.

// HangTarget is a deployment a hang test pauses a server of.
type HangTarget struct {
	// Name names the test case.
	Name string
	// Start starts the deployment and returns the URL a store dials and the server that owns
	// the keys of hash tag tag: the one to pause.
	Start func(t *testing.T, tag string) (url string, owner *Server)
}

// HangTargets are a single server and a node of a three-primary Cluster (skipped with
// -short). The Cluster's own failure detection is kept out of the way (a cluster-node-timeout
// past any pause), so that a test sees a hung node, not a failover.
func HangTargets() []HangTarget {
	return []HangTarget{
		{"single server", func(t *testing.T, _ string) (string, *Server) {
			srv := Start(t)
			return "redis://" + srv.Addr, srv
		}},
		{"cluster node", func(t *testing.T, tag string) (string, *Server) {
			if testing.Short() {
				t.Skip("starts a Redis Cluster")
			}
			cl := StartCluster(t, 3, 0, WithConfig("cluster-node-timeout 60000"))
			// The node that accepts a write to the hash tag owns its keys; the others answer
			// MOVED.
			for _, n := range cl.Nodes {
				if _, err := n.Do("SET", "{"+tag+"}probe", "1"); err == nil {
					return "redis-cluster://" + strings.Join(cl.Addrs, ","), n
				}
			}
			t.Fatalf("no node owns {%s}", tag)
			return "", nil
		}},
	}
}

// PauseFor stops s with SIGSTOP (its port stays open and nothing answers, as in a fork, a
// swap storm or a partition that drops packets) for d, resumes it, and returns when it paused
// and resumed. A Resume is registered first, so a test that fails midway never leaves the
// server stopped.
func (s *Server) PauseFor(t testing.TB, d time.Duration) (paused, resumed time.Time) {
	t.Helper()
	t.Cleanup(s.Resume)
	paused = time.Now()
	s.Pause()
	time.Sleep(d)
	resumed = time.Now()
	s.Resume()
	return paused, resumed
}

// Load is concurrent callers calling until stopped.
type Load struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// StartLoad starts callers goroutines. Goroutine i makes its call with newCall(i), once, so
// that the call can keep state of its own (a batch and results reused, as the limiter reuses
// them), then calls it over and over, pace apart, until Stop or the end of the test.
func StartLoad(t testing.TB, callers int, pace time.Duration, newCall func(i int) func()) *Load {
	l := &Load{stop: make(chan struct{})}
	for i := range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			call := newCall(i)
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				call()
				time.Sleep(pace)
			}
		}()
	}
	t.Cleanup(l.Stop)
	return l
}

// Stop stops the callers and waits for their last calls to return. It may be called more than
// once.
func (l *Load) Stop() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}
