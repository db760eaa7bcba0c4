package controltest

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// testIdentityOverrides: overrides naming an API key by its hash and an IP (address or CIDR)
// are stored, read back, loaded, imported and keyed by target like the others: one live
// override per target, an api_key_hash target apart from an api_key one, and an old-style
// target's key unchanged.
func testIdentityOverrides(t *testing.T, e *env) {
	hash := "#" + strings.Repeat("ab", 16)
	byHash := e.override("", "", time.Hour)
	byHash.APIKeyHash = hash
	byIP := e.override("", "", time.Hour)
	byIP.IP, byIP.Type, byIP.Value = "10.0.0.0/8", control.OverrideBan, 0
	var made []control.Override
	for _, in := range []control.Override{byHash, byIP} {
		o, err := e.s.CreateOverride(e.ctx, ch(""), in)
		if err != nil {
			t.Fatalf("CreateOverride(%+v): %v", in, err)
		}
		if got, err := e.s.GetOverride(e.ctx, o.ID); err != nil || !reflect.DeepEqual(got, o) || got.IP != in.IP || got.APIKeyHash != in.APIKeyHash {
			t.Errorf("GetOverride = %+v, %v; want %+v", got, err, o)
		}
		made = append(made, o)
	}
	list, err := e.s.ListOverrides(e.ctx, control.OverrideFilter{})
	if err != nil || !reflect.DeepEqual(list, made) {
		t.Errorf("ListOverrides = %+v, %v; want %+v", list, err, made)
	}
	st, err := e.s.Load(e.ctx)
	if err != nil || !reflect.DeepEqual(st.Overrides, made) {
		t.Errorf("Load overrides = %+v, %v; want %+v", st.Overrides, err, made)
	}
	for _, in := range []control.Override{byHash, byIP} {
		e.unchanged("same target "+in.IP+in.APIKeyHash, control.ErrConflict, func() error {
			_, err := e.s.CreateOverride(e.ctx, ch(""), in)
			return err
		})
	}
	// Other targets are free: the key itself (api_key), a narrower network, the hash with a tenant.
	key := e.override("", "", time.Hour)
	key.APIKey = hash
	narrow := byIP
	narrow.IP = "10.1.0.0/16"
	withTenant := byHash
	withTenant.Tenant = "acme"
	for _, o := range []control.Override{key, narrow, withTenant} {
		if _, err := e.s.CreateOverride(e.ctx, ch(""), o); err != nil {
			t.Errorf("CreateOverride(%+v): %v", o, err)
		}
	}

	ok := e.override("", "", time.Hour)
	cases := []struct {
		name  string
		edit  func(*control.Override)
		field string
	}{
		{"hash without #", func(o *control.Override) { o.APIKeyHash = hash[1:] }, "api_key_hash"},
		{"hash in upper case", func(o *control.Override) { o.APIKeyHash = strings.ToUpper(hash) }, "api_key_hash"},
		{"hash too long", func(o *control.Override) { o.APIKeyHash = hash + "0" }, "api_key_hash"},
		{"hash and key", func(o *control.Override) { o.APIKeyHash, o.APIKey = hash, "k" }, "api_key_hash"},
		{"not an address", func(o *control.Override) { o.IP = "10.0.0.300" }, "ip"},
		{"bad CIDR", func(o *control.Override) { o.IP = "10.0.0.0/40" }, "ip"},
		{"host bits set", func(o *control.Override) { o.IP = "10.0.0.1/8" }, "ip"},
		{"v4-mapped", func(o *control.Override) { o.IP = "::ffff:10.0.0.1" }, "ip"},
		{"ip with tenant", func(o *control.Override) { o.IP, o.Tenant = "10.0.0.1", "acme" }, "ip"},
		{"ip with hash", func(o *control.Override) { o.IP, o.APIKeyHash = "10.0.0.1", hash }, "ip"},
	}
	for _, tc := range cases {
		o := ok
		tc.edit(&o)
		e.unchanged(tc.name, control.ErrInvalid, func() error {
			_, err := e.s.CreateOverride(e.ctx, ch(""), o)
			invalid(t, tc.name, err, tc.field)
			return err
		})
	}

	// Import: the new targets round-trip, and two entries of one of them are a duplicate.
	im, ok2 := e.s.(control.Importer)
	if !ok2 {
		t.Fatal("the store does not implement control.Importer")
	}
	v6 := e.override("", "", 2*time.Hour)
	v6.IP = "2001:db8::/32"
	res, err := im.Import(e.ctx, ch(""), &control.Bundle{Overrides: []control.Override{v6, byHash}}, true)
	if err != nil || res.Created != 1 || res.Unchanged != 1 {
		t.Errorf("Import = %+v, %v; want 1 created (the ip), 1 unchanged (the hash)", res, err)
	}
	list, err = e.s.ListOverrides(e.ctx, control.OverrideFilter{})
	found := false
	for _, o := range list {
		found = found || o.IP == v6.IP
	}
	if err != nil || !found {
		t.Errorf("after Import, ListOverrides = %+v, %v; want the ip override %s", list, err, v6.IP)
	}
	_, err = im.Import(e.ctx, ch(""), &control.Bundle{Overrides: []control.Override{byIP, byIP}}, false)
	if !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "overrides") {
		t.Errorf("Import of one ip target twice: %v, want an invalid error naming overrides", err)
	}
}
