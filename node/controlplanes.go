package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Split control planes (issue 29): nodes that share a Redis store but each hold their own
// control store (two SQLite files, or two PostgreSQL databases) enforce different overrides
// and count the same keys. Each node writes, off the hot path, which control store it follows
// into one Redis hash, and reads the others'.
const (
	// controlPlanesKey is the hash of node id -> "IDENTITY SEEN_UNIX"; one key, so it lives
	// on one slot of a Redis Cluster.
	controlPlanesKey = "sluice:control-planes"
	// controlPlanesEvery is how often a node writes its entry and reads the others'.
	controlPlanesEvery = 2 * time.Second
	// controlPlanesLive is how recent an entry must be to count: a few writes, so one late
	// write does not hide a node, and a node gone is forgotten soon.
	controlPlanesLive = 10 * time.Second
)

// controlIdentity names the control store c follows without its secrets: for SQLite the
// file (host and absolute path: another host's file is another store), for PostgreSQL its
// host, port and database.
func controlIdentity(c Config) string {
	if isSQLiteControl(c.control) {
		host, _ := os.Hostname()
		dir, err := filepath.Abs(c.dataDir)
		if err != nil {
			dir = c.dataDir
		}
		return "sqlite:" + host + ":" + filepath.Join(dir, "control.db")
	}
	u, err := url.Parse(c.control)
	if err != nil {
		sum := sha256.Sum256([]byte(c.control))
		return "postgres:" + hex.EncodeToString(sum[:8])
	}
	return "postgres:" + u.Host + u.Path
}

// controlPlanes heartbeats this node's control store into the data store and finds the
// nodes that follow another one.
type controlPlanes struct {
	client rueidis.Client
	key    string
	id     string // this node
	ident  string // its control store
	sqlite bool
	log    *slog.Logger

	mu     sync.Mutex
	others []string // "node (its control store)" of the nodes that follow another store
}

// startControlPlanes starts the heartbeat when the data store is Redis; nil otherwise (a
// memory store is one node's own).
func startControlPlanes(ctx context.Context, st any, c Config, id string, log *slog.Logger) *controlPlanes {
	rc, ok := st.(interface{ Client() rueidis.Client })
	if !ok {
		return nil
	}
	// The store's key prefix (key_prefix, or Envoy's CACHE_KEY_PREFIX) goes in front, as
	// before every key of the store: fleets sharing one Redis under other prefixes are apart.
	prefix := ""
	if su, err := withKeyPrefix(c.storeURL, c.envoy.KeyPrefix); err == nil {
		if u, err := url.Parse(su); err == nil {
			prefix = u.Query().Get("key_prefix")
		}
	}
	p := &controlPlanes{client: rc.Client(), key: prefix + controlPlanesKey, id: id,
		ident: controlIdentity(c), sqlite: isSQLiteControl(c.control), log: log}
	go func() {
		t := time.NewTicker(controlPlanesEvery)
		defer t.Stop()
		for {
			p.beat(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// beat writes this node's entry, reads the others', forgets the stale ones and logs a split
// when one appears.
func (p *controlPlanes) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, controlPlanesEvery)
	defer cancel()
	now := time.Now()
	c := p.client
	if err := c.Do(ctx, c.B().Hset().Key(p.key).FieldValue().FieldValue(p.id, p.ident+" "+strconv.FormatInt(now.Unix(), 10)).Build()).Error(); err != nil {
		p.log.Debug("control plane heartbeat not written to the data store", "err", err)
		return
	}
	all, err := c.Do(ctx, c.B().Hgetall().Key(p.key).Build()).AsStrMap()
	if err != nil {
		return
	}
	var others, stale []string
	for node, v := range all {
		ident, at, _ := strings.Cut(v, " ")
		sec, err := strconv.ParseInt(at, 10, 64)
		if err != nil || now.Sub(time.Unix(sec, 0)) > controlPlanesLive {
			stale = append(stale, node)
			continue
		}
		if node != p.id && ident != p.ident {
			others = append(others, fmt.Sprintf("%s (%s)", node, ident))
		}
	}
	if len(stale) > 0 {
		c.Do(ctx, c.B().Hdel().Key(p.key).Field(stale...).Build())
	}
	slices.Sort(others)
	p.mu.Lock()
	before := p.others
	p.others = others
	p.mu.Unlock()
	if len(others) > 0 && !slices.Equal(before, others) {
		p.log.Error("split control plane: nodes share this data store but follow other control stores, so each enforces its own overrides and rules; give every node the same PostgreSQL control store with --control postgres://... (SLUICE_CONTROL)",
			"control_store", p.ident, "other_nodes", others)
	}
}

// Health is /readyz's optional "control_plane" check: an error naming the nodes that share
// the data store but follow another control store, and the fix.
func (p *controlPlanes) Health(context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.others) == 0 {
		return nil
	}
	return fmt.Errorf("split control plane: %s share the data store but follow another control store than this node's (%s); use one PostgreSQL control store for the fleet (--control)",
		strings.Join(p.others, ", "), p.ident)
}
