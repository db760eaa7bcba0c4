package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clusterTimeout bounds `redis-cli --cluster create` and, separately, the wait for a healthy
// cluster. Creation itself polls once a second for the nodes to agree, so it takes a few
// seconds; masters also hold cluster_state:fail for 2 s after they start.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of real redis-server nodes on 127.0.0.1.
type Cluster struct {
	// Nodes are the servers in creation order. redis-cli makes the first `primaries` of them
	// primaries and the rest replicas, but a failover can swap roles; ask a node (INFO
	// replication) when it matters.
	Nodes []*Server
	// Addrs are the nodes' addresses, in the same order: the seed list for a cluster client.
	Addrs []string
}

// StartCluster starts primaries*(1+replicas) cluster nodes, joins them with
// `redis-cli --cluster create ... --cluster-replicas replicas --cluster-yes`, waits until every
// node reports a healthy cluster (see WaitOK), and stops all nodes when the test ends. Redis
// needs at least 3 primaries. opts apply to every node; nodes use cluster-node-timeout 2000
// unless WithConfig says otherwise. Skips like Start when redis-server or redis-cli is missing.
func StartCluster(t testing.TB, primaries, replicas int, opts ...Option) *Cluster {
	t.Helper()
	if primaries < 3 || replicas < 0 {
		t.Fatalf("redistest: a cluster needs at least 3 primaries and no negative replicas, got %d and %d", primaries, replicas)
	}
	cli := need(t, "redis-cli")
	n := primaries * (1 + replicas)
	c := &Cluster{}
	nodeOpts := append([]Option{withCluster()}, opts...)
	for range n {
		s := Start(t, nodeOpts...)
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: %s %v: %v\n%s", cli, args, err, out)
	}
	c.WaitOK(t)
	return c
}

// WaitOK waits until every running node reports cluster_state:ok, knows all nodes, sees all
// 16384 slots served, and, if it is a replica, has its link to the primary up. Tests call it
// after killing or restarting nodes to wait for the cluster to settle. It fails the test after
// 30 s with the last thing that was wrong.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clusterTimeout)
	for {
		err := c.check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not ok within %v: %v", clusterTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check returns why the cluster is not healthy yet, or nil.
func (c *Cluster) check() error {
	running := 0
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		running++
		reply, err := s.Do("CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		f := InfoFields(reply)
		want := map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": "16384",
			"cluster_slots_ok":       "16384",
			"cluster_known_nodes":    strconv.Itoa(len(c.Nodes)),
		}
		for k, v := range want {
			if f[k] != v {
				return fmt.Errorf("%s: %s is %q, want %q", s.Addr, k, f[k], v)
			}
		}
		reply, err = s.Do("INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", s.Addr, err)
		}
		if r := InfoFields(reply); r["role"] == "slave" && r["master_link_status"] != "up" {
			return fmt.Errorf("%s: replica link to %s:%s is %q", s.Addr, r["master_host"], r["master_port"], r["master_link_status"])
		}
	}
	if running == 0 {
		return errors.New("no node is running")
	}
	return nil
}

// MoveSlot moves slot, keys and all, from the primary that serves it to the primary to, as
// `redis-cli --cluster reshard` does: the two nodes mark it IMPORTING and MIGRATING, its keys
// move batch keys at a time with MIGRATE, and then every node learns its new owner. between
// runs after each batch, while the slot is half moved (nil for none). It fails the test on any
// error.
func (c *Cluster) MoveSlot(t testing.TB, slot int, to *Server, batch int, between func()) {
	t.Helper()
	from := c.Owner(t, slot)
	if from == to {
		t.Fatalf("redistest: slot %d is already on %s", slot, to.Addr)
	}
	do := func(s *Server, args ...string) string {
		t.Helper()
		reply, err := s.Do(args...)
		if err != nil {
			t.Fatalf("redistest: %s %v: %v", s.Addr, args, err)
		}
		return reply
	}
	fromID, toID := do(from, "CLUSTER", "MYID"), do(to, "CLUSTER", "MYID")
	n := strconv.Itoa(slot)
	do(to, "CLUSTER", "SETSLOT", n, "IMPORTING", fromID)
	do(from, "CLUSTER", "SETSLOT", n, "MIGRATING", toID)
	host, port, _ := strings.Cut(to.Addr, ":")
	for {
		keys := do(from, "CLUSTER", "GETKEYSINSLOT", n, strconv.Itoa(batch))
		if keys == "" {
			break
		}
		do(from, append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, strings.Split(keys, "\n")...)...)
		if between != nil {
			between()
		}
	}
	// The two owners first, as redis-cli does, then the others, which would otherwise learn
	// it from the cluster bus.
	do(to, "CLUSTER", "SETSLOT", n, "NODE", toID)
	do(from, "CLUSTER", "SETSLOT", n, "NODE", toID)
	for _, s := range c.Nodes {
		if s != from && s != to && s.Running() {
			do(s, "CLUSTER", "SETSLOT", n, "NODE", toID)
		}
	}
}

// Owner returns the primary that serves slot, as the first node asked (CLUSTER NODES) sees it.
func (c *Cluster) Owner(t testing.TB, slot int) *Server {
	t.Helper()
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		nodes, err := s.Do("CLUSTER", "NODES")
		if err != nil {
			t.Fatalf("redistest: %s CLUSTER NODES: %v", s.Addr, err)
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "master") {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			for _, r := range f[8:] {
				first, last, found := strings.Cut(r, "-")
				lo, err1 := strconv.Atoi(first)
				hi, err2 := strconv.Atoi(last)
				if !found {
					hi, err2 = lo, err1
				}
				if err1 != nil || err2 != nil || slot < lo || slot > hi {
					continue // a slot mid-migration shows as [n->-id]: not an owner's range
				}
				for _, node := range c.Nodes {
					if node.Addr == addr {
						return node
					}
				}
			}
		}
		break
	}
	t.Fatalf("redistest: no node serves slot %d", slot)
	return nil
}
