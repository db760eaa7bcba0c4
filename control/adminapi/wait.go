package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// WaitHeader names the request header that asks a change to wait for the fleet, as the query
// parameter wait=fleet does.
const WaitHeader = "Sluice-Wait"

// DefaultWaitTimeout is how long a change waits for the fleet before answering 504.
const DefaultWaitTimeout = 5 * time.Second

// waitPoll is how often a waiting change reads the heartbeats; a node heartbeats at once after
// each swap, so the wait ends within a poll of the last node's swap.
const waitPoll = 20 * time.Millisecond

// DefaultMaxFleetWaiters bounds the changes that wait for the fleet at once on one node; one
// more is refused (503, nothing changed) rather than held. The waiting ones share each read of
// the heartbeats, so the control store sees about one read per poll however many wait.
const DefaultMaxFleetWaiters = 256

// errTooManyWaiting refuses a change that would wait beside Options.MaxFleetWaiters others.
var errTooManyWaiting = errors.New("too many changes wait for the fleet")

// heartbeatRead is one read of the heartbeats, kept for the waiters that poll within waitPoll
// of it.
type heartbeatRead struct {
	at    time.Time
	nodes []control.Node
}

// waitKey carries a request's *waitState in its context.
type waitKey struct{}

// waitState receives the control version a change made (changed sets it).
type waitState struct{ version int64 }

// wantsFleet reads ?wait=fleet and the Sluice-Wait header; any other value is refused before
// the change is made, so a typo never passes for a wait.
func wantsFleet(r *http.Request) (bool, error) {
	q := r.URL.Query()
	fleet := false
	if vs, ok := q["wait"]; ok {
		if len(vs) != 1 || vs[0] != "fleet" {
			return false, &policy.FieldError{Field: "wait", Msg: `the only value is "fleet": answer once every live node enforces the change`}
		}
		fleet = true
	}
	if vs := r.Header.Values(WaitHeader); len(vs) > 0 {
		if len(vs) != 1 || !strings.EqualFold(strings.TrimSpace(vs[0]), "fleet") {
			return false, &policy.FieldError{Field: WaitHeader, Msg: `the only value is "fleet": answer once every live node enforces the change`}
		}
		fleet = true
	}
	return fleet, nil
}

// heldAnswer keeps a change's answer until the fleet has it: the headers go to the real
// writer's map, the status and body wait here.
type heldAnswer struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (a *heldAnswer) Header() http.Header { return a.h }

func (a *heldAnswer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *heldAnswer) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.body.Write(p)
}

// serveWaiting runs a change handler, then holds its answer until every live node reports the
// change's control version, or answers 504 naming the nodes that lag after WaitTimeout.
func (s *Server) serveWaiting(w http.ResponseWriter, r *http.Request, h func(http.ResponseWriter, *http.Request) error) {
	ws := &waitState{}
	r = r.WithContext(context.WithValue(r.Context(), waitKey{}, ws))
	held := &heldAnswer{h: w.Header()}
	if err := h(held, r); err != nil {
		s.fail(w, r, err)
		return
	}
	if held.status < 300 && ws.version > 0 {
		if err := s.waitFleet(r.Context(), ws.version); err != nil {
			for _, k := range []string{"ETag", "Location", "Content-Type"} {
				w.Header().Del(k)
			}
			s.fail(w, r, err)
			return
		}
	}
	if held.status == 0 {
		held.status = http.StatusOK
	}
	w.WriteHeader(held.status)
	w.Write(held.body.Bytes())
}

// laggingNode is a node of a 504's answer.
type laggingNode struct {
	ID            string    `json:"id"`
	Addr          string    `json:"addr"`
	PolicyVersion string    `json:"policy_version"`
	SeenAt        time.Time `json:"seen_at"`
}

// fleetTimeout is the error of a wait that ran out: the change is stored, some nodes lag.
type fleetTimeout struct {
	policyVersion string
	waited        time.Duration
	lagging       []laggingNode
	cause         error // the last failure to read the heartbeats, if any
}

