package regionrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/region"
)

const inboxPolicy = "rules:\n  - {name: quota, key: [user], algorithm: fixed_window, limit: 1000, period: 1000h, regions: global}\n"

// logBuffer collects a node's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRedisNode starts a node of region us on the Redis at addr, as its own process would:
// its own connection to the store, Region, Limiter and gRPC server on loopback. Region eu's
// address answers nothing, so what the node learns of eu comes through Syncs sent to the
// region, never from its own calls to eu.
func startRedisNode(t *testing.T, addr string, sync time.Duration, log *logBuffer) *node {
	t.Helper()
	st, err := redis.New(context.Background(), "redis://"+addr, redis.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cfg := region.Config{Name: "us", Peers: map[string]string{"eu": "127.0.0.1:1"}, Sync: sync, Timeout: 5 * time.Second}
	if log != nil {
		cfg.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	return startNode(t, cfg, st)
}

// startNode starts a node with cfg over st: Region, Limiter with inboxPolicy, and gRPC server
// on loopback, all stopped when the test ends.
func startNode(t *testing.T, cfg region.Config, st interface {
	store.Store
	region.Reader
}) *node {
	t.Helper()
	snap, err := policy.LoadFiles(map[string][]byte{"p.yaml": []byte(inboxPolicy)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveNode(t, cfg, st, snap, ln)
}

// keyOf returns the bucket key and parameters of user's quota on n.
func keyOf(n *node, user string) ([]byte, int64) {
	var sc policy.Scratch
	lims := n.lim.Policy().Resolve(&sluice.Request{User: user}, time.Time{}, &sc)
	return bytes.Clone(lims[0].Key), lims[0].Params.Period
}

// syncTo sends n one Sync from eu, as eu's sync would: user's count in the current window.
func syncTo(t *testing.T, n *node, user string, count int64) {
	t.Helper()
	rpc := regionsClient(t, n.addr, testToken)
	k, period := keyOf(n, user)
	now := time.Now().UnixMicro()
	req := &sluicev1.SyncRequest{Region: "eu", SentAtUs: now, SyncIntervalUs: 50_000,
		Counts: []*sluicev1.WindowCount{{Key: k, WindowStartUs: now - now%period, Count: count, Rate: 0}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rpc.Sync(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// TestInboxSharesSyncsAcrossNodes: two nodes of region us share one Redis; a Sync from eu
// reaches only one of them, and the other holds eu's count within about a sync, counts eu
// up, and decides against it.
func TestInboxSharesSyncsAcrossNodes(t *testing.T) {
	t.Parallel()
	const sync = 50 * time.Millisecond
	srv := redistest.Start(t)
	a := startRedisNode(t, srv.Addr, sync, nil)
	b := startRedisNode(t, srv.Addr, sync, nil)
	if peerStats(t, b, "eu").Up {
		t.Fatal("b counts eu up before any Sync")
	}

	syncTo(t, a, "ann", 40)
	if got := remoteOf(a, "ann"); got != 40 {
		t.Fatalf("a, which the Sync reached, holds %d of eu's count, want 40", got)
	}
	took := waitFor(t, 10*time.Second, "b holds eu's count", func() bool { return remoteOf(b, "ann") == 40 })
	t.Logf("b held the count a received %v later (sync %v)", took.Round(time.Millisecond), sync)
	eu := peerStats(t, b, "eu")
	if !eu.Up {
		t.Error("b counts eu down after learning its Sync from the inbox")
	}
	if h := eu.LastReport; h.IsZero() || time.Since(h) > 5*time.Second {
		t.Errorf("b's last report from eu is at %v, not recent: its lag would be wrong", h)
	}

	// The other way round, and the counts grow.
	syncTo(t, b, "ann", 55)
	waitFor(t, 10*time.Second, "a holds eu's count b received", func() bool { return remoteOf(a, "ann") == 55 })

	// b decides against eu's share: 1000 less 55, less this request.
	d := check(t, b.lim, &sluice.Request{User: "ann"})
	if !d.Allowed || d.Remaining != 1000-55-1 {
		t.Errorf("b's decision: allowed %v remaining %d, want allowed with %d", d.Allowed, d.Remaining, 1000-55-1)
	}
}

// peerStats returns n's figures of the peer region name.
func peerStats(t *testing.T, n *node, name string) region.PeerStats {
	t.Helper()
	for _, p := range n.r.Stats().Peers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no peer %s", name)
	return region.PeerStats{}
}

var skippedLine = regexp.MustCompile(`records_skipped=(\d+)`)

// TestInboxSkipsBadRecords: records of the inbox that do not read or check are skipped whole
// and logged, and the good ones around them are merged.
func TestInboxSkipsBadRecords(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var log logBuffer
	b := startRedisNode(t, srv.Addr, 50*time.Millisecond, &log)
	other, err := redis.New(context.Background(), "redis://"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	ann, period := keyOf(b, "ann")
	bob, _ := keyOf(b, "bob")
	now := time.Now().UnixMicro()
	start := now - now%period
	rec := func(req *sluicev1.SyncRequest) []byte { return inboxRecord(t, 7, now, req) }
	good := rec(&sluicev1.SyncRequest{Region: "eu", SentAtUs: now, Counts: []*sluicev1.WindowCount{{Key: ann, WindowStartUs: start, Count: 7}}})
	// bob's count is valid, ann's is not: the record is refused whole, bob's count with it.
	halfBad := rec(&sluicev1.SyncRequest{Region: "eu", SentAtUs: now, Counts: []*sluicev1.WindowCount{
		{Key: bob, WindowStartUs: start, Count: 500}, {Key: ann, WindowStartUs: start, Count: -1}}})
	stranger := rec(&sluicev1.SyncRequest{Region: "mars", SentAtUs: now, Counts: []*sluicev1.WindowCount{{Key: bob, WindowStartUs: start, Count: 500}}})
	wrongVersion := bytes.Clone(good)
	wrongVersion[0] = 99
	noTime := bytes.Clone(good)
	clear(noTime[9:17])
	garbage := append(bytes.Clone(good[:inboxHeader]), 0xff, 0xff, 0xff)
	recs := [][]byte{{}, {1}, wrongVersion, noTime, garbage, halfBad, stranger, good}
	if err := other.AppendInbox(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b merges the good record", func() bool { return remoteOf(b, "ann") == 7 })
	if got := remoteOf(b, "bob"); got != 0 {
		t.Errorf("bob's count is %d, want 0: a bad record was merged in part", got)
	}
	// A read may fall between the appends, so the count may be told over several lines, 10 s
	// apart.
	waitFor(t, 30*time.Second, "b logs the 7 skipped records", func() bool {
		n := 0
		for _, m := range skippedLine.FindAllStringSubmatch(log.String(), -1) {
			k, _ := strconv.Atoi(m[1])
			n += k
		}
		return n == 7
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.t)
	if got := counter(t, reg, "sluice_region_inbox_skipped_total"); got != 7 {
		t.Errorf("sluice_region_inbox_skipped_total %v, want 7", got)
	}
}

// counter reads the unlabelled counter name from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestResendRestoresAMissedSync: a node of us that starts after the inbox lost eu's last
// Sync (trimmed, or here deleted) holds eu's counts again after eu's next full send, though
// they no longer change.
func TestResendRestoresAMissedSync(t *testing.T) {
	t.Parallel()
	const (
		sync   = 50 * time.Millisecond
		resend = time.Second
	)
	srv := redistest.Start(t)
	a := startRedisNode(t, srv.Addr, sync, nil)
	mem := memory.New(memory.WithSweepInterval(0))
	eu := startNode(t, region.Config{Name: "eu", Peers: map[string]string{"us": a.addr}, Sync: sync, Timeout: 5 * time.Second, Resend: resend}, mem)
	for range 30 {
		if d := check(t, eu.lim, &sluice.Request{User: "ann"}); !d.Allowed {
			t.Fatal("eu denied within its limit")
		}
	}
	// Once eu's rate has decayed to 0 and been sent, what us holds is the count alone.
	waitFor(t, 20*time.Second, "a holds eu's 30", func() bool { return remoteOf(a, "ann") == 30 })
	if _, err := srv.Do("DEL", "sl:region:!inbox"); err != nil {
		t.Fatal(err)
	}
	b := startRedisNode(t, srv.Addr, sync, nil)
	took := waitFor(t, 20*time.Second, "b holds eu's 30", func() bool { return remoteOf(b, "ann") == 30 })
	t.Logf("a node that missed eu's Syncs held its counts %v after it started (full send every %v)", took.Round(time.Millisecond), resend)
}

// inboxHeader is the length of an inbox record's header: version, node id, arrival time.
const inboxHeader = 1 + 8 + 8

// inboxRecord returns the inbox record of req received at at by node, in the format of
// store/region's inbox.go written out here, with the generated proto: version 1, the node id
// and the arrival time big-endian, then the SyncRequest as protobuf.
func inboxRecord(t *testing.T, node uint64, at int64, req *sluicev1.SyncRequest) []byte {
	t.Helper()
	buf := make([]byte, inboxHeader)
	buf[0] = 1
	binary.BigEndian.PutUint64(buf[1:], node)
	binary.BigEndian.PutUint64(buf[9:], uint64(at))
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, req)
	if err != nil {
		t.Fatal(err)
	}
	return buf
}
