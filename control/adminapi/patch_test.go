package adminapi_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// PATCH of an override and an exemption changes them in place: same id, a new ETag, one
// audit event "update"; bad input answers 400 naming the field and changes nothing.
func TestPatchOverridesAndExemptions(t *testing.T) {
	e := newEnv(t)
	ban := e.mustCreate("POST", "/admin/v1/overrides", `{"tenant":"acme","type":"ban","ttl":"1h","reason":"abuse"}`)
	mult := e.mustCreate("POST", "/admin/v1/overrides", `{"user":"bob","type":"multiplier","value":0.5,"ttl":"1h","reason":"slow"}`)
	custom := e.mustCreate("POST", "/admin/v1/overrides", `{"api_key":"k1","type":"custom","limit":5,"burst":10,"ttl":"1h","reason":"deal"}`)
	ex := e.mustCreate("POST", "/admin/v1/exemptions", `{"user":"probe","reason":"health","expires_at":"`+e.in(time.Hour)+`"}`)
	path := func(kind string, r *reply) string {
		return "/admin/v1/" + kind + "/" + strconv.FormatInt(int64(r.json["id"].(float64)), 10)
	}
	banPath, multPath, customPath, exPath := path("overrides", ban), path("overrides", mult), path("overrides", custom), path("exemptions", ex)
	e.clock.Add(time.Minute)

	t.Run("changes", func(t *testing.T) {
		for _, tc := range []struct {
			name, path, body string
			check            func(r *reply) bool
		}{
			{"extend a ban by ttl", banPath, `{"ttl":"2h"}`, func(r *reply) bool {
				return r.str("expires_at") == e.clock.Now().Add(2*time.Hour).Format(time.RFC3339Nano)
			}},
			{"extend a ban to a time", banPath, `{"expires_at":"2030-01-01T00:00:00Z","reason":"repeat offender"}`, func(r *reply) bool {
				return r.str("expires_at") == "2030-01-01T00:00:00Z" && r.str("reason") == "repeat offender" && r.str("tenant") == "acme"
			}},
			{"a GET's body sent back", banPath, `{"id":1,"tenant":"acme","type":"ban","source":"api","created_by":"x","created_at":"2020-01-01T00:00:00Z","reason":"same"}`, func(r *reply) bool {
				return r.str("reason") == "same" && r.str("created_by") == "writer"
			}},
			{"multiplier value", multPath, `{"value":0.1}`, func(r *reply) bool { return r.json["value"] == 0.1 }},
			{"custom limit, burst removed", customPath, `{"limit":7,"burst":null}`, func(r *reply) bool { return r.json["limit"] == float64(7) && r.json["burst"] == nil }},
			{"exemption never expires", exPath, `{"expires_at":null}`, func(r *reply) bool { _, ok := r.json["expires_at"]; return !ok && r.str("user") == "probe" }},
			{"exemption ttl and reason", exPath, `{"ttl":"30m","reason":"rollout"}`, func(r *reply) bool {
				return r.str("expires_at") == e.clock.Now().Add(30*time.Minute).Format(time.RFC3339Nano) && r.str("reason") == "rollout"
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := e.do(call{method: "GET", path: tc.path, role: control.RoleRead}).want(t, 200)
				n := e.auditCount()
				r := e.do(call{method: "PATCH", path: tc.path, role: control.RoleWrite, body: tc.body, contentType: mergePatchType}).want(t, 200)
				if !tc.check(r) {
					t.Errorf("answer: %s", r.raw)
				}
				if r.json["id"] != before.json["id"] || r.header.Get("ETag") == before.header.Get("ETag") || r.str("policy_version") == "" {
					t.Errorf("id %v -> %v, ETag %s -> %s, policy_version %q", before.json["id"], r.json["id"], before.header.Get("ETag"), r.header.Get("ETag"), r.str("policy_version"))
				}
				after := e.do(call{method: "GET", path: tc.path, role: control.RoleRead}).want(t, 200)
				if after.header.Get("ETag") != r.header.Get("ETag") {
					t.Errorf("GET ETag %s after PATCH answered %s", after.header.Get("ETag"), r.header.Get("ETag"))
				}
				evs, err := e.store.Audit(e.ctx, control.AuditFilter{Limit: 1})
				if err != nil || len(evs) != 1 || evs[0].Action != control.ActionUpdate || evs[0].Before == nil || evs[0].After == nil || e.auditCount() != n+1 {
					t.Errorf("audit: %+v %v (%d events, were %d)", evs, err, e.auditCount(), n)
				}
			})
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct{ name, path, body, field string }{
			{"past expiry", banPath, `{"expires_at":"2020-01-01T00:00:00Z"}`, "expires_at"},
			{"both expiries", banPath, `{"ttl":"1h","expires_at":"2030-01-01T00:00:00Z"}`, "ttl"},
			{"bad ttl", banPath, `{"ttl":"soon"}`, "ttl"},
			{"negative ttl", banPath, `{"ttl":"-5m"}`, "ttl"},
			{"expiry removed", banPath, `{"expires_at":null}`, "expires_at"},
			{"reason removed", banPath, `{"reason":null}`, "reason"},
			{"empty reason", banPath, `{"reason":""}`, "reason"},
			{"target changed", banPath, `{"tenant":"other"}`, "tenant"},
			{"target removed", banPath, `{"tenant":null}`, "tenant"},
			{"type changed", banPath, `{"type":"multiplier","value":2}`, "type"},
			{"unknown field", banPath, `{"ttl":"1h","bogus":1}`, "bogus"},
			{"unknown field null", banPath, `{"bogus":null}`, "bogus"},
			{"limit as string", customPath, `{"limit":"5"}`, "limit"},
			{"limit fraction", customPath, `{"limit":1.5}`, "limit"},
			{"custom limit removed", customPath, `{"limit":null}`, "limit"},
			{"multiplier zero", multPath, `{"value":0}`, "value"},
			{"multiplier huge", multPath, `{"value":5000}`, "value"},
			{"multiplier as string", multPath, `{"value":"1"}`, "value"},
			{"exemption value", exPath, `{"value":2}`, "value"},
			{"exemption caller changed", exPath, `{"ip":"10.0.0.1"}`, "ip"},
			{"exemption past expiry", exPath, `{"expires_at":"2001-01-01T00:00:00Z"}`, "expires_at"},
			{"exemption ttl null", exPath, `{"ttl":null}`, "ttl"},
			{"not an object", banPath, `[1]`, "body"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				v, n := e.version(), e.auditCount()
				r := e.do(call{method: "PATCH", path: tc.path, role: control.RoleWrite, body: tc.body, contentType: mergePatchType})
				if r.status != http.StatusBadRequest || r.str("field") != tc.field {
					t.Errorf("%d field %q, want 400 naming %q: %s", r.status, r.str("field"), tc.field, r.raw)
				}
				if e.version() != v || e.auditCount() != n {
					t.Errorf("bad input changed the store")
				}
			})
		}
	})

	t.Run("status", func(t *testing.T) {
		cur := e.do(call{method: "GET", path: banPath, role: control.RoleRead}).want(t, 200)
		for _, tc := range []struct {
			name   string
			c      call
			status int
		}{
			{"file override", call{method: "PATCH", path: "/admin/v1/overrides/-1", body: `{"ttl":"1h"}`}, 409},
			{"file exemption", call{method: "PATCH", path: "/admin/v1/exemptions/-1", body: `{"reason":"x"}`}, 409},
			{"missing override", call{method: "PATCH", path: "/admin/v1/overrides/999", body: `{"ttl":"1h"}`}, 404},
			{"missing file override", call{method: "PATCH", path: "/admin/v1/overrides/-9", body: `{"ttl":"1h"}`}, 404},
			{"missing exemption", call{method: "PATCH", path: "/admin/v1/exemptions/999", body: `{"reason":"x"}`}, 404},
			{"stale If-Match", call{method: "PATCH", path: banPath, body: `{"ttl":"1h"}`, header: map[string]string{"If-Match": `"1"`}}, 412},
			{"If-Match on a missing one", call{method: "PATCH", path: "/admin/v1/overrides/999", body: `{"ttl":"1h"}`, header: map[string]string{"If-Match": "*"}}, 412},
			{"text body", call{method: "PATCH", path: banPath, body: `{"ttl":"1h"}`, contentType: "text/plain"}, 415},
			{"read token", call{method: "PATCH", path: banPath, body: `{"ttl":"1h"}`, role: control.RoleRead}, 403},
			{"current If-Match, application/json", call{method: "PATCH", path: banPath, body: `{"ttl":"3h"}`, contentType: "application/json", header: map[string]string{"If-Match": cur.header.Get("ETag")}}, 200},
			{"same If-Match again", call{method: "PATCH", path: banPath, body: `{"ttl":"3h"}`, header: map[string]string{"If-Match": cur.header.Get("ETag")}}, 412},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.c.role == "" {
					tc.c.role = control.RoleWrite
				}
				if tc.c.contentType == "" {
					tc.c.contentType = mergePatchType
				}
				v := e.version()
				r := e.do(tc.c)
				if r.status != tc.status {
					t.Fatalf("%d %s, want %d", r.status, r.raw, tc.status)
				}
				if tc.status >= 400 && e.version() != v {
					t.Error("a refused change changed the store")
				}
			})
		}
	})
}
