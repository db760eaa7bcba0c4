// Command sluice is the Sluice rate-limiting service and its command-line client.
//
//	sluice serve                      # memory store, built-in policy, HTTP :8080, gRPC :8081
//	sluice serve --config policy/     # native and Envoy-format YAML files
//	sluice config validate FILE...    # file:line: field: message on errors
//	sluice check --user alice         # ask a running server
//	sluice health                     # exit 0 when /healthz answers 200 (container health checks)
//	sluice version
package main

import (
	"fmt"
	"os"
	// The zone rules calendar windows need (policy: calendar), built in so that an image
	// without /usr/share/zoneinfo (scratch) decides them as the others do.
	_ "time/tzdata"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/control/admincli"
	"github.com/sluicehq/sluice/node"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Sluice: a distributed rate-limiting service",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand(), configCommand(), checkCommand(), admincli.Command(version), healthCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "sluice", version) },
	})
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode is the exit code of a command's error: an exitError's own, else the admin
// commands' (admincli.ExitCode: by the admin API's status, else 1).
func exitCode(err error) int {
	if ce, ok := err.(exitError); ok {
		return ce.code
	}
	return admincli.ExitCode(err)
}

// exitError carries a specific exit code: sluice check exits 2 when the request is denied.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// envDefault returns the environment variable's value, or def.
var envDefault = node.EnvDefault
