//go:build unix

package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockFileName is the lock a serve holds in its data folder for as long as it runs.
const lockFileName = "sluice.lock"

// lockDataDir takes the lock of dir for this process, so that a second serve on the same
// folder fails at once rather than both overwriting each other's snapshot. The lock is
// flock(2) on dir/sluice.lock: the kernel drops it when the process ends however it ends (a
// crash or SIGKILL leaves no stale lock to clean up by hand, unlike a pid file), and, unlike
// fcntl locks, it belongs to the open file rather than to the process, so no other open and
// close of the file in this process can drop it. The file then holds the holder's pid, for the
// message of the next one. Release it with Close; it must stay referenced until then (an
// unreferenced *os.File is closed by its finalizer).
func lockDataDir(dir string) (*os.File, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", abs, err)
	}
	path := filepath.Join(abs, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: open lock: %w", abs, err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("--data-dir %s is in use by another sluice%s (lock %s): give each process its own folder", abs, holder(path), path)
		}
		return nil, fmt.Errorf("--data-dir %s: lock %s: %w", abs, path, err)
	}
	// The pid is a courtesy for the message above; the lock itself is what counts.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// flock takes an exclusive lock on f without waiting, retrying when a signal interrupts it.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// holder names the pid written in the lock file, if it reads as one.
func holder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return ""
}
