package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// healthCommand is `sluice health`: one GET of a health endpoint, exit 0 on 200 and 1 on
// anything else. It is the image's HEALTHCHECK and the chart's exec probe under mTLS:
// distroless and scratch images have no shell, curl or wget, and this binary is already there.
func healthCommand() *cobra.Command {
	var (
		url                       string
		timeout                   time.Duration
		caFile, certFile, keyFile string
		insecure                  bool
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Probe a running server's health endpoint: exit 0 on 200, 1 otherwise (for container health checks)",
		Long: `Probe a running server's health endpoint once: exit 0 when it answers 200, 1 otherwise.

Without --url it asks /healthz on the loopback port of SLUICE_HTTP (127.0.0.1:8080 by default),
over https when SLUICE_TLS_CERT is set, so the same command fits the container whatever
address it serves on.`,
		Example: `  sluice health
  sluice health --url http://127.0.0.1:8080/readyz
  sluice health --url https://127.0.0.1:8080/healthz --ca-file ca.crt --cert-file tls.crt --key-file tls.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				u, err := defaultHealthURL(envDefault("SLUICE_HTTP", "127.0.0.1:8080"), os.Getenv("SLUICE_TLS_CERT") != "")
				if err != nil {
					return exitError{code: 1, msg: err.Error()}
				}
				url = u
			}
			client, err := healthClient(timeout, caFile, certFile, keyFile, insecure)
			if err != nil {
				return exitError{code: 1, msg: err.Error()}
			}
			status, err := probe(client, url)
			if err != nil {
				return exitError{code: 1, msg: err.Error()}
			}
			// Docker keeps a health check's output in `docker inspect`: say what was seen.
			fmt.Fprintln(cmd.OutOrStdout(), url+":", status)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "", "URL to GET (default: /healthz on the loopback port of SLUICE_HTTP)")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long; counts as unhealthy")
	f.StringVar(&caFile, "ca-file", "", "PEM CA bundle that signs the server's certificate (https; default: the system's roots)")
	f.StringVar(&certFile, "cert-file", "", "PEM client certificate, for a server that asks for one (mTLS)")
	f.StringVar(&keyFile, "key-file", "", "PEM key of --cert-file")
	f.BoolVar(&insecure, "insecure", false, "accept any server certificate (a loopback probe of a certificate issued for the service name)")
	return cmd
}

// defaultHealthURL is /healthz on the loopback address of the HTTP listener addr: a wildcard
// host (":8080", "0.0.0.0:8080", "[::]:8080") is asked on loopback, as a probe runs beside the
// server; a specific host is asked as it is.
func defaultHealthURL(addr string, useTLS bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("SLUICE_HTTP %q: %w", addr, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/healthz", nil
}

// healthClient is an HTTP client for one probe: no keep-alive (the process exits), a bound on
// the whole exchange, and the TLS material the flags name.
func healthClient(timeout time.Duration, caFile, certFile, keyFile string, insecure bool) (*http.Client, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("--timeout: %v: must be positive", timeout)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure}
	if caFile != "" {
		pool, err := tlsreload.CertPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		tc.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--cert-file and --key-file go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert-file, --key-file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{
		Timeout: timeout,
		// The zero Proxy ignores HTTP_PROXY and HTTPS_PROXY: a probe of this pod's own port must
		// not go through a proxy the container's environment sets for outbound calls.
		Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true},
		// A health endpoint that redirects is misconfigured; report it rather than follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// probe GETs url once and returns the status line on 200, else an error naming the status and
// the start of the body (a /readyz body says which dependency is down).
func probe(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", fmt.Errorf("unhealthy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("unhealthy: %s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return resp.Status, nil
}
