package tracing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/credentials"
)

// DefaultSampleRatio is the share of traces Sluice starts itself that it samples: 1%. A rate
// limiter sees every request of the services behind it, so at 1 it would export a span or two
// for each of them; a caller that sampled its own trace is followed whatever the ratio
// (parent-based sampling), so the ratio only governs calls that arrive without one.
const DefaultSampleRatio = 0.01

// Config is what NewProvider needs: where to send spans and how many.
type Config struct {
	// Endpoint is the OTLP/gRPC collector: host:port, or an http:// (plaintext) or https://
	// URL as in OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string
	// Insecure sends spans in plaintext; otherwise over TLS.
	Insecure bool
	// TLS, when set, is the client TLS configuration (a private CA, a client certificate);
	// nil uses the system's roots, or the exporter's OTEL_EXPORTER_OTLP_CERTIFICATE settings.
	TLS *tls.Config
	// Sampler decides which traces are kept; nil is ParentBased(TraceIDRatioBased(SampleRatio)).
	Sampler sdktrace.Sampler
	// SampleRatio is used when Sampler is nil: 0 to 1.
	SampleRatio float64
	// Resource describes the process, after service.name "sluice" and before
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, which win over both.
	Resource []attribute.KeyValue
}

// NewProvider returns a TracerProvider that batches spans (the SDK's batch span processor,
// tuned by the OTEL_BSP_* variables) and exports them over OTLP/gRPC. Shut it down to flush
// what it holds. The exporter connects in the background: a collector that is down costs
// dropped spans, logged through otel's error handler, never a failed start.
func NewProvider(ctx context.Context, c Config) (*sdktrace.TracerProvider, error) {
	if c.Endpoint == "" {
		return nil, errors.New("tracing: no OTLP endpoint")
	}
	sampler := c.Sampler
	if sampler == nil {
		if math.IsNaN(c.SampleRatio) || c.SampleRatio < 0 || c.SampleRatio > 1 {
			return nil, fmt.Errorf("tracing: sample ratio %v: want 0 to 1", c.SampleRatio)
		}
		sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))
	}
	opts := []otlptracegrpc.Option{endpointOption(c.Endpoint)}
	switch {
	case c.Insecure:
		opts = append(opts, otlptracegrpc.WithInsecure())
	case c.TLS != nil:
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(c.TLS)))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later sources win: Sluice's defaults, then the standard variables.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "sluice")), resource.WithAttributes(c.Resource...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	), nil
}

// endpointOption takes a URL as the standard variable spells it (its scheme then says
// whether to use TLS), or host:port.
func endpointOption(endpoint string) otlptracegrpc.Option {
	if strings.HasPrefix(endpoint, "http://") || strings.HasPrefix(endpoint, "https://") {
		return otlptracegrpc.WithEndpointURL(endpoint)
	}
	return otlptracegrpc.WithEndpoint(endpoint)
}
