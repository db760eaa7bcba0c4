package node

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
)

// storeDeadlineFlags make the shared store's deadline adaptive (store/breaker/deadline.go):
// --store-timeout is then its least value, --store-timeout-max its greatest.
type storeDeadlineFlags struct {
	max   time.Duration
	flags *pflag.FlagSet
}

// defaultStoreTimeoutMax is --store-timeout-max unless set; a longer --store-timeout raises it.
const defaultStoreTimeoutMax = 100 * time.Millisecond

func (d *storeDeadlineFlags) register(f *pflag.FlagSet) {
	d.flags = f
	f.DurationVar(&d.max, "store-timeout-max", durationEnv("SLUICE_STORE_TIMEOUT_MAX", defaultStoreTimeoutMax), "greatest deadline of a call to a shared store: the deadline follows the store's latency (3x its p99.9 over 10 s; the greatest while fewer than 20 calls were measured) between --store-timeout and this, so a loaded but healthy store does not trip the circuit breaker; 0 keeps --store-timeout fixed; unset, it is never below --store-timeout (SLUICE_STORE_TIMEOUT_MAX)")
}

// validate checks the flag against --store-timeout. Left unset, the greatest deadline is raised to
// a longer --store-timeout: an operator who only asked for a long deadline gets that deadline.
func (d *storeDeadlineFlags) validate(timeout time.Duration) error {
	if timeout < 0 {
		return fmt.Errorf("--store-timeout: %v: want a positive duration", timeout)
	}
	if d.max < 0 {
		return fmt.Errorf("--store-timeout-max: %v: want 0 (a fixed deadline) or a positive duration", d.max)
	}
	if timeout == 0 {
		timeout = 10 * time.Millisecond // the breaker's default
	}
	if d.max != 0 && d.max < timeout && !d.explicit() {
		d.max = timeout
	}
	if d.max != 0 && d.max < timeout {
		return fmt.Errorf("--store-timeout-max: %v is below --store-timeout %v: want 0 (a fixed deadline) or at least --store-timeout", d.max, timeout)
	}
	return nil
}

// explicit reports whether the operator chose --store-timeout-max, by flag or variable.
func (d *storeDeadlineFlags) explicit() bool {
	if d.flags != nil && d.flags.Changed("store-timeout-max") {
		return true
	}
	_, ok := os.LookupEnv("SLUICE_STORE_TIMEOUT_MAX")
	return ok
}
