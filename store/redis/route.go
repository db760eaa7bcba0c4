package redis

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// On a Cluster, plain windows (plain.go) go to the slot's primary over that node's own client,
// which does not follow redirections, and read the TIMEs of that same node: a count that a node
// refuses with MOVED or ASK was not made, and its batch falls back to the script through the
// cluster client, which follows them. The cluster client could not serve here: it follows a
// redirection per command, so a pipeline's increments could run on one node and its TIMEs on
// another, whose clock says nothing of when they counted.

// nodeRoute is a primary that plain windows reach a slot's keys on.
type nodeRoute struct {
	addr   string
	client rueidis.Client // the node's own: it answers MOVED and ASK rather than follow them
	node
}

// node is what a primary keeps across reads of the slot map: its clock, read only from TIMEs
// it answered, and its lane, where its slots' batches gather (a flight's commands on many
// slots share its TIMEs).
type node struct {
	clock *redisClock
	lane  *lane
}

// slotRoutes is each slot's primary, nil where it is not known.
type slotRoutes [16384]*nodeRoute

// The least time between two reads of the slot map: after a redirection or a failed flight
// (a migration makes every flight on the moving slot meet one until it ends), and while a
// slot has no known primary (a failover, or a node the cluster client does not know by the
// address CLUSTER SLOTS gives, whose slots the script serves for good).
const (
	routeRefreshEvery    = 100 * time.Millisecond
	unroutedRefreshEvery = time.Second
)

// routeFor returns the primary of slot that plain windows may use, or nil: the script decides
// the slot's batches meanwhile, and the slot map is read again.
func (s *Store) routeFor(slot uint16) *nodeRoute {
	if r := s.routes.Load(); r != nil && r[slot] != nil {
		return r[slot]
	}
	s.refreshRoutes(unroutedRefreshEvery)
	return nil
}

// refreshRoutes reads the slot map again in the background, unless a read runs or one ended
// less than every ago.
func (s *Store) refreshRoutes(every time.Duration) {
	if last := s.routedAt.Load(); last != 0 && s.since()-last < int64(every) {
		return
	}
	if !s.routing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.routing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := s.readRoutes(ctx)
		s.routedAt.Store(s.since())
		if err == nil {
			// A failed read leaves the map as it was: a flight sent by it that meets a
			// redirection or an error reads it again, and the script decides meanwhile.
			s.routes.Store(r)
		}
	}()
}

// readRoutes asks the cluster which primary serves each slot and reads each primary's clock.
// A primary keeps its clock and lane across reads while it serves slots; one that no longer
// does is forgotten (its lane answers what it holds), so that nodes replaced over time do not
// pile up. Only the refresh goroutine calls it.
func (s *Store) readRoutes(ctx context.Context) (*slotRoutes, error) {
	ranges, err := s.client.Do(ctx, s.client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, err
	}
	clients := s.client.Nodes()
	if s.nodes == nil {
		s.nodes = make(map[string]node)
	}
	routes := new(slotRoutes)
	byAddr := make(map[string]*nodeRoute)
	for _, rng := range ranges {
		addr, first, last, ok := slotRange(rng)
		if !ok {
			continue
		}
		route := byAddr[addr]
		if route == nil {
			client := clients[addr]
			if client == nil {
				continue // not a node the cluster client reaches: the script serves its slots
			}
			n, ok := s.nodes[addr]
			if !ok {
				n = node{clock: &redisClock{born: s.clock.born}, lane: newLane(s, 0)}
				s.nodes[addr] = n
			}
			if err := readClock(ctx, client, n.clock); err != nil {
				continue
			}
			route = &nodeRoute{addr: addr, client: client, node: n}
			n.lane.node.Store(route)
			byAddr[addr] = route
		}
		for slot := first; slot <= last; slot++ {
			routes[slot] = route
		}
	}
	for addr := range s.nodes {
		if byAddr[addr] == nil {
			delete(s.nodes, addr)
		}
	}
	return routes, nil
}

// slotRange reads one entry of CLUSTER SLOTS: its first and last slot and its primary's
// address.
func slotRange(rng rueidis.RedisMessage) (addr string, first, last int64, ok bool) {
	fields, err := rng.ToArray()
	if err != nil || len(fields) < 3 {
		return "", 0, 0, false
	}
	first, err1 := fields[0].AsInt64()
	last, err2 := fields[1].AsInt64()
	primary, err3 := fields[2].ToArray()
	if err1 != nil || err2 != nil || err3 != nil || len(primary) < 2 || first < 0 || last >= 16384 || first > last {
		return "", 0, 0, false
	}
	host, err1 := primary[0].ToString()
	port, err2 := primary[1].AsInt64()
	if err1 != nil || err2 != nil || host == "" {
		return "", 0, 0, false
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10)), first, last, true
}

// readClock reads a node's TIME into its clock.
func readClock(ctx context.Context, client rueidis.Client, clock *redisClock) error {
	t, err := redisTime(client.Do(ctx, client.B().Time().Build()))
	if err != nil {
		return err
	}
	clock.observe(t, clock.local())
	return nil
}

// redirected reports whether a reply says the node does not serve the command's slot now
// (MOVED, ASK, TRYAGAIN, CLUSTERDOWN): the node did not run it.
func redirected(r rueidis.RedisResult) bool {
	e, ok := rueidis.IsRedisErr(r.Error())
	if !ok {
		return false
	}
	_, moved := e.IsMoved()
	_, ask := e.IsAsk()
	return moved || ask || e.IsTryAgain() || e.IsClusterDown()
}

// Stats are the store's figures for an operator: how its requests were decided, and on a
// Cluster whether plain windows find the primaries.
type Stats struct {
	// ScriptCalls are the lanes' script calls, and ScriptBatches the requests' batches they
	// decided (batches per call is how far coalescing goes).
	ScriptCalls, ScriptBatches uint64
	// PlainDecided are the batches plain commands decided; PlainFellBack those of them that
	// fell back to the script (a count over, a window edge, a redirection).
	PlainDecided, PlainFellBack uint64
	// Redirects are the plain flights a Cluster node refused for a slot it no longer served
	// (a migration or a failover), and RoutedSlots the slots whose primary plain windows know
	// now (16384 on a healthy Cluster; fewer where CLUSTER SLOTS names a node by an address
	// the client does not reach it by, and the script serves those slots).
	Redirects   uint64
	RoutedSlots int
}

// Stats returns the store's figures.
func (s *Store) Stats() Stats {
	st := Stats{
		ScriptCalls: s.coalescedCalls.Load(), ScriptBatches: s.coalescedBatches.Load(),
		PlainDecided: s.plainDecided.Load(), PlainFellBack: s.plainFellBack.Load(),
		Redirects: s.redirects.Load(),
	}
	if r := s.routes.Load(); r != nil {
		for _, route := range r {
			if route != nil {
				st.RoutedSlots++
			}
		}
	}
	return st
}
