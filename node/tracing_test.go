package node

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/testkit/oteltest"
	"github.com/sluicehq/sluice/internal/testkit/testca"
	"github.com/sluicehq/sluice/telemetry/tracing"
)

// TestTracingResolve reads the flags and the standard variables as serve does: off by
// default, on with an endpoint from either, the sampler from the flag or OTEL_TRACES_SAMPLER,
// and every bad value an error naming the flag or variable.
func TestTracingResolve(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "collector CA")
	caFile := ca.File(t, dir, "ca.pem")
	certFile, keyFile := ca.Client(t, "sluice").Files(t, dir, "client")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		flags    tracingFlags
		env      map[string]string
		on       bool
		insecure bool
		tls      bool
		sampler  string
		err      string
	}{
		{name: "off by default"},
		{name: "ratio alone leaves it off", flags: tracingFlags{ratio: "0.5"}},
		{name: "flag", flags: tracingFlags{endpoint: "127.0.0.1:4317"}, on: true, sampler: "parentbased_traceidratio 0.01"},
		{name: "flag insecure, ratio", flags: tracingFlags{endpoint: "collector:4317", insecure: true, ratio: "1"}, on: true, insecure: true, sampler: "parentbased_traceidratio 1"},
		{name: "standard endpoint, http is plaintext", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, on: true, insecure: true, sampler: "parentbased_traceidratio 0.01"},
		{name: "traces endpoint wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "bad", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector"}, on: true},
		{name: "flag wins over the variable", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "bad"}, on: true},
		{name: "standard insecure", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true"}, on: true, insecure: true},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}},
		{name: "sampler arg", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0.25"}, on: true, sampler: "parentbased_traceidratio 0.25"},
		{name: "standard sampler", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, on: true, sampler: "always_on"},
		{name: "standard ratio sampler defaults to 1", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio"}, on: true, sampler: "traceidratio 1"},
		{name: "flag ratio wins over the sampler", flags: tracingFlags{endpoint: "a:1", ratio: "0"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, on: true, sampler: "parentbased_traceidratio 0"},
		{name: "private CA and client certificate", flags: tracingFlags{endpoint: "a:1", ca: caFile, cert: certFile, key: keyFile}, on: true, tls: true},

		{name: "ratio above 1", flags: tracingFlags{ratio: "1.5"}, err: `--trace-sample-ratio: "1.5": want a number from 0 to 1`},
		{name: "ratio negative", flags: tracingFlags{endpoint: "a:1", ratio: "-0.1"}, err: "--trace-sample-ratio"},
		{name: "ratio NaN", flags: tracingFlags{endpoint: "a:1", ratio: "NaN"}, err: "--trace-sample-ratio"},
		{name: "ratio not a number", flags: tracingFlags{endpoint: "a:1", ratio: "all"}, err: "--trace-sample-ratio"},
		{name: "bad sampler arg", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER_ARG": "2"}, err: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "unknown sampler", flags: tracingFlags{endpoint: "a:1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, err: `OTEL_TRACES_SAMPLER: "jaeger_remote"`},
		{name: "endpoint without port", flags: tracingFlags{endpoint: "collector"}, err: `--otlp-endpoint: "collector": want host:port`},
		{name: "endpoint port 0", flags: tracingFlags{endpoint: "collector:0"}, err: "--otlp-endpoint"},
		{name: "endpoint without host", flags: tracingFlags{endpoint: ":4317"}, err: "--otlp-endpoint"},
		{name: "endpoint of another scheme", flags: tracingFlags{endpoint: "grpc://collector:4317"}, err: "--otlp-endpoint: \"grpc://collector:4317\": the scheme must be http or https"},
		{name: "bad standard endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, err: "OTEL_EXPORTER_OTLP_ENDPOINT: "},
		{name: "CA without endpoint", flags: tracingFlags{ca: caFile}, err: "--otlp-ca: tracing is off; set --otlp-endpoint"},
		{name: "CA unreadable", flags: tracingFlags{endpoint: "a:1", ca: filepath.Join(dir, "missing.pem")}, err: "--otlp-ca: open"},
		{name: "CA not PEM", flags: tracingFlags{endpoint: "a:1", ca: notPEM}, err: "--otlp-ca: " + notPEM + " holds no PEM certificate"},
		{name: "cert without key", flags: tracingFlags{endpoint: "a:1", cert: certFile}, err: "--otlp-cert: needs --otlp-key"},
		{name: "key without cert", flags: tracingFlags{endpoint: "a:1", key: keyFile}, err: "--otlp-key: needs --otlp-cert"},
		{name: "cert not matching", flags: tracingFlags{endpoint: "a:1", cert: certFile, key: notPEM}, err: "--otlp-cert: "},
		{name: "TLS settings for plaintext", flags: tracingFlags{endpoint: "a:1", insecure: true, ca: caFile}, err: "--otlp-ca, --otlp-cert: TLS settings for a plaintext endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, on, err := tc.flags.resolve(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("err %v, want one starting %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if on != tc.on {
				t.Fatalf("on %v, want %v", on, tc.on)
			}
			if !on {
				return
			}
			if s.cfg.Insecure != tc.insecure || (s.cfg.TLS != nil) != tc.tls {
				t.Errorf("insecure %v, tls %v; want %v, %v", s.cfg.Insecure, s.cfg.TLS != nil, tc.insecure, tc.tls)
			}
			if tc.tls && (s.cfg.TLS.RootCAs == nil || s.cfg.TLS.GetClientCertificate == nil) {
				t.Errorf("TLS config lacks the CA or the client certificate: %+v", s.cfg.TLS)
			}
			if tc.sampler != "" && s.sampler != tc.sampler {
				t.Errorf("sampler %q, want %q", s.sampler, tc.sampler)
			}
			if s.cfg.Sampler == nil {
				t.Error("no sampler")
			}
		})
	}
}

// TestTracingOverMutualTLS exports to a collector that requires a client certificate from its
// own CA: the flags' CA and certificate get the spans through; without the certificate the
// collector refuses the connection and nothing arrives.
func TestTracingOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testca.New(t, "collector CA"), testca.New(t, "client CA")
	srvPair := serverCA.Server(t, "collector")
	cert, err := tls.X509KeyPair(srvPair.CertPEM, srvPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	recv := oteltest.StartTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: clientCA.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	caFile := serverCA.File(t, dir, "ca.pem")
	certFile, keyFile := clientCA.Client(t, "sluice").Files(t, dir, "client")
	noEnv := func(string) string { return "" }

	for _, tc := range []struct {
		name  string
		flags tracingFlags
		want  int
	}{
		{"no client certificate", tracingFlags{endpoint: recv.Addr, ca: caFile, ratio: "1"}, 0},
		{"client certificate", tracingFlags{endpoint: recv.Addr, ca: caFile, cert: certFile, key: keyFile, ratio: "1"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv.Reset()
			s, on, err := tc.flags.resolve(noEnv)
			if err != nil || !on {
				t.Fatalf("resolve: %v, on %v", err, on)
			}
			tp, err := tracing.NewProvider(t.Context(), s.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, span := tp.Tracer("test").Start(t.Context(), "probe")
			span.End()
			// A refused export is retried until the deadline: keep that wait short.
			wait := 10 * time.Second
			if tc.want == 0 {
				wait = time.Second
			}
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			flushErr := tp.ForceFlush(ctx)
			tp.Shutdown(ctx)
			if got := len(recv.Spans()); got != tc.want {
				t.Fatalf("%d spans arrived, want %d (flush: %v)", got, tc.want, flushErr)
			}
			if tc.want == 0 && flushErr == nil {
				t.Error("the export without a client certificate reported no error")
			}
		})
	}
}

// TestTracingErrorsAreCounted: with the collector gone, spans cannot be exported; serve's
// error handler counts it in sluice_tracing_errors_total (and logs it).
func TestTracingErrorsAreCounted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close() // nothing listens there any more
	// Failed exports reach the error handler from the batch processor's own schedule (a
	// ForceFlush returns its error to the caller instead): make that quick.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	t.Setenv("OTEL_BSP_EXPORT_TIMEOUT", "200")
	reg := prometheus.NewRegistry()
	tp, stop, err := startTracing(t.Context(), tracingFlags{endpoint: gone, insecure: true, ratio: "1"}, "node-a", "dev", reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, span := tp.Tracer("test").Start(t.Context(), "probe")
	span.End()
	count := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "sluice_tracing_errors_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("sluice_tracing_errors_total is not registered")
		return 0
	}
	for deadline := time.Now().Add(10 * time.Second); count() < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("sluice_tracing_errors_total still 0 10 s after an export to nowhere")
		}
	}
}
