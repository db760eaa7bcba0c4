//go:build !linux

package pgtest

import "syscall"

// sysProcAttr runs a command as cred (nil: as ourselves). Without Pdeathsig, a server outlives
// a test binary that dies without running its cleanups.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
