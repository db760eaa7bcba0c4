package controltest

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testEscalation: what escalation writes. A warning is a warn override created with its own
// audit action; a ban replaces it through If-Match, in one change audited once with the
// warning before and the ban after; a stale or missing warning makes the replacement fail
// with nothing written, so two nodes escalating one caller at once cannot both win.
func testEscalation(t *testing.T, e *env) {
	penalty := func(typ control.OverrideType) control.Override {
		return control.Override{
			Tenant: "acme", User: "bob", Rule: "search", Type: typ, ExpiresAt: e.clock.Now().Add(5 * time.Minute),
			Reason: "burst: more than 50 requests within 10s", Source: control.SourceAutomatic,
		}
	}
	by := func(action control.Action, ifMatch string) control.Change {
		return control.Change{Actor: control.ActorAbuseDetector, Action: action, IfMatch: ifMatch}
	}
	warn, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstWarning, ""), penalty(control.OverrideWarn))
	if err != nil {
		t.Fatalf("CreateOverride(warn): %v", err)
	}
	if warn.Type != control.OverrideWarn || warn.CreatedBy != control.ActorAbuseDetector {
		t.Errorf("warning = %+v", warn)
	}
	ev := e.lastEvent(control.ActionBurstWarning, control.KindOverride, strconv.FormatInt(warn.ID, 10), warn.Version)
	if ev.Actor != control.ActorAbuseDetector || ev.Before != nil || ev.After == nil || ev.Reason != warn.Reason {
		t.Errorf("warning event = %+v", ev)
	}
	e.unchanged("a second warning of the same target", control.ErrConflict, func() error {
		_, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstWarning, ""), penalty(control.OverrideWarn))
		return err
	})
	e.unchanged("a ban over a stale warning", control.ErrPreconditionFailed, func() error {
		_, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstBlocked, control.ETag(warn.Version+100)), penalty(control.OverrideBan))
		return err
	})
	e.unchanged("a ban over no warning", control.ErrPreconditionFailed, func() error {
		o := penalty(control.OverrideBan)
		o.User = "carol"
		_, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstBlocked, "*"), o)
		return err
	})
	e.unchanged("an unknown audit action", control.ErrInvalid, func() error {
		_, err := e.s.CreateOverride(e.ctx, by("burst", ""), penalty(control.OverrideWarn))
		invalid(t, "an unknown audit action", err, "action")
		return err
	})

	e.clock.Advance(time.Second)
	ban, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstBlocked, warn.ETag()), penalty(control.OverrideBan))
	if err != nil {
		t.Fatalf("CreateOverride(ban) over the warning: %v", err)
	}
	if ban.ID == warn.ID || ban.Type != control.OverrideBan || !ban.ExpiresAt.Equal(e.now().Add(5*time.Minute)) {
		t.Errorf("ban = %+v", ban)
	}
	evs := e.audit()
	if len(evs) < 2 || evs[1].ID != ev.ID {
		t.Errorf("the replacement wrote more than one audit event: %+v", evs)
	}
	ev = e.lastEvent(control.ActionBurstBlocked, control.KindOverride, strconv.FormatInt(ban.ID, 10), ban.Version)
	var before, after control.Override
	if json.Unmarshal(ev.Before, &before) != nil || json.Unmarshal(ev.After, &after) != nil ||
		before.ID != warn.ID || before.Type != control.OverrideWarn || after.ID != ban.ID || after.Type != control.OverrideBan {
		t.Errorf("ban event before %s after %s; want the warning, then the ban", ev.Before, ev.After)
	}
	if _, err := e.s.GetOverride(e.ctx, warn.ID); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("the warning is still there after its replacement: %v", err)
	}
	if got, err := e.s.ListOverrides(e.ctx, control.OverrideFilter{User: "bob"}); err != nil || len(got) != 1 || got[0].ID != ban.ID {
		t.Errorf("overrides of bob = %+v, %v; want the ban alone", got, err)
	}
	for _, a := range []control.Action{control.ActionBurstWarning, control.ActionBurstBlocked} {
		got, err := e.s.Audit(e.ctx, control.AuditFilter{Action: a})
		if err != nil || len(got) != 1 || got[0].Action != a {
			t.Errorf("Audit(action %s) = %+v, %v", a, got, err)
		}
	}

	// A replacement names the live override: one that has expired is not there to replace.
	e.clock.Advance(5 * time.Minute)
	e.unchanged("a ban over an expired penalty", control.ErrPreconditionFailed, func() error {
		_, err := e.s.CreateOverride(e.ctx, by(control.ActionBurstBlocked, "*"), penalty(control.OverrideBan))
		return err
	})
	// The escalation actions are audit actions for AppendAudit too.
	if _, err := e.s.AppendAudit(e.ctx, control.AuditEvent{Actor: control.ActorAbuseDetector, Action: control.ActionBurstWarning,
		Kind: control.KindPenalty, Target: "user/bob"}); err != nil {
		t.Errorf("AppendAudit(burst_detected_warning): %v", err)
	}
}
