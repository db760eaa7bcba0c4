// Package fleetstats keeps a node's live statistics for the dashboard (docs/architecture.md,
// Dashboard): decisions per second allowed, soft and denied per rule, the p99 decision
// latency, the store and its circuit breaker, and each rule's top consumers in a bounded
// Space-Saving sketch (internal/sketch). A node sends its NodeStats with every heartbeat to
// the control store, where Merge adds up the fleet's, without the nodes talking to each other.
//
// It is fed by the decision recorder (telemetry/usage) off the hot path: Observe runs on the
// recorder's gathering goroutine, never on a deciding one.
package fleetstats

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/sketch"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// Defaults of Options.
const (
	// DefaultRateWindow is the window decision rates are averaged over.
	DefaultRateWindow = 10 * time.Second
	// DefaultTopWindow is how long a consumer counts in the top list: the top is over the
	// last one to two windows (two generations of sketches).
	DefaultTopWindow = time.Minute
	// DefaultTopK is the counters of each rule's sketch; DefaultTopReport how many of them a
	// heartbeat carries.
	DefaultTopK      = 64
	DefaultTopReport = 20
	// DefaultMaxRules bounds the rules a node keeps statistics of, so that a policy of
	// thousands of rules (or RLS limits named per descriptor) cannot grow a heartbeat past
	// control.MaxNodeStatsLen: 256 rules of 20 consumers of at most MaxKeyLen bytes.
	DefaultMaxRules = 256
	// MaxKeyLen bounds a consumer's key in the sketch, in bytes.
	MaxKeyLen = 160
)

// Options configure a Collector; zero values take the defaults.
type Options struct {
	// Node is this node's id, as its heartbeat names it.
	Node string
	// Store names the decision store ("memory", "redis"); StoreUp, when set, pings it.
	Store   string
	StoreUp func(context.Context) error
	// Gatherer is the registry holding sluice_check_duration_seconds and
	// sluice_store_breaker_state, read once a second by Run for the latency and the breaker.
	Gatherer prometheus.Gatherer

	RateWindow time.Duration
	TopWindow  time.Duration
	TopK       int
	TopReport  int
	MaxRules   int
	// Now is the clock; time.Now when nil. Tests inject one.
	Now    func() time.Time
	Logger *slog.Logger
}

// Collector gathers one node's statistics. Its methods are safe for concurrent use.
type Collector struct {
	o Options

	secs int // the rate window in whole seconds: the length of each rule's ring

	mu      sync.Mutex
	rules   map[string]*ruleStats
	dropped int64 // observations of rules past MaxRules
	topGen  int64 // the TopWindow generation the sketches' cur holds

	lat     latency
	breaker string
	storeUp bool
	sampled bool
}

// ruleStats is one rule's counts. buckets is a ring of per-second counts covering RateWindow.
type ruleStats struct {
	total    Counts
	buckets  []bucket
	cur, old *sketch.SpaceSaving
}

type bucket struct {
	sec int64
	c   Counts
}

// Counts are decisions by outcome.
type Counts struct {
	Allowed int64 `json:"allowed"`
	Soft    int64 `json:"soft"`
	Denied  int64 `json:"denied"`
}

func (c *Counts) add(o usage.Outcome, n int64) {
	switch o {
	case usage.OutcomeSoft:
		c.Soft += n
	case usage.OutcomeDenied:
		c.Denied += n
	default:
		c.Allowed += n
	}
}

