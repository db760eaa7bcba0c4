package sqlstore

import (
	"context"
	"sync"
)

// Hub fans control versions out to Watch channels. Publish never blocks: each channel holds
// one value, and a newer version replaces one its reader has not taken yet.
type Hub struct {
	mu     sync.Mutex
	subs   map[chan int64]struct{}
	last   int64 // highest version published; older or equal ones are dropped
	closed bool
	done   chan struct{}
}

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{subs: map[chan int64]struct{}{}, done: make(chan struct{})} }

// Subscribe returns a channel of versions published from now on; it is closed when ctx is done
// or the Hub is closed.
func (h *Hub) Subscribe(ctx context.Context) <-chan int64 {
	ch := make(chan int64, 1)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(ch)
		return ch
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-h.done:
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	}()
	return ch
}

// Publish sends v to every subscriber unless a version at least as new was published before.
func (h *Hub) Publish(v int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || v <= h.last {
		return
	}
	h.last = v
	for ch := range h.subs {
		// The mutex makes this the only sender, so after draining the stale value the send
		// cannot find the buffer full.
		select {
		case ch <- v:
		default:
			select {
			case <-ch:
			default:
			}
			ch <- v
		}
	}
}

// Close closes every subscriber's channel; later Subscribe calls get a closed channel.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	close(h.done)
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
}
