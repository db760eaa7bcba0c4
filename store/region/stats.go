package region

import (
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// Stats are the region's figures as of a moment: what the transport exports as metrics
// (sluice_region_peer_up, sluice_region_lag_seconds, sluice_region_inbox_*) and tests read.
type Stats struct {
	// Peers are the other regions, sorted by name.
	Peers []PeerStats
	// RemoteKeys is how many keys the other regions' counts are held for.
	RemoteKeys int
	// Inbox is whether the region's store keeps an inbox; the counts below are 0 without.
	Inbox bool
	// InboxLostQueue and InboxLostAppend count the Syncs this node received that did not reach
	// the inbox: the queue was full, or the append failed. InboxSkipped counts the records
	// read from it that did not read or check, skipped whole.
	InboxLostQueue, InboxLostAppend, InboxSkipped uint64
}

// PeerStats are one other region's figures.
type PeerStats struct {
	// Name is the region's name.
	Name string
	// Up is whether the region was heard from within Config.Timeout: a Sync from it arrived
	// (directly or through the inbox) or one to it was acknowledged.
	Up bool
	// LastReport is when the newest Sync from the region arrived; zero before any.
	LastReport time.Time
	// Lag is the age of the newest counts held from it: the time since LastReport plus the
	// measured one-way delay. Meaningless while LastReport is zero.
	Lag time.Duration
}

// Stats returns the region's figures now. It takes the table's lock briefly: call it for a
// scrape, not per request.
func (r *Region) Stats() Stats {
	now := r.nowMicros()
	st := Stats{Peers: make([]PeerStats, len(r.peers)), Inbox: r.inbox != nil}
	for i, p := range r.peers {
		ps := PeerStats{Name: p.name, Up: r.isUp(p, now)}
		if h := p.fromPeer.Load(); h > 0 {
			ps.LastReport = time.UnixMicro(h)
			ps.Lag = time.Duration(now-h+p.delay.Load()) * time.Microsecond
		}
		st.Peers[i] = ps
	}
	r.table.mu.RLock()
	st.RemoteKeys = len(r.table.keys)
	r.table.mu.RUnlock()
	if st.Inbox {
		st.InboxLostQueue, st.InboxLostAppend, st.InboxSkipped = r.inboxLostQueue.Load(), r.inboxLostAppend.Load(), r.inboxSkipped.Load()
	}
	return st
}

// Remote returns what the other regions take now of the limit p of key, a key of a rule with
// regions: global: their last counts plus the reservation of their in-flight demand, as Apply
// subtracts it. For status pages and tests.
func (r *Region) Remote(key []byte, p *algorithm.Params) int64 {
	return r.remote(key, p, r.nowMicros())
}