func (e *fleetTimeout) Error() string {
	if len(e.lagging) == 0 {
		return fmt.Sprintf("the change is stored (policy version %s), but the nodes' heartbeats could not be read within %v: %v", e.policyVersion, e.waited, e.cause)
	}
	ids := make([]string, len(e.lagging))
	for i, n := range e.lagging {
		ids[i] = fmt.Sprintf("%s (at %s)", n.ID, n.PolicyVersion)
	}
	return fmt.Sprintf("the change is stored (policy version %s), but after %v these nodes do not enforce it yet: %s",
		e.policyVersion, e.waited, strings.Join(ids, ", "))
}

// writeFleetTimeout answers 504 with the lagging nodes.
func writeFleetTimeout(w http.ResponseWriter, e *fleetTimeout) {
	lag := e.lagging
	if lag == nil {
		lag = []laggingNode{}
	}
	body, _ := json.Marshal(struct {
		Error         string        `json:"error"`
		PolicyVersion string        `json:"policy_version"`
		Lagging       []laggingNode `json:"lagging"`
	}{e.Error(), e.policyVersion, lag})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusGatewayTimeout)
	w.Write(append(body, '\n'))
}

// waitFleet polls the heartbeats until every live node reports control version v or more.
// The timeout is wall time, not the injected clock: it bounds how long the caller waits.
func (s *Server) waitFleet(ctx context.Context, v int64) error {
	start := time.Now()
	deadline := time.NewTimer(s.opts.WaitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	var lagging []laggingNode
	var cause error
	for {
		nodes, err := s.sharedHeartbeats(ctx, start)
		if err == nil {
			lagging = lagging[:0]
			for _, n := range nodes {
				if n.PolicyVersion < v {
					lagging = append(lagging, laggingNode{ID: n.ID, Addr: n.Addr, PolicyVersion: s.opts.PolicyVersion(n.PolicyVersion), SeenAt: n.SeenAt.UTC()})
				}
			}
			if len(lagging) == 0 {
				return nil
			}
		} else {
			cause = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the fleet: %w", ctx.Err())
		case <-deadline.C:
			if err == nil {
				cause = nil
			}
			return &fleetTimeout{policyVersion: s.opts.PolicyVersion(v), waited: time.Since(start).Round(time.Millisecond), lagging: lagging, cause: cause}
		case <-tick.C:
		}
	}
}

// sharedHeartbeats reads the live nodes' heartbeats once for the changes waiting within one
// poll: a read less than waitPoll old that began after since (the caller's change was stored
// by then) is answered again, and reads asked for at once are made once. An older read could
// miss a node that came up after it, and end a wait early. The read is not tied to one
// waiter's context, so a waiter that gives up does not fail the others; it is bounded by its
// own deadline instead.
func (s *Server) sharedHeartbeats(ctx context.Context, since time.Time) ([]control.Node, error) {
	if last := s.lastBeats.Load(); last != nil && last.at.After(since) && time.Since(last.at) < waitPoll {
		return last.nodes, nil
	}
	for {
		ch := s.heartbeats.DoChan("nodes", func() (any, error) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.WaitTimeout)
			defer cancel()
			read := &heartbeatRead{at: time.Now()}
			var err error
			read.nodes, err = s.store.Nodes(rctx, s.now().Add(-s.opts.NodeWindow))
			if err != nil {
				return nil, err
			}
			s.lastBeats.Store(read)
			return read, nil
		})
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the fleet: %w", ctx.Err())
		case res := <-ch:
			if res.Err != nil {
				return nil, res.Err
			}
			// A read that was under way before the change: join the next one.
			if read := res.Val.(*heartbeatRead); read.at.After(since) {
				return read.nodes, nil
			}
		}
	}
}

// noteVersion tells a waiting request's serveWaiting which control version its change made.
func noteVersion(ctx context.Context, v int64) {
	if ws, ok := ctx.Value(waitKey{}).(*waitState); ok && v > ws.version {
		ws.version = v
	}
}
