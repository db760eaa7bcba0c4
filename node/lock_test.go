//go:build unix

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLockDataDir: a folder locked by one holder refuses a second, naming the folder and the
// holder's pid, until the first lets go. flock belongs to the open file, so two opens in one
// process conflict as two processes do (the e2e test runs two processes).
func TestLockDataDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	first, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, lockFileName)); strings.TrimSpace(string(b)) != fmt.Sprint(os.Getpid()) {
		t.Errorf("lock file holds %q, want this pid", b)
	}
	_, err = lockDataDir(dir)
	if err == nil {
		t.Fatal("second lock of the same folder succeeded")
	}
	for _, want := range []string{dir, fmt.Sprintf("pid %d", os.Getpid()), "in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	// Another spelling of the same folder is the same folder.
	if _, err := lockDataDir(dir + "/."); err == nil {
		t.Fatal("second lock through another path succeeded")
	}
	first.Close()
	again, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
}
