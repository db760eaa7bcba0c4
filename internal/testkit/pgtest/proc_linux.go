package pgtest

import "syscall"

// sysProcAttr runs a command as cred (nil: as ourselves) and makes the kernel SIGKILL it when
// the test binary dies without its cleanups (a -timeout panic, kill -9). Pdeathsig fires when
// the forking OS thread exits; the Go runtime keeps threads alive unless a goroutine locked to
// one ends, which this package never does. The server's backends notice its death themselves.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}
