package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/internal/tlsreload"
	"github.com/sluicehq/sluice/telemetry/tracing"
)

// tracingFlags configure the OTLP trace exporter. Tracing is off unless an endpoint is given,
// by flag, SLUICE_OTLP_ENDPOINT, or the standard OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT.
type tracingFlags struct {
	endpoint  string
	insecure  bool
	ca        string
	cert, key string
	ratio     string // empty: OTEL_TRACES_SAMPLER[_ARG], else tracing.DefaultSampleRatio
}

func (t *tracingFlags) register(f *pflag.FlagSet) {
	f.StringVar(&t.endpoint, "otlp-endpoint", EnvDefault("SLUICE_OTLP_ENDPOINT", ""), "OpenTelemetry collector to send decision traces to over OTLP/gRPC: host:port, or an http:// (plaintext) or https:// URL; empty reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT; none is off (SLUICE_OTLP_ENDPOINT)")
	f.BoolVar(&t.insecure, "otlp-insecure", os.Getenv("SLUICE_OTLP_INSECURE") == "true", "send traces in plaintext rather than TLS, e.g. to a collector on localhost; also OTEL_EXPORTER_OTLP_INSECURE=true (SLUICE_OTLP_INSECURE=true)")
	f.StringVar(&t.ca, "otlp-ca", EnvDefault("SLUICE_OTLP_CA", ""), "PEM CA bundle that the collector's certificate must chain to; default the system's roots (SLUICE_OTLP_CA)")
	f.StringVar(&t.cert, "otlp-cert", EnvDefault("SLUICE_OTLP_CERT", ""), "PEM client certificate for a collector that asks for one (mutual TLS), reloaded when the file changes; needs --otlp-key (SLUICE_OTLP_CERT)")
	f.StringVar(&t.key, "otlp-key", EnvDefault("SLUICE_OTLP_KEY", ""), "PEM private key of --otlp-cert (SLUICE_OTLP_KEY)")
	f.StringVar(&t.ratio, "trace-sample-ratio", EnvDefault("SLUICE_TRACE_SAMPLE_RATIO", ""), "share of calls without a sampled parent trace that are traced, 0 to 1; a caller's sampled traceparent is always followed; empty reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, else 0.01 (SLUICE_TRACE_SAMPLE_RATIO)")
}

// tracingSetup is what startTracing resolved from the flags and the environment.
type tracingSetup struct {
	cfg     tracing.Config
	sampler string // for the log: how the sampler was chosen
}

// resolve turns the flags and the standard OTEL_* variables (read through env) into a
// configuration; ok is false when tracing is off. Each error names the flag or variable at
// fault.
func (t tracingFlags) resolve(env func(string) string) (s tracingSetup, ok bool, err error) {
	endpoint, from := t.endpoint, "--otlp-endpoint"
	if endpoint == "" && env("OTEL_SDK_DISABLED") != "true" {
		for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
			if v := env(name); v != "" {
				endpoint, from = v, name
				break
			}
		}
	}
	// The sampler is checked even with tracing off: a bad value is a mistake either way.
	smp, smpName, err := sampler(t.ratio, env)
	if err != nil {
		return s, false, err
	}
	if endpoint == "" {
		for _, f := range []struct{ name, v string }{{"--otlp-ca", t.ca}, {"--otlp-cert", t.cert}, {"--otlp-key", t.key}} {
			if f.v != "" {
				return s, false, fmt.Errorf("%s: tracing is off; set --otlp-endpoint", f.name)
			}
		}
		return s, false, nil
	}
	s.cfg.Sampler, s.sampler = smp, smpName
	plaintext, err := checkEndpoint(endpoint)
	if err != nil {
		return s, false, fmt.Errorf("%s: %w", from, err)
	}
	s.cfg.Endpoint = endpoint
	s.cfg.Insecure = t.insecure || plaintext || envTrue(env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE") || envTrue(env, "OTEL_EXPORTER_OTLP_INSECURE")
	if s.cfg.TLS, err = t.clientTLS(); err != nil {
		return s, false, err
	}
	if s.cfg.TLS != nil && s.cfg.Insecure {
		return s, false, fmt.Errorf("--otlp-ca, --otlp-cert: TLS settings for a plaintext endpoint (%s %s, or --otlp-insecure)", from, endpoint)
	}
	return s, true, nil
}

// checkEndpoint accepts host:port, or an http:// or https:// URL with a host, as the standard
// variables spell it; plaintext reports an http:// URL.
func checkEndpoint(endpoint string) (plaintext bool, err error) {
	hostPort := endpoint
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return false, err
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return false, fmt.Errorf("%q: the scheme must be http or https (OTLP/gRPC)", endpoint)
		}
		if u.Host == "" {
			return false, fmt.Errorf("%q: no host", endpoint)
		}
		if u.Port() == "" {
			return u.Scheme == "http", nil // the exporter's default port, 4317
		}
		plaintext, hostPort = u.Scheme == "http", u.Host
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return false, fmt.Errorf("%q: want host:port or an http(s):// URL: %w", endpoint, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || host == "" {
		return false, fmt.Errorf("%q: want host:port with a port from 1 to 65535", endpoint)
	}
	return plaintext, nil
}