// New returns a Collector. Call Run to sample the latency, breaker and store.
func New(o Options) *Collector {
	if o.RateWindow <= 0 {
		o.RateWindow = DefaultRateWindow
	}
	if o.TopWindow <= 0 {
		o.TopWindow = DefaultTopWindow
	}
	if o.TopK <= 0 {
		o.TopK = DefaultTopK
	}
	if o.TopReport <= 0 {
		o.TopReport = DefaultTopReport
	}
	if o.MaxRules <= 0 {
		o.MaxRules = DefaultMaxRules
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	secs := int((o.RateWindow + time.Second - 1) / time.Second)
	return &Collector{o: o, secs: secs, rules: map[string]*ruleStats{}, storeUp: true}
}

// Consumer is the key a decision counts under in a rule's top list: the tenant and the
// caller's most specific identity (the hashed API key, else the user, else the IP).
func Consumer(tenant, user, apiKey, ip string) string {
	id := ""
	switch {
	case apiKey != "":
		id = "api_key:" + apiKey
	case user != "":
		id = "user:" + user
	case ip != "":
		id = "ip:" + ip
	}
	k := tenant + "\x00" + id
	if len(k) > MaxKeyLen {
		k = k[:MaxKeyLen]
	}
	return k
}

// splitConsumer undoes Consumer.
func splitConsumer(k string) (tenant, id string) {
	tenant, id, _ = strings.Cut(k, "\x00")
	return tenant, id
}

// Observe counts one limit's outcome. It is an usage.Options.Observe.
func (c *Collector) Observe(o usage.Observation) {
	now := o.At
	if now.IsZero() {
		now = c.o.Now()
	}
	sec := now.Unix()
	key := Consumer(o.Tenant, o.User, o.APIKey, o.IP)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rotate(now)
	r := c.rule(o.Rule)
	if r == nil {
		c.dropped++
		return
	}
	r.total.add(o.Outcome, 1)
	b := &r.buckets[sec%int64(len(r.buckets))]
	if b.sec != sec {
		*b = bucket{sec: sec}
	}
	b.c.add(o.Outcome, 1)
	r.cur.Add([]byte(key))
}

// rotate moves the top sketches into now's TopWindow generation. c.mu is held.
func (c *Collector) rotate(now time.Time) {
	gen := now.UnixNano() / int64(c.o.TopWindow)
	if gen <= c.topGen {
		// An observation stamped before a snapshot rotated (the recorder reads the clock
		// once per decision, before the lock) must not rotate back and drop the window.
		return
	}
	for _, r := range c.rules {
		r.old, r.cur = r.cur, r.old
		r.cur.Reset()
		if gen > c.topGen+1 { // a whole window passed without a rotation: old is stale too
			r.old.Reset()
		}
	}
	c.topGen = gen
}

// rule returns name's stats, made on first sight; nil past MaxRules. c.mu is held.
func (c *Collector) rule(name string) *ruleStats {
	r, ok := c.rules[name]
	if ok {
		return r
	}
	if len(c.rules) >= c.o.MaxRules {
		return nil
	}
	r = &ruleStats{buckets: make([]bucket, c.secs), cur: sketch.New(c.o.TopK), old: sketch.New(c.o.TopK)}
	c.rules[name] = r
	return r
}

// NodeStats is one node's statistics as its heartbeat carries them: its health, and its rules'.
type NodeStats struct {
	NodeHealth
	Rules []RuleStats `json:"rules"`
	// DroppedRules counts observations of rules past the bound on rules kept.
	DroppedRules int64 `json:"dropped_rules,omitempty"`
}

// NodeHealth is a node's part of NodeStats and of Fleet: its store, breaker and latency.
type NodeHealth struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	// Store is the decision store's name; StoreUp whether it answered at the last sample;
	// Breaker the state of its circuit breaker (closed, half-open, open; "" for the memory
	// store, which has none).
	Store   string `json:"store"`
	StoreUp bool   `json:"store_up"`
	Breaker string `json:"breaker,omitempty"`
	// P99Ms is the 99th percentile of decision latency over the last RateWindow, in
	// milliseconds, inside Sluice; 0 when nothing was decided.
	P99Ms float64 `json:"p99_ms"`
	// Decisions counts the latency's decisions over the same window.
	Decisions int64 `json:"decisions"`
	// RateWindow is the window rates are averaged over, in seconds.
	RateWindow float64 `json:"rate_window_s"`
}

// RuleStats is one rule's part of NodeStats.
type RuleStats struct {
	Rule string `json:"rule"`
	// Rate is decisions per second over the rate window; Total since the node started.
	Rate  Rates  `json:"rate"`
	Total Counts `json:"total"`
	// Top is the rule's heaviest consumers over the last one to two top windows.
	Top sketch.Summary `json:"top"`
}

// Rates are decisions per second by outcome.
type Rates struct {
	Allowed float64 `json:"allowed"`
	Soft    float64 `json:"soft"`
	Denied  float64 `json:"denied"`
}

// Snapshot returns the node's statistics now.
func (c *Collector) Snapshot() NodeStats {
	now := c.o.Now()
	sec := now.Unix()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rotate(now)
	window := float64(c.secs)
	s := NodeStats{
		NodeHealth:   NodeHealth{Node: c.o.Node, At: now.UTC(), Store: c.o.Store, StoreUp: c.storeUp, Breaker: c.breaker, RateWindow: window},
		DroppedRules: c.dropped,
	}
	s.P99Ms, s.Decisions = c.lat.p99()
	for name, r := range c.rules {
		var sum Counts
		for _, b := range r.buckets {
			// The current second is partial: the window is the last full seconds and this one.
			if b.sec > sec-int64(c.secs) && b.sec <= sec {
				sum.Allowed, sum.Soft, sum.Denied = sum.Allowed+b.c.Allowed, sum.Soft+b.c.Soft, sum.Denied+b.c.Denied
			}
		}
		s.Rules = append(s.Rules, RuleStats{
			Rule:  name,
			Rate:  Rates{float64(sum.Allowed) / window, float64(sum.Soft) / window, float64(sum.Denied) / window},
			Total: r.total,
			Top:   sketch.Merge(c.o.TopReport, r.cur.Summary(), r.old.Summary()),
		})
	}
	slices.SortFunc(s.Rules, func(a, b RuleStats) int { return strings.Compare(a.Rule, b.Rule) })
	return s
}

// JSON returns Snapshot encoded for a heartbeat.
func (c *Collector) JSON() []byte {
	b, err := json.Marshal(c.Snapshot())
	if err != nil {
		c.o.Logger.Warn("fleet stats", "err", err) // cannot happen: plain values
		return nil
	}
	return b
}

// Run samples the latency histogram, the breaker and the store every second until ctx ends.
func (c *Collector) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		c.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample reads the latency histogram, the breaker and the store once.
func (c *Collector) Sample(ctx context.Context) {
	var (
		hist    histogram
		breaker string
		ok      bool
	)
	if c.o.Gatherer != nil {
		mfs, err := c.o.Gatherer.Gather()
		if err != nil {
			c.o.Logger.Debug("fleet stats: gather metrics", "err", err)
		}
		hist, breaker, ok = readMetrics(mfs)
	}
	up := true
	if c.o.StoreUp != nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		up = c.o.StoreUp(pctx) == nil
		cancel()
	}
	now := c.o.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok || c.o.Gatherer != nil {
		// Before the first decision the histogram is not gathered at all (a vector without
		// series): an empty sample is then the base, so that the first decisions count in the
		// window instead of becoming the base themselves.
		c.lat.push(now, hist, c.o.RateWindow)
	}
	c.breaker, c.storeUp = breaker, up
}
