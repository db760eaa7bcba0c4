package sqlstore

import (
	"context"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// TestDriversDefineTheSameQueries: the core issues queries by name with one parameter order,
// so both drivers must define every one, and the same migrations.
func TestDriversDefineTheSameQueries(t *testing.T) {
	var names [][]string
	for _, dir := range []string{"../../sqlite/sql", "../../postgres/sql"} {
		q, err := ParseQueries(os.DirFS(dir), "queries")
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckQueries(q); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		delete(q, "VersionNotify") // PostgreSQL's alone: SQLite notifies in process
		names = append(names, Names(q))
		migrations, err := fs.Glob(os.DirFS(dir), "migrations/*.sql")
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, migrations)
	}
	if !slices.Equal(names[0], names[2]) {
		t.Errorf("queries differ:\nsqlite   %v\npostgres %v", names[0], names[2])
	}
	if !slices.Equal(names[1], names[3]) || len(names[1]) == 0 {
		t.Errorf("migrations differ:\nsqlite   %v\npostgres %v", names[1], names[3])
	}
}

func TestParseQueries(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       map[string]string
		err        string
	}{
		{"two", "-- name: A\nSELECT 1;\n\n-- name: B\n-- a comment\nSELECT 2\n", map[string]string{"A": "SELECT 1", "B": "-- a comment\nSELECT 2"}, ""},
		{"text before the first name is ignored", "-- header\n-- name: A\nSELECT 1;", map[string]string{"A": "SELECT 1"}, ""},
		{"duplicate", "-- name: A\nSELECT 1;\n-- name: A\nSELECT 2;", nil, "defined twice"},
		{"empty", "-- name: A\n\n-- name: B\nSELECT 1", nil, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseQueries(fstest.MapFS{"q/x.sql": {Data: []byte(tc.file)}}, "q")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// recv returns what w holds now, or false.
func recv(w <-chan int64) (int64, bool) {
	select {
	case v := <-w:
		return v, true
	default:
		return 0, false
	}
}

func TestHubCoalescesAndNeverBlocks(t *testing.T) {
	h := NewHub()
	w := h.Subscribe(t.Context())
	// Nobody reads: publishing must not block, and the reader then gets only the latest.
	for v := int64(1); v <= 100; v++ {
		h.Publish(v)
	}
	if v, ok := recv(w); !ok || v != 100 {
		t.Errorf("after 100 publishes the reader got %d, %v; want 100", v, ok)
	}
	if v, ok := recv(w); ok {
		t.Errorf("a backlog: got %d again", v)
	}
	// Older or repeated versions are not news.
	h.Publish(100)
	h.Publish(50)
	if v, ok := recv(w); ok {
		t.Errorf("an old version was announced: %d", v)
	}
	h.Publish(101)
	if v, _ := recv(w); v != 101 {
		t.Errorf("got %d, want 101", v)
	}
}

func TestHubClosesChannels(t *testing.T) {
	h := NewHub()
	ctx, cancel := context.WithCancel(t.Context())
	a := h.Subscribe(ctx)
	b := h.Subscribe(t.Context())
	cancel()
	waitClosed(t, a)
	h.Publish(1) // to b only
	h.Close()
	h.Close() // twice is fine
	waitClosed(t, b)
	waitClosed(t, h.Subscribe(t.Context()))
	h.Publish(2) // after Close: nothing, no panic
}

func waitClosed(t *testing.T, w <-chan int64) {
	t.Helper()
	deadline := time.After(time.Second)
	for {
		select {
		case _, ok := <-w:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("channel not closed")
		}
	}
}
