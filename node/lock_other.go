//go:build !unix

package node

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockFileName is the lock a serve holds in its data folder for as long as it runs.
const lockFileName = "sluice.lock"

// lockDataDir opens dir/sluice.lock without locking it: flock(2) is Unix's, and Sluice is run
// on Unix. Two serves on one folder are not detected here.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", dir, err)
	}
	return os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o644)
}
