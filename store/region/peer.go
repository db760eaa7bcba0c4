package region

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxInFlight bounds the Sync calls to one peer that may be under way: when a link's round
// trip is longer than the sync interval, calls overlap rather than wait, so the others' view
// stays one interval old; past the bound a slow peer is skipped rather than piled on.
const maxInFlight = 16

// maxMessage bounds the counts of one Sync message, in bytes, well under the 1 MiB that
// serve's gRPC server accepts.
const maxMessage = 256 << 10

// client is the link to a peer and the delivery state of the sync to it.
type client struct {
	link Link // nil until Start

	mu sync.Mutex
	// sent is the change number up to which counts were sent; acked up to which a call
	// succeeded that started at or below acked. A failed call sets sent back to acked, so
	// the next call sends again everything the peer may have missed.
	sent, acked uint64
	// full is when all tracked counts were last sent (µs), not only those that changed.
	full     int64
	inFlight atomic.Int32
	up       bool // as last logged
}

func (c *client) close() {
	if c.link != nil {
		c.link.Close()
	}
}

// Start connects to the peers through dial and begins the sync, until Stop. A link that
// becomes ready again (dial's LinkConfig.Ready) makes a sync at once: a healed link carries
// what the partition held back within one sync of the heal.
func (r *Region) Start(dial Dialer) error {
	for _, p := range r.peers {
		link, err := dial(LinkConfig{Name: p.name, Addr: p.addr, Sync: r.cfg.Sync, CallTimeout: r.callTimeout(), Ready: r.ready})
		if err != nil {
			for _, q := range r.peers {
				q.close()
			}
			return fmt.Errorf("--regions: %s=%s: %w", p.name, p.addr, err)
		}
		p.link = link
	}
	r.done.Add(1)
	go r.loop()
	if r.inbox != nil {
		r.done.Add(2)
		go r.writeInbox()
		go r.readInbox()
	}
	return nil
}

// Receive merges a peer's Sync, as the transport received it. The message is checked whole
// before anything is merged: a field that does not check is a *FieldError naming it. It is
// also queued for the region's inbox, when its store keeps one, so that the region's other
// nodes learn it too; Receive never waits for that.
func (r *Region) Receive(msg *SyncMessage) error {
	pi, counts, err := r.checkSync(msg)
	if err != nil {
		return err
	}
	now := r.nowMicros()
	r.postInbox(msg, now)
	r.receive(pi, counts, now)
	p := r.peers[pi]
	p.stale.arrived(msg.SentAtUs, now)
	storeMax(&p.fromPeer, now)
	storeMax(&p.heard, now)
	return nil
}

// ready kicks the sync loop: a peer's link became ready again, and carries every count the
// partition held back at once, not at the next tick.
func (r *Region) ready() {
	select {
	case r.kick <- struct{}{}:
	default: // a sync is due already
	}
}

// loop syncs every Config.Sync, or at once when a link became ready, until Stop.
func (r *Region) loop() {
	defer r.done.Done()
	t := time.NewTicker(r.cfg.Sync)
	defer t.Stop()
	var lastSweep int64
	var readErrs int
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.kick:
		}
		now := r.nowMicros()
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
		seq, err := r.read(ctx, now)
		cancel()
		if err != nil {
			// The peers keep the last counts, and this region's store is what is failing: the
			// limiter's own store errors show it. One line per 100 failures is enough here.
			if readErrs%100 == 0 {
				r.log.Warn("region sync: reading this region's counts failed", "err", err)
			}
			readErrs++
		}
		acked := seq
		for _, p := range r.peers {
			r.send(p, seq, now)
			p.mu.Lock()
			acked = min(acked, p.acked)
			p.mu.Unlock()
			r.logPeer(p, now)
		}
		r.prune(acked, now)
		if now-lastSweep > time.Second.Microseconds() {
			lastSweep = now
			r.sweep(now)
		}
	}
}

