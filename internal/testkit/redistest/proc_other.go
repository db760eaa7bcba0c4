//go:build !linux

package redistest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux; there only t.Cleanup stops servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
