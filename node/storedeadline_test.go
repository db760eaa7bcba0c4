package node

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestStoreDeadlineFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     string // SLUICE_STORE_TIMEOUT_MAX
		args    []string
		timeout time.Duration
		want    time.Duration
		err     string // what the error names
	}{
		{name: "default", timeout: 10 * time.Millisecond, want: 100 * time.Millisecond},
		{name: "flag", args: []string{"--store-timeout-max=250ms"}, timeout: 10 * time.Millisecond, want: 250 * time.Millisecond},
		{name: "variable", env: "50ms", timeout: 10 * time.Millisecond, want: 50 * time.Millisecond},
		{name: "flag wins over the variable", env: "50ms", args: []string{"--store-timeout-max=70ms"}, timeout: 10 * time.Millisecond, want: 70 * time.Millisecond},
		{name: "0 is a fixed deadline", args: []string{"--store-timeout-max=0"}, timeout: 10 * time.Millisecond, want: 0},
		{name: "equal to the least", args: []string{"--store-timeout-max=10ms"}, timeout: 10 * time.Millisecond, want: 10 * time.Millisecond},
		{name: "below the least", args: []string{"--store-timeout-max=5ms"}, timeout: 10 * time.Millisecond, err: "--store-timeout-max"},
		{name: "negative", args: []string{"--store-timeout-max=-1s"}, timeout: 10 * time.Millisecond, err: "--store-timeout-max"},
		{name: "a negative least", timeout: -time.Millisecond, err: "--store-timeout"},
		{name: "unset, raised to a longer least", timeout: 2 * time.Second, want: 2 * time.Second},
		{name: "unset, kept above a shorter least", timeout: 50 * time.Millisecond, want: 100 * time.Millisecond},
		{name: "a variable below a longer least", env: "100ms", timeout: 2 * time.Second, err: "--store-timeout-max"},
		{name: "least 0 is the default 10ms", args: []string{"--store-timeout-max=5ms"}, timeout: 0, err: "--store-timeout-max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SLUICE_STORE_TIMEOUT_MAX", tc.env)
			}
			f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			var d storeDeadlineFlags
			d.register(f)
			if err := f.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := d.validate(tc.timeout)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || d.max != tc.want {
				t.Fatalf("max %v (%v), want %v", d.max, err, tc.want)
			}
		})
	}
}
