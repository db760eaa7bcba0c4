package controltest

import (
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testOverridePatch: UpdateOverride changes the changeable fields in place, in one change
// audited as an update; the id, target, type and creation stay; a refused update writes nothing.
func testOverridePatch(t *testing.T, e *env) {
	o, err := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	in := o
	in.ExpiresAt, in.Value, in.Reason = e.clock.Now().Add(time.Hour), 0.25, "still noisy"
	in.Tenant, in.Type, in.CreatedBy = "other", control.OverrideBan, "mallory" // not changeable: ignored
	got, err := e.s.UpdateOverride(e.ctx, ch(o.ETag()), in)
	if err != nil {
		t.Fatalf("UpdateOverride: %v", err)
	}
	want := o
	want.ExpiresAt, want.Value, want.Reason, want.Version = in.ExpiresAt.UTC().Truncate(time.Microsecond), 0.25, "still noisy", o.Version+1
	if !reflect.DeepEqual(got, want) {
		t.Errorf("updated override = %+v\nwant %+v", got, want)
	}
	if read, err := e.s.GetOverride(e.ctx, o.ID); err != nil || !reflect.DeepEqual(read, want) {
		t.Errorf("GetOverride after the update = %+v, %v; want %+v", read, err, want)
	}
	ev := e.lastEvent(control.ActionUpdate, control.KindOverride, strconv.FormatInt(o.ID, 10), want.Version)
	if ev.Before == nil || ev.After == nil {
		t.Errorf("update event = %+v, want before and after", ev)
	}
	st, err := e.s.Load(e.ctx)
	if err != nil || len(st.Overrides) != 1 || !reflect.DeepEqual(st.Overrides[0], want) {
		t.Errorf("Load after the update: %+v, %v", st, err)
	}

	e.unchanged("stale If-Match", control.ErrPreconditionFailed, func() error {
		_, err := e.s.UpdateOverride(e.ctx, ch(o.ETag()), in)
		return err
	})
	e.unchanged("missing override", control.ErrNotFound, func() error {
		m := in
		m.ID = o.ID + 100
		_, err := e.s.UpdateOverride(e.ctx, ch(""), m)
		return err
	})
	e.unchanged("If-Match on a missing override", control.ErrPreconditionFailed, func() error {
		m := in
		m.ID = o.ID + 100
		_, err := e.s.UpdateOverride(e.ctx, ch("*"), m)
		return err
	})
	for _, tc := range []struct {
		name, field string
		edit        func(*control.Override)
	}{
		{"past expiry", "expires_at", func(o *control.Override) { o.ExpiresAt = e.clock.Now().Add(-time.Second) }},
		{"zero multiplier", "value", func(o *control.Override) { o.Value = 0 }},
		{"negative burst", "burst", func(o *control.Override) { o.Burst = -1 }},
	} {
		bad := in
		tc.edit(&bad)
		v, n := e.version(), len(e.audit())
		_, err := e.s.UpdateOverride(e.ctx, ch(""), bad)
		invalid(t, tc.name, err, tc.field)
		if e.version() != v || len(e.audit()) != n {
			t.Errorf("%s: a refused update changed the store", tc.name)
		}
	}
}

// testExemptionPatch: UpdateExemption sets or clears the expiry and the reason in place.
func testExemptionPatch(t *testing.T, e *env) {
	exp := e.clock.Now().Add(time.Minute)
	x, err := e.s.CreateExemption(e.ctx, ch(""), control.Exemption{User: "probe", Reason: "health", ExpiresAt: &exp})
	if err != nil {
		t.Fatal(err)
	}
	later := e.clock.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	got, err := e.s.UpdateExemption(e.ctx, ch(""), control.Exemption{ID: x.ID, Reason: "longer", ExpiresAt: &later})
	if err != nil {
		t.Fatalf("UpdateExemption: %v", err)
	}
	if got.ExpiresAt == nil || !got.ExpiresAt.Equal(later) || got.Reason != "longer" || got.User != "probe" || got.Version != x.Version+1 {
		t.Errorf("updated exemption = %+v", got)
	}
	e.lastEvent(control.ActionUpdate, control.KindExemption, strconv.FormatInt(x.ID, 10), got.Version)
	// nil: it never expires.
	got, err = e.s.UpdateExemption(e.ctx, ch(got.ETag()), control.Exemption{ID: x.ID, Reason: "forever"})
	if err != nil || got.ExpiresAt != nil {
		t.Fatalf("UpdateExemption to no expiry = %+v, %v", got, err)
	}
	e.clock.Advance(2 * time.Hour)
	if list, err := e.s.ListExemptions(e.ctx); err != nil || len(list) != 1 || list[0].ID != x.ID {
		t.Errorf("ListExemptions after the first expiry passed = %+v, %v", list, err)
	}
	past := e.clock.Now().Add(-time.Minute)
	e.unchanged("past expiry", control.ErrInvalid, func() error {
		_, err := e.s.UpdateExemption(e.ctx, ch(""), control.Exemption{ID: x.ID, Reason: "r", ExpiresAt: &past})
		return err
	})
	e.unchanged("stale If-Match", control.ErrPreconditionFailed, func() error {
		_, err := e.s.UpdateExemption(e.ctx, ch(x.ETag()), control.Exemption{ID: x.ID, Reason: "r"})
		return err
	})
	if _, err := e.s.UpdateExemption(e.ctx, ch(""), control.Exemption{ID: x.ID + 50, Reason: "r"}); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("UpdateExemption of a missing id: %v, want ErrNotFound", err)
	}
}
