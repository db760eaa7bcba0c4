package postgres_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/controltest"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string, opts control.Options) control.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// query runs one query on url and returns its first column of every row.
func query(t *testing.T, url, sql string, args ...any) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestConformance(t *testing.T) {
	controltest.Run(t, controltest.Harness{
		NewDB: func(t *testing.T) string { return pgtest.DB(t) },
		Open:  open,
		Columns: func(t *testing.T, url, table string) []string {
			return query(t, url, "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1", table)
		},
	})
}

// TestMigrationsRaceAndRecord: nodes starting together on an empty database migrate one after
// the other, and the migrations are recorded once.
func TestMigrationsRaceAndRecord(t *testing.T) {
	url := pgtest.DB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := postgres.Open(t.Context(), url, control.Options{})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
		}
	}
	if got := query(t, url, "SELECT version::text || ' ' || name FROM schema_migrations ORDER BY version"); strings.Join(got, ",") != "1 control,2 events,3 escalation,4 node_stats,5 domains,6 change_index,7 token_expiry,8 revoked_tokens,9 decision_minutes,10 identity_overrides" {
		t.Errorf("schema_migrations = %v", got)
	}
}

// TestWatchSurvivesRestart restarts PostgreSQL under a watching Store: its listener
// reconnects, announces the version it finds, and hears later changes again.
func TestWatchSurvivesRestart(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	watcher := open(t, url, control.Options{})
	writer := open(t, url, control.Options{})
	create := func(name string) {
		t.Helper()
		if _, err := writer.CreateRule(t.Context(), control.Change{Actor: "a"}, name, json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	w := watcher.Watch(t.Context())
	create("before")
	expect(t, w, 1) // the listener is up

	c.Stop()
	c.Restart(t)
	// Made before the listener is back, most likely: announced by the reconnection.
	create("during")
	expect(t, w, 2)
	create("after")
	expect(t, w, 3)
}

// expect waits for w to announce want; the listener's backoff is 2 s at most, so 5 s is ample.
func expect(t *testing.T, w <-chan int64, want int64) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case v := <-w:
			if v >= want {
				return
			}
		case <-deadline:
			t.Fatalf("version %d not announced", want)
		}
	}
}

// TestStoreDownAndBack: while the database is down calls fail fast with an error (nothing
// hangs), and the same Store works again once it is back.
func TestStoreDownAndBack(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	s := open(t, url, control.Options{})
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err == nil {
		t.Error("Ping succeeded with the database down")
	}
	if _, err := s.Load(ctx); err == nil {
		t.Error("Load succeeded with the database down")
	}
	c.Restart(t)
	if _, err := s.CreateRule(t.Context(), control.Change{Actor: "a"}, "r", json.RawMessage(`{}`)); err != nil {
		t.Errorf("CreateRule after the restart: %v", err)
	}
}

// TestOpenLazyWhileDown: OpenLazy succeeds with the database down, where Open fails; calls
// fail until it is back, and then the first one migrates the schema and works, and Watch
// hears changes.
func TestOpenLazyWhileDown(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	c.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if s, err := postgres.Open(ctx, url, control.Options{}); err == nil {
		s.Close()
		t.Fatal("Open succeeded with the database down")
	}
	s, err := postgres.OpenLazy(url, control.Options{})
	if err != nil {
		t.Fatalf("OpenLazy with the database down: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Version(ctx); err == nil {
		t.Error("Version succeeded with the database down")
	}
	w := s.Watch(t.Context())

	c.Restart(t)
	r, err := s.CreateRule(t.Context(), control.Change{Actor: "a"}, "r", json.RawMessage(`{}`))
	if err != nil {
		t.Fatalf("CreateRule once the database is up: %v", err)
	}
	expect(t, w, r.Version)
	if got := query(t, url, "SELECT version::text || ' ' || name FROM schema_migrations ORDER BY version"); strings.Join(got, ",") != "1 control,2 events,3 escalation,4 node_stats,5 domains,6 change_index,7 token_expiry,8 revoked_tokens,9 decision_minutes,10 identity_overrides" {
		t.Errorf("schema_migrations = %v", got)
	}
}

// TestOpenLazyBadURL: a URL that cannot be parsed is an error at once.
func TestOpenLazyBadURL(t *testing.T) {
	if _, err := postgres.OpenLazy("postgres://host:notaport/db", control.Options{}); err == nil {
		t.Fatal("OpenLazy accepted a bad URL")
	}
}
