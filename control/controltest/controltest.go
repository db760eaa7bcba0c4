// Package controltest is the conformance suite every control.Store driver passes: the same
// tests, run against each real database, so that SQLite and PostgreSQL mean the same thing.
//
//	func TestConformance(t *testing.T) {
//		controltest.Run(t, controltest.Harness{NewDB: ..., Open: ...})
//	}
package controltest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// Harness tells the suite how to get databases and open Stores on them.
type Harness struct {
	// NewDB returns the address of a fresh, empty database that lives until t ends.
	NewDB func(t *testing.T) string
	// Open opens a Store on the database at addr and closes it when t ends. Opening the
	// same addr twice gives two Stores on one database, as two nodes of a fleet have.
	Open func(t *testing.T, addr string, opts control.Options) control.Store
	// Columns returns the column names of a table, for schema checks.
	Columns func(t *testing.T, addr, table string) []string
}

// Clock is a settable clock for Options.Now.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// start is where every test's clock begins: nanoseconds and a zone other than UTC, which the
// stores must drop and convert.
var start = time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))

// env is one test's database, clock and first Store.
type env struct {
	t     *testing.T
	h     Harness
	addr  string
	clock *Clock
	s     control.Store
	ctx   context.Context
}

func newEnv(t *testing.T, h Harness) *env {
	e := &env{t: t, h: h, addr: h.NewDB(t), clock: NewClock(start), ctx: t.Context()}
	e.s = e.open()
	return e
}

// open opens another Store on the test's database, sharing its clock.
func (e *env) open() control.Store {
	return e.h.Open(e.t, e.addr, control.Options{Now: e.clock.Now})
}

// Run runs the suite. Each test gets its own database.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Rules", testRules},
		{"RuleIfMatch", testRuleIfMatch},
		{"RuleInvalid", testRuleInvalid},
		{"ConcurrentIfMatch", testConcurrentIfMatch},
		{"Overrides", testOverrides},
		{"OverrideConflict", testOverrideConflict},
		{"OverrideInvalid", testOverrideInvalid},
		{"IdentityOverrides", testIdentityOverrides},
		{"Escalation", testEscalation},
		{"Exemptions", testExemptions},
		{"OverridePatch", testOverridePatch},
		{"ExemptionPatch", testExemptionPatch},
		{"Identities", testIdentities},
		{"Domains", testDomains},
		{"Tokens", testTokens},
		{"LastAdmin", testLastAdmin},
		{"TokenExpiryAndUse", testTokenExpiryAndUse},
		{"AuditFilters", testAuditFilters},
		{"AuditRetention", testAuditRetention},
		{"VersionAndLoad", testVersionAndLoad},
		{"LoadReportsProgress", testLoadReportsProgress},
		{"WatchOtherStore", testWatchOtherStore},
		{"WatchClose", testWatchClose},
		{"Expire", testExpire},
		{"Heartbeats", testHeartbeats},
		{"HostileStrings", testHostileStrings},
		{"RejectedStrings", testRejectedStrings},
		{"Reopen", testReopen},
		{"ConcurrentWriters", testConcurrentWriters},
		{"CountsAddUp", testCountsAddUp},
		{"CountsInBulk", testCountsInBulk},
		{"Leases", testLeases},
		{"WindowTotals", testWindowTotals},
		{"Changes", testChanges},
		{"Import", testImport},
		{"Paging", testPaging},
		{"PagingViolations", testPagingViolations},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newEnv(t, h))
		})
	}
}
