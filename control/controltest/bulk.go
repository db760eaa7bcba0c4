package controltest

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testImport: a bundle of every kind loads in one change (one version, one audit event per
// resource), is then what Load reads, and loads again as no change at all; a changed entry is
// an update; a bad entry anywhere, an expiry in the past or two entries of one key fail the
// whole import, named by list and index, and write nothing.
func testImport(t *testing.T, e *env) {
	im, ok := e.s.(control.Importer)
	if !ok {
		t.Fatal("the store does not implement control.Importer")
	}
	// An override of a target stored already is replaced; one stored and not in the bundle stays.
	kept, err := e.s.CreateOverride(e.ctx, ch(""), e.override("kept", "", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Hour)); err != nil {
		t.Fatal(err)
	}
	bundle := func() *control.Bundle {
		return &control.Bundle{
			Rules: []control.Rule{{Name: "r1", Body: []byte(`{"limit": 1}`)}},
			Overrides: []control.Override{
				e.override("acme", "", 2*time.Hour),
				e.override("beta", "u", time.Hour),
			},
			Exemptions: []control.Exemption{{User: "health", Reason: "probes"}},
			Identities: []control.Identity{
				{Kind: control.IdentityAPIKey, Value: "k1", Tier: "gold", Tenant: "acme"},
				{Kind: control.IdentityUser, Value: "u", Tier: "free"},
			},
			Domains: []control.Domain{{Name: "edge", Body: []byte(`{"domain": "edge", "descriptors": []}`)}},
		}
	}
	events, v := len(e.audit()), e.version()
	dry, err := im.Import(e.ctx, ch(""), bundle(), false)
	if err != nil || dry.Created != 6 || dry.Updated != 1 || dry.Version != 0 || len(dry.Changes) != 7 {
		t.Errorf("dry run = %+v, %v; want 6 to create, 1 to update, listed", dry, err)
	}
	if len(e.audit()) != events || e.version() != v {
		t.Error("a dry run wrote")
	}
	res, err := im.Import(e.ctx, ch(""), bundle(), true)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if res.Created != 6 || res.Updated != 1 || res.Unchanged != 0 || res.Version != v+1 {
		t.Errorf("Import = %+v, want 6 created, 1 updated, version %d", res, v+1)
	}
	if n := len(e.audit()) - events; n != 7 {
		t.Errorf("Import wrote %d audit events, want 7 (one per resource)", n)
	}
	st, err := e.s.Load(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Rules) != 1 || len(st.Overrides) != 3 || len(st.Exemptions) != 1 || len(st.Identities) != 2 || len(st.Domains) != 1 {
		t.Errorf("Load after Import: %d rules, %d overrides, %d exemptions, %d identities, %d domains; want 1, 3, 1, 2, 1",
			len(st.Rules), len(st.Overrides), len(st.Exemptions), len(st.Identities), len(st.Domains))
	}
	if _, err := e.s.GetOverride(e.ctx, kept.ID); err != nil {
		t.Errorf("an override not in the bundle: %v", err)
	}
	// Again: nothing changes, not even the version.
	v = e.version()
	if res, err := im.Import(e.ctx, ch(""), bundle(), true); err != nil || res.Unchanged != 7 || res.Version != 0 || e.version() != v {
		t.Errorf("the same Import again = %+v, %v (version %d, was %d); want 7 unchanged, no version", res, err, e.version(), v)
	}
	b := bundle()
	b.Identities[1].Tier = "gold"
	if res, err := im.Import(e.ctx, ch(""), b, true); err != nil || res.Updated != 1 || res.Unchanged != 6 {
		t.Errorf("Import of one changed assignment = %+v, %v; want 1 updated", res, err)
	}
	for _, c := range []struct {
		name  string
		edit  func(*control.Bundle)
		field string
	}{
		{"bad type", func(b *control.Bundle) { b.Overrides[1].Type = "nope" }, "overrides[1].type"},
		{"expired", func(b *control.Bundle) { b.Overrides[0].ExpiresAt = e.clock.Now().Add(-time.Minute) }, "overrides[0].expires_at"},
		{"duplicate target", func(b *control.Bundle) { b.Overrides[1] = b.Overrides[0] }, "overrides[1]"},
		{"bad identity", func(b *control.Bundle) { b.Identities[1].Tenant = "x" }, "identities[1].tenant"},
		{"bad rule", func(b *control.Bundle) { b.Rules[0].Body = []byte(`[]`) }, "rules[0].rule"},
	} {
		b := bundle()
		b.Overrides[0].Tenant = "fresh" // would be created, were the import accepted
		c.edit(b)
		e.unchanged(c.name, control.ErrInvalid, func() error {
			_, err := im.Import(e.ctx, ch(""), b, true)
			var ie *control.InvalidError
			if errors.As(err, &ie) && ie.Field != c.field {
				t.Errorf("%s: field %q, want %q", c.name, ie.Field, c.field)
			}
			return err
		})
	}
}
