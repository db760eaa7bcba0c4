package adminapi

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/control"
)

// TokenUseInterval is how often a token's last-used time is written at most: an admin call
// costs a map update under a lock, never a write to the control store.
const TokenUseInterval = time.Minute

// tokenUseFlush is how often the writer looks for uses to record.
const tokenUseFlush = 5 * time.Second

// tokenUse records when tokens were last used. note runs on the request path and only marks
// the token in a map when its last recorded use is TokenUseInterval old; a goroutine writes the
// marks with control.Store.TokenUsed every few seconds.
type tokenUse struct {
	store control.Store
	log   *slog.Logger

	mu      sync.Mutex
	written map[string]time.Time // the use last handed to the writer, per token
	pending map[string]time.Time // uses to write

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newTokenUse(store control.Store, log *slog.Logger) *tokenUse {
	u := &tokenUse{store: store, log: log, written: map[string]time.Time{}, pending: map[string]time.Time{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go u.run()
	return u
}

// note records a use of the token called name at now.
func (u *tokenUse) note(name string, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if last, ok := u.written[name]; ok && now.Sub(last) < TokenUseInterval {
		return
	}
	u.written[name] = now
	u.pending[name] = now
}

func (u *tokenUse) run() {
	defer close(u.done)
	t := time.NewTicker(tokenUseFlush)
	defer t.Stop()
	for {
		select {
		case <-u.stop:
			u.flush()
			return
		case <-t.C:
			u.flush()
		}
	}
}

// flush writes the pending uses. A failed write is logged and dropped: a last-used time is a
// hint for operators, not worth retrying against a store that is down.
func (u *tokenUse) flush() {
	u.mu.Lock()
	batch := u.pending
	u.pending = map[string]time.Time{}
	u.mu.Unlock()
	for name, at := range batch {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := u.store.TokenUsed(ctx, name, at); err != nil {
			u.log.Debug("recording an admin token's use failed", "token", name, "err", err)
		}
		cancel()
	}
}

// close writes what is pending and stops the writer.
func (u *tokenUse) close() {
	u.once.Do(func() {
		close(u.stop)
		<-u.done
	})
}