// send starts a Sync call to p with the counts changed since its last delivery, or with all
// of them every Config.Resend: a peer whose nodes share the Syncs through their store's inbox may
// have lost some (a trimmed inbox, a restarted node), and the full send makes that good.
func (r *Region) send(p *peer, seq uint64, now int64) {
	if p.inFlight.Load() >= maxInFlight {
		return
	}
	p.mu.Lock()
	from := p.sent
	if now-p.full >= r.cfg.Resend.Microseconds() {
		from, p.full = 0, now
	}
	p.sent = max(p.sent, seq)
	p.mu.Unlock()
	entries := r.outbox(from)
	// Messages of at most maxMessage bytes of counts: a node's gRPC server refuses large
	// messages, and after a long partition a region may have many keys to tell.
	var reqs []*SyncMessage
	size := 0
	for i, e := range entries {
		if i == 0 || size+len(e.key)+32 > maxMessage {
			reqs = append(reqs, &SyncMessage{Region: r.cfg.Name, SentAtUs: now, SyncIntervalUs: r.cfg.Sync.Microseconds()})
			size = 0
		}
		req := reqs[len(reqs)-1]
		req.Counts = append(req.Counts, WindowCount{Key: e.key, WindowStartUs: e.start, Count: e.count, Rate: e.rate})
		size += len(e.key) + 32
	}
	if len(reqs) == 0 {
		// Sent anyway: it tells the peer this region is alive, and measures the delay.
		reqs = append(reqs, &SyncMessage{Region: r.cfg.Name, SentAtUs: now, SyncIntervalUs: r.cfg.Sync.Microseconds()})
	}
	p.inFlight.Add(1)
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		defer p.inFlight.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), r.callTimeout())
		defer cancel()
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		var err error
		var rtt time.Duration
		for _, req := range reqs {
			start := time.Now()
			if err = p.link.Sync(ctx, req); err != nil {
				break
			}
			rtt = time.Since(start)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.sent = p.acked
			return
		}
		if from <= p.acked {
			p.acked = max(p.acked, seq)
		}
		storeMax(&p.heard, r.nowMicros())
		d := rtt.Microseconds() / 2
		p.stale.measured(d)
		if old := p.delay.Load(); old > 0 {
			d = old + (d-old)/4
		}
		p.delay.Store(d)
	}()
}

// callTimeout is the deadline of a Sync call and of a connection attempt: a call or a dial
// stuck on a link that silently drops packets fails soon enough to be made again within a
// second of the heal, rather than after --region-timeout; a second or ten syncs leaves room
// for any round trip between regions.
func (r *Region) callTimeout() time.Duration {
	return min(r.cfg.Timeout, max(time.Second, 10*r.cfg.Sync))
}

// isUp reports whether p was heard from within the timeout.
func (r *Region) isUp(p *peer, now int64) bool {
	h := p.heard.Load()
	return h > 0 && now-h <= r.cfg.Timeout.Microseconds()
}

// logPeer logs p's changes between up and down.
func (r *Region) logPeer(p *peer, now int64) {
	up := r.isUp(p, now)
	p.mu.Lock()
	was := p.up
	p.up = up
	p.mu.Unlock()
	switch {
	case up && !was:
		r.log.Info("region peer up", "region", p.name, "addr", p.addr)
	case !up && was:
		r.log.Warn("region peer down: assuming its last rate", "region", p.name, "addr", p.addr, "timeout", r.cfg.Timeout)
	}
}

// sweep drops the table's keys no peer reported for twice their rule's longest period and the
// timeout: their windows are over.
func (r *Region) sweep(now int64) {
	rs := r.rulesNow()
	t := &r.table
	t.mu.Lock()
	for k, rk := range t.keys {
		horizon := 2*time.Hour.Microseconds() + r.cfg.Timeout.Microseconds()
		if info := rs.byHead[string(headOf([]byte(k)))]; info != nil {
			horizon = 2*info.period + r.cfg.Timeout.Microseconds()
		}
		if now-rk.updated > horizon {
			delete(t.keys, k)
		}
	}
	t.mu.Unlock()
}
