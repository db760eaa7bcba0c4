package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exec connects to url and runs one statement.
func exec(t *testing.T, url, sql string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// query connects to url and returns the result of a one-value query.
func query(t *testing.T, url, sql string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, sql).Scan(&s)
	return s, err
}

func TestDBIsFreshAndSeparate(t *testing.T) {
	a, b := pgtest.DB(t), pgtest.DB(t)
	if a == b {
		t.Fatalf("two DB calls returned the same database %s", a)
	}
	// Each database starts empty: the same table is created in both.
	for _, url := range []string{a, b} {
		if err := exec(t, url, "CREATE TABLE only_here (x int)"); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	// The server listens on loopback only.
	if got, err := query(t, a, "SELECT current_setting('listen_addresses')"); err != nil || got != "127.0.0.1" {
		t.Errorf("listen_addresses = %q, %v; want 127.0.0.1", got, err)
	}
}

func TestStopKillRestartKeepData(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	if err := exec(t, url, "CREATE TABLE kept (x int)"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		stop func()
	}{
		{"stop", c.Stop},
		{"kill", c.Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.stop()
			if c.Running() {
				t.Fatal("still running after stop")
			}
			if _, err := query(t, url, "SELECT 'x'"); err == nil {
				t.Fatal("query succeeded against a stopped server")
			}
			c.Restart(t)
			if got, err := query(t, url, "SELECT count(*)::text FROM kept"); err != nil || got != "0" {
				t.Fatalf("after restart: %q, %v; want the table back", got, err)
			}
		})
	}
}
