package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/policy"
)

func configCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Work with policy files"}
	cmd.AddCommand(&cobra.Command{
		Use:   "validate PATH...",
		Short: "Check policy files or folders; print file:line: field: message for each error",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			failed := 0
			for _, path := range args {
				snap, err := policy.Load(path)
				if err != nil {
					failed++
					// Load reports every mistake of the files, joined: one line each.
					for _, e := range unjoin(err) {
						fmt.Fprintln(cmd.ErrOrStderr(), strings.ReplaceAll(e.Error(), "\n", " "))
					}
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%s)\n", path, node.Describe(snap))
			}
			if failed > 0 {
				return exitError{code: 1, msg: fmt.Sprintf("%d of %d invalid", failed, len(args))}
			}
			return nil
		},
	}, &cobra.Command{
		Use:   "show",
		Short: "Print the built-in policy that serve uses without --config",
		Run:   func(cmd *cobra.Command, _ []string) { cmd.OutOrStdout().Write(node.DefaultPolicy) },
	})
	return cmd
}

// unjoin returns the errors that errors.Join joined into err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