// clientTLS builds the TLS configuration the flags ask for; nil leaves it to the exporter
// (the system's roots, or OTEL_EXPORTER_OTLP_CERTIFICATE and its kin).
func (t tracingFlags) clientTLS() (*tls.Config, error) {
	if t.ca == "" && t.cert == "" && t.key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case t.cert != "" && t.key != "":
		r, err := tlsreload.New(tlsreload.Options{CertFile: t.cert, KeyFile: t.key})
		if err != nil {
			return nil, fmt.Errorf("--otlp-cert: %w", err)
		}
		cfg = r.ClientConfig()
	case t.cert != "":
		return nil, errors.New("--otlp-cert: needs --otlp-key")
	case t.key != "":
		return nil, errors.New("--otlp-key: needs --otlp-cert")
	}
	if t.ca != "" {
		pool, err := tlsreload.CertPool(t.ca)
		if err != nil {
			return nil, fmt.Errorf("--otlp-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// sampler chooses the sampler: --trace-sample-ratio when set (parent-based), else the
// standard OTEL_TRACES_SAMPLER with OTEL_TRACES_SAMPLER_ARG, else parent-based at
// OTEL_TRACES_SAMPLER_ARG or tracing.DefaultSampleRatio.
func sampler(flagRatio string, env func(string) string) (sdktrace.Sampler, string, error) {
	if flagRatio != "" {
		r, err := parseRatio(flagRatio)
		if err != nil {
			return nil, "", fmt.Errorf("--trace-sample-ratio: %w", err)
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), "parentbased_traceidratio " + flagRatio, nil
	}
	name, arg := env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG")
	ratio := func(def float64) (float64, error) {
		if arg == "" {
			return def, nil
		}
		r, err := parseRatio(arg)
		if err != nil {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %w", err)
		}
		return r, nil
	}
	switch name {
	case "":
		r, err := ratio(tracing.DefaultSampleRatio)
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), "parentbased_traceidratio " + strconv.FormatFloat(r, 'g', -1, 64), err
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), name, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "traceidratio", "parentbased_traceidratio":
		// The specification's default ratio for these names is 1.
		r, err := ratio(1)
		s := sdktrace.TraceIDRatioBased(r)
		if name == "parentbased_traceidratio" {
			s = sdktrace.ParentBased(s)
		}
		return s, name + " " + strconv.FormatFloat(r, 'g', -1, 64), err
	}
	return nil, "", fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", name)
}

func parseRatio(s string) (float64, error) {
	r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(r) || r < 0 || r > 1 {
		return 0, fmt.Errorf("%q: want a number from 0 to 1", s)
	}
	return r, nil
}

func envTrue(env func(string) string, name string) bool {
	return strings.EqualFold(env(name), "true")
}

// startTracing starts the exporter when tracing is on and returns its provider (nil when off:
// the servers then get no Tracer) and the function that flushes and stops it, to call once
// the servers drained. Export failures are logged and counted in sluice_tracing_errors_total.
func startTracing(ctx context.Context, t tracingFlags, node, version string, reg prometheus.Registerer, log *slog.Logger) (*sdktrace.TracerProvider, func(), error) {
	s, ok, err := t.resolve(os.Getenv)
	if err != nil || !ok {
		return nil, func() {}, err
	}
	s.cfg.Resource = []attribute.KeyValue{
		attribute.String("service.version", version),
		attribute.String("service.instance.id", node),
	}
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_tracing_errors_total", Help: "Errors of the OpenTelemetry trace pipeline, mostly exports the collector did not take; their spans are lost."})
	if err := reg.Register(errs); err != nil {
		return nil, nil, err
	}
	// The SDK reports its errors (a collector down, a full queue) through this process-wide
	// handler; the default would print them with the standard logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		errs.Inc()
		log.Warn("tracing", "err", err)
	}))
	tp, err := tracing.NewProvider(ctx, s.cfg)
	if err != nil {
		return nil, nil, err
	}
	log.Info("sending traces over OTLP/gRPC", "endpoint", s.cfg.Endpoint, "tls", !s.cfg.Insecure, "sampler", s.sampler)
	stop := func() {
		// Spans still queued are sent now, unless the collector takes longer than this.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: flush at exit", "err", err)
		}
	}
	return tp, stop, nil
}

// newTracer is the servers' Tracer over tp, naming storeName as the deciding store; nil when
// tracing is off.
func newTracer(tp *sdktrace.TracerProvider, storeName string) *tracing.Tracer {
	if tp == nil {
		return nil
	}
	return tracing.New(tp, storeName)
}

// tracingNode is the node's service.instance.id: --node-id, else hostname:port as the
// control store's node list names it.
func tracingNode(c Config) string {
	if c.nodeID != "" {
		return c.nodeID
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(c.httpAddr)
	return host + ":" + port
}
