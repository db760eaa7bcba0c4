package redistest

import "syscall"

// sysProcAttr makes the kernel SIGKILL the server when the test binary dies (a panic, a
// timeout, kill -9), when no t.Cleanup runs. Pdeathsig fires when the forking OS thread exits;
// the Go runtime keeps threads alive unless a goroutine locked to one ends, which this package
// never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
