package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func checkCommand() *cobra.Command {
	var (
		server, path string
		quota        bool
		useGRPC      bool
		grpcServer   string
		domain       string
		cost         int64
		descriptors  []string
		attrs        = map[string]*string{}
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Ask a running server for a decision and print it (exit 2 when denied)",
		Example: `  sluice check --user alice --endpoint /api/items --method GET
  sluice check --api-key k1 --cost 5 --descriptor plan=pro
  sluice check --quota --tenant acme --user bob
  sluice check --grpc --tenant acme --user john
  sluice check --grpc --domain edge --descriptor remote_address=192.0.2.7`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, kv := range descriptors {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					return fmt.Errorf("--descriptor %q: want key=value", kv)
				}
			}
			if domain != "" && !useGRPC {
				return fmt.Errorf("--domain %q: Envoy's rate limit service is gRPC: add --grpc", domain)
			}
			if useGRPC {
				g := &grpcCheck{addr: grpcServer, domain: domain, quota: quota, attrs: map[string]*string{}, descriptors: descriptors}
				for name, v := range attrs {
					if *v != "" {
						g.attrs[name] = v
					}
				}
				if domain != "" && len(g.attrs) > 0 {
					return fmt.Errorf("--domain: an Envoy request carries descriptors only: give the attributes as --descriptor key=value")
				}
				if cmd.Flags().Changed("cost") {
					g.cost = &cost
				}
				denied, err := g.run(cmd.Context(), cmd.OutOrStdout())
				if err != nil {
					return err
				}
				if denied {
					return exitError{code: 2, msg: "denied"}
				}
				return nil
			}
			body := map[string]any{}
			for name, v := range attrs {
				if *v != "" {
					body[name] = *v
				}
			}
			if len(descriptors) > 0 {
				ds := map[string]string{}
				for _, kv := range descriptors {
					k, v, _ := strings.Cut(kv, "=")
					ds[k] = v
				}
				body["descriptors"] = ds
			}
			if cmd.Flags().Changed("cost") {
				body["cost"] = cost
			}
			path = "/v1/check"
			if quota {
				path = "/v1/quota"
			}
			payload, _ := json.Marshal(body)
			client := &http.Client{Timeout: 5 * time.Second}
			resp, err := client.Post(strings.TrimRight(server, "/")+path, "application/json", bytes.NewReader(payload))
			if err != nil {
				return fmt.Errorf("ask %s: %w", server, err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err != nil {
				return fmt.Errorf("read answer: %w", err)
			}
			var pretty bytes.Buffer
			if json.Indent(&pretty, raw, "", "  ") != nil {
				pretty.Write(raw)
			}
			out := cmd.OutOrStdout()
			switch resp.StatusCode {
			case http.StatusOK:
				fmt.Fprintf(out, "ALLOWED (%s)\n%s\n", resp.Status, pretty.String())
				return nil
			case http.StatusTooManyRequests:
				fmt.Fprintf(out, "DENIED (%s, Retry-After: %ss)\n%s\n", resp.Status, resp.Header.Get("Retry-After"), pretty.String())
				return exitError{code: 2, msg: "denied"}
			}
			return fmt.Errorf("server answered %s: %s", resp.Status, strings.TrimSpace(string(raw)))
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", envDefault("SLUICE_SERVER", "http://127.0.0.1:8080"), "server's HTTP address (SLUICE_SERVER)")
	for _, name := range []string{"tenant", "user", "api-key", "ip", "endpoint", "method", "tier", "idempotency-key"} {
		attrs[strings.ReplaceAll(name, "-", "_")] = f.String(name, "", "request attribute "+name)
	}
	f.StringArrayVar(&descriptors, "descriptor", nil, "descriptor key=value (repeatable)")
	f.Int64Var(&cost, "cost", 1, "units to consume; 0 looks without consuming")
	f.BoolVar(&quota, "quota", false, "report without consuming (POST /v1/quota, or GetQuota with --grpc)")
	f.BoolVar(&useGRPC, "grpc", false, "ask over gRPC (plaintext): sluice.v1.RateLimiter/Check, or with --domain Envoy's ShouldRateLimit")
	f.StringVar(&grpcServer, "grpc-server", envDefault("SLUICE_GRPC", "127.0.0.1:8081"), "server's gRPC address, for --grpc (SLUICE_GRPC)")
	f.StringVar(&domain, "domain", "", "with --grpc: ask Envoy's rate limit service for this domain, one descriptor of the --descriptor entries in order")
	return cmd
}
