package adminapi_test

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// TestStatsAndTop: the answering node's fresh stats and the other nodes' heartbeats are
// merged; the answers match the OpenAPI document, and bad parameters answer 400 naming them.
func TestStatsAndTop(t *testing.T) {
	var local *fleetstats.Collector
	e := newEnv(t, func(o *adminapi.Options) {
		o.Fleet = fleetstats.View{Local: func() fleetstats.NodeStats { return local.Snapshot() }}
	})
	local = fleetstats.New(fleetstats.Options{Node: "node-a", Store: "memory", Now: e.clock.Now})
	other := fleetstats.New(fleetstats.Options{Node: "ignored", Store: "redis", Now: e.clock.Now})
	for range 5 {
		local.Observe(usage.Observation{Rule: "r1", Tenant: "acme", User: "bob"})
		other.Observe(usage.Observation{Rule: "r1", Tenant: "acme", User: "bob", Outcome: usage.OutcomeDenied})
	}
	other.Observe(usage.Observation{Rule: "r1", Tenant: "acme", User: "ann"})
	// node-a's heartbeat is stale: the fresh local stats win over it.
	for _, n := range []control.Node{{ID: "node-a", Stats: []byte(`{"rules":[{"rule":"r1","total":{"allowed":1000}}]}`)}, {ID: "node-b", Stats: other.JSON()}, {ID: "node-c", Stats: []byte(`[1]`)}} {
		if err := e.store.Heartbeat(e.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	r := e.do(call{method: "GET", path: "/admin/v1/stats", role: control.RoleRead}).want(t, 200)
	var f fleetstats.Fleet
	if err := json.Unmarshal(r.raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Rules) != 1 || f.Rules[0].Total != (fleetstats.Counts{Allowed: 6, Denied: 5}) {
		t.Errorf("rules %+v, want r1 with 6 allowed and 5 denied", f.Rules)
	}
	if len(f.Nodes) != 2 || f.Nodes[0].Node != "node-a" || f.Nodes[1].Node != "node-b" || f.Nodes[1].Store != "redis" {
		t.Errorf("nodes %+v, want node-a and node-b (node-c's stats do not decode)", f.Nodes)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/top?rule=r1&limit=1", role: control.RoleRead}).want(t, 200)
	var top struct{ Rules []fleetstats.TopRule }
	if err := json.Unmarshal(r.raw, &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Rules) != 1 || len(top.Rules[0].Consumers) != 1 || top.Rules[0].Consumers[0] != (fleetstats.TopConsumer{Tenant: "acme", Consumer: "user:bob", Count: 10}) {
		t.Errorf("top %s", r.raw)
	}
	for _, tc := range []struct{ name, path, field string }{
		{"limit zero", "/admin/v1/top?limit=0", "limit"},
		{"limit too big", "/admin/v1/top?limit=101", "limit"},
		{"limit not a number", "/admin/v1/top?limit=ten", "limit"},
		{"empty rule", "/admin/v1/top?rule=", "rule"},
		{"unknown parameter", "/admin/v1/top?rules=r1", "rules"},
		{"stats takes none", "/admin/v1/stats?node=a", "node"},
	} {
		r := e.doPlain(call{method: "GET", path: tc.path, role: control.RoleRead}).want(t, 400)
		if r.str("field") != tc.field {
			t.Errorf("%s: field %q, want %q (%s)", tc.name, r.str("field"), tc.field, r.raw)
		}
	}
	e.do(call{method: "GET", path: "/admin/v1/stats"}).want(t, 401)
}
