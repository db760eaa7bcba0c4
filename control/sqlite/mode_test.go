//go:build unix

package sqlite_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
)

// TestFilesArePrivate: the database and its -wal and -shm files are 0600 under a permissive
// umask, and a file an older version left 0644 is made 0600 at open.
func TestFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "control.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(t.Context(), path, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Version(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v (WAL mode keeps -wal and -shm while open)", p, err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s is %o, want 600", filepath.Base(p), m)
		}
	}
}
