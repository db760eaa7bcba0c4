package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
)

// A node opens the control store, watches it, and loads a new State after every change.
func Example() {
	dir, _ := os.MkdirTemp("", "sluice-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	var store control.Store
	store, err := sqlite.Open(ctx, sqlite.Path(dir), control.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	changes := store.Watch(ctx)
	_, err = store.CreateOverride(ctx, control.Change{Actor: "ops", Reason: "ticket 42"}, control.Override{
		Tenant: "acme", Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour),
		Reason: "abuse", Source: control.SourceAPI,
	})
	if err != nil {
		log.Fatal(err)
	}

	version := <-changes // compile a new snapshot from a Load
	state, err := store.Load(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(version, state.Version, len(state.Overrides), state.Overrides[0].Tenant)

	events, _ := store.Audit(ctx, control.AuditFilter{Kind: control.KindOverride})
	fmt.Println(events[0].Actor, events[0].Action, events[0].Reason)
	// Output:
	// 1 1 1 acme
	// ops create ticket 42
}
