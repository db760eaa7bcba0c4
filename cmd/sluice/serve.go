package main

import (
	"context"
	"errors"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/node"
)

// serveCommand is `sluice serve`: the flags into a node.Config, then the node's New, Run
// and Close. SIGINT and SIGTERM drain it.
func serveCommand() *cobra.Command {
	c := node.Config{Version: version}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the rate-limit service (HTTP JSON, gRPC sluice.v1 and Envoy RLS v3)",
		Long:  node.Help,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.ReadEnv(cmd.Flags()); err != nil {
				return err
			}
			return serve(cmd.Context(), c)
		},
	}
	c.RegisterFlags(cmd)
	return cmd
}

// serve runs a node until SIGINT or SIGTERM, then drains and closes it.
func serve(ctx context.Context, c node.Config) error {
	n, err := node.New(ctx, c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return errors.Join(n.Run(ctx), n.Close())
}
