package redis

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// maxWaiting bounds the calls left inside rueidis at once (see do). Past it a call fails at
// once rather than start one more goroutine that would only join the wait: a healthy store
// holds a few calls per connection in flight, far from this; a store that stopped answering
// to callers without a breaker in front would otherwise gather goroutines for as long as it
// hangs.
const maxWaiting = 1 << 13

var errBacklog = fmt.Errorf("%d calls already waiting on Redis", maxWaiting)

// do makes one round trip (run's script or function calls, or cmds when set) and returns by
// ctx's deadline whatever rueidis does. rueidis honours a context while it waits for a reply,
// but not while it waits for room in a connection's ring of pending calls (ring.PutOne
// blocks on a condition variable), nor while another caller dials and handshakes the
// connection, nor while a Cluster client refreshes its slots: calls abandoned at their
// deadline keep their ring slots until Redis answers, so a Redis that stops answering
// (SIGSTOP, a fork, a swap storm, a partition that drops packets) fills a connection's 1,024
// slots in a fraction of a second under load, and every later call then waits, deadline or
// not, until Redis comes back. So the round trip runs on a goroutine of its own and the
// caller leaves at the deadline. The goroutine reads only what the caller built for this call
// (execs, cmds: fresh strings, never the caller's batch) and writes only into its call; the
// caller reads the replies only when they came in time, so an abandoned round trip can never
// touch the caller's batch or results. An abandoned call that rueidis sends later still runs
// in Redis, as does any call that timed out after it was written.
func (s *Store) do(ctx context.Context, script *rueidis.Lua, fn string, execs []rueidis.LuaExec, cmds rueidis.Commands) ([]rueidis.RedisResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.waiting.Add(1) > maxWaiting {
		s.waiting.Add(-1)
		return nil, errBacklog
	}
	c := s.calls.Get().(*call)
	c.ctx, c.script, c.fn, c.execs, c.cmds = ctx, script, fn, execs, cmds
	c.state.Store(callRunning)
	go c.start()
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			return nil, ctx.Err() // the goroutine recycles c when rueidis returns
		}
		<-c.done // it finished as the deadline passed: the replies are whole
	}
	replies := c.replies
	c.recycle()
	return replies, nil
}

// call is one round trip of do, pooled with its goroutine's function so that starting it
// allocates nothing.
type call struct {
	s      *Store
	start  func() // c.work, bound once: `go c.work()` would allocate a closure per call
	done   chan struct{}
	state  atomic.Int32 // callRunning, then callDone (the caller takes c) or callAbandoned
	ctx    context.Context
	script *rueidis.Lua
	fn     string
	execs  []rueidis.LuaExec
	cmds   rueidis.Commands

	replies []rueidis.RedisResult
}

func newCall(s *Store) *call {
	c := &call{s: s, done: make(chan struct{}, 1)}
	c.start = c.work
	return c
}

func (c *call) work() {
	var replies []rueidis.RedisResult
	if c.cmds != nil {
		replies = c.s.client.DoMulti(c.ctx, c.cmds...)
	} else {
		replies = c.s.run(c.ctx, c.script, c.fn, c.execs)
	}
	c.s.waiting.Add(-1)
	c.replies = replies
	if c.state.CompareAndSwap(callRunning, callDone) {
		c.done <- struct{}{} // buffered: never blocks
		return
	}
	c.recycle() // the caller left at its deadline and will not read them
}

// recycle clears c (a pooled call must not keep a context or replies alive) and pools it.
func (c *call) recycle() {
	c.ctx, c.script, c.fn, c.execs, c.cmds, c.replies = nil, nil, "", nil, nil, nil
	c.s.calls.Put(c)
}

// run calls the library's function fn (or the script) once per exec, in one pipeline. A node
// that lost the library (restarted without persistence, or new) gets it again, and the calls
// are retried once.
func (s *Store) run(ctx context.Context, script *rueidis.Lua, fn string, execs []rueidis.LuaExec) []rueidis.RedisResult {
	if !s.functions {
		if len(execs) == 1 {
			return []rueidis.RedisResult{script.Exec(ctx, s.client, execs[0].Keys, execs[0].Args)}
		}
		return script.ExecMulti(ctx, s.client, execs...)
	}
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = s.client.B().Fcall().Function(fn).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	var replies []rueidis.RedisResult
	if len(cmds) == 1 {
		replies = []rueidis.RedisResult{s.client.Do(ctx, cmds[0])}
	} else {
		replies = s.client.DoMulti(ctx, cmds...)
	}
	// Re-run only the calls that found no library: the others ran, and running them again
	// would consume twice.
	var again []int
	for i, r := range replies {
		if err := r.Error(); err != nil && strings.Contains(err.Error(), "Function not found") {
			again = append(again, i)
		}
	}
	if len(again) == 0 || s.loadLibrary(ctx) != nil {
		return replies
	}
	// Built anew: rueidis recycles a command once it has run.
	retry := make(rueidis.Commands, len(again))
	for j, i := range again {
		e := execs[i]
		retry[j] = s.client.B().Fcall().Function(fn).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	for j, r := range s.client.DoMulti(ctx, retry...) {
		replies[again[j]] = r
	}
	return replies
}

const (
	callRunning int32 = iota
	callDone
	callAbandoned
)
