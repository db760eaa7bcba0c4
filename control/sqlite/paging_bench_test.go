package sqlite_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
)

// BenchmarkIdentitiesPage compares a page of 1,000 identity assignments read after a cursor
// in the middle of 20,000 (one PageIdentities query) with the whole list (ListIdentities),
// which GET /admin/v1/identities read on every call before it paged.
func BenchmarkIdentitiesPage(b *testing.B) {
	const n = 20_000
	s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "control.db"), control.Options{Now: time.Now})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	bundle := &control.Bundle{}
	for i := range n {
		bundle.Identities = append(bundle.Identities, control.Identity{Kind: control.IdentityUser, Value: fmt.Sprintf("u%06d", i), Tier: "gold"})
	}
	if _, err := s.Import(b.Context(), control.Change{Actor: "bench"}, bundle, true); err != nil {
		b.Fatal(err)
	}
	b.Run("page of 1000 after 10000", func(b *testing.B) {
		for b.Loop() {
			ids, err := s.PageIdentities(b.Context(), "", control.Page{AfterKind: control.IdentityUser, AfterName: "u010000", Limit: 1000})
			if err != nil || len(ids) != 1000 {
				b.Fatal(len(ids), err)
			}
		}
	})
	b.Run("whole list of 20000", func(b *testing.B) {
		for b.Loop() {
			ids, err := s.ListIdentities(b.Context(), "")
			if err != nil || len(ids) != n {
				b.Fatal(len(ids), err)
			}
		}
	})
}
