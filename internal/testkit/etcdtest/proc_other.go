//go:build !linux

package etcdtest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux; there only t.Cleanup stops servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
