package controltest

import (
	"errors"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// testLastAdmin: the last admin token cannot be deleted, and two admins deleting each other's
// tokens at once through two Stores leave one: the guard holds inside the transaction.
func testLastAdmin(t *testing.T, e *env) {
	for _, tok := range []control.Token{
		{Name: "ann", Role: control.RoleAdmin, Hash: control.HashToken("ann-secret")},
		{Name: "bob", Role: control.RoleAdmin, Hash: control.HashToken("bob-secret")},
		{Name: "ci", Role: control.RoleWrite, Hash: control.HashToken("ci-secret")},
	} {
		if _, err := e.s.CreateToken(e.ctx, ch(""), tok); err != nil {
			t.Fatal(err)
		}
	}
	other := e.open()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, st := range []control.Store{e.s, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = st.DeleteToken(e.ctx, ch(""), []string{"ann", "bob"}[i])
		}()
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, control.ErrLastAdmin) && errors.Is(err, control.ErrConflict):
			failed++
		default:
			t.Fatalf("delete: %v", err)
		}
	}
	if failed != 1 {
		t.Fatalf("two concurrent deletions of the two admin tokens: %v, want exactly one ErrLastAdmin", errs)
	}
	admins := 0
	toks, err := e.s.ListTokens(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if tk.Role == control.RoleAdmin {
			admins++
			e.unchanged("the last admin token", control.ErrLastAdmin, func() error {
				_, err := e.s.DeleteToken(e.ctx, ch(""), tk.Name)
				return err
			})
		}
	}
	if admins != 1 {
		t.Errorf("%d admin tokens left, want 1", admins)
	}
	// The last admin token's secret rotates in one transaction, audited as an update.
	for _, tk := range toks {
		if tk.Role != control.RoleAdmin {
			continue
		}
		got, err := e.s.ReplaceToken(e.ctx, ch(""), control.Token{Name: tk.Name, Role: control.RoleAdmin, Hash: control.HashToken("rotated")})
		if err != nil {
			t.Fatalf("ReplaceToken of the last admin token: %v", err)
		}
		e.lastEvent(control.ActionUpdate, control.KindToken, tk.Name, got.Version)
		if _, err := e.s.TokenByHash(e.ctx, tk.Hash); !errors.Is(err, control.ErrNotFound) {
			t.Errorf("the old secret still authenticates: %v", err)
		}
		if _, err := e.s.TokenByHash(e.ctx, control.HashToken("rotated")); err != nil {
			t.Errorf("the new secret does not authenticate: %v", err)
		}
		e.unchanged("a secret another token has", control.ErrConflict, func() error {
			_, err := e.s.ReplaceToken(e.ctx, ch(""), control.Token{Name: tk.Name, Role: control.RoleAdmin, Hash: control.HashToken("ci-secret")})
			return err
		})
	}
	if _, err := e.s.DeleteToken(e.ctx, ch(""), "ci"); err != nil {
		t.Errorf("deleting a write token beside the last admin: %v", err)
	}
}
