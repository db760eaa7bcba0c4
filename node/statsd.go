package node

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/statsd"
)

// statsdFlags configure the StatsD sink beside Prometheus.
type statsdFlags struct {
	addr, prefix, tags string
}

func (s *statsdFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.addr, "statsd", EnvDefault("SLUICE_STATSD", ""), "StatsD address host:port: the Prometheus metrics, same names, sent over UDP every few seconds; empty is off (SLUICE_STATSD)")
	f.StringVar(&s.prefix, "statsd-prefix", EnvDefault("SLUICE_STATSD_PREFIX", ""), "prefix put before every StatsD name, with a dot (SLUICE_STATSD_PREFIX)")
	f.StringVar(&s.tags, "statsd-tags", EnvDefault("SLUICE_STATSD_TAGS", ""), "how labels travel to StatsD: dogstatsd (|#k:v tags) or name (values in the name, for plain StatsD); default dogstatsd, or name when the address came from Envoy's USE_STATSD (SLUICE_STATSD_TAGS)")
}

// startStatsD starts the StatsD sink when --statsd is set; nil when it is not. Plain StatsD
// (labels in the name) is the default for an address taken from Envoy's reference service's
// variables, whose StatsD server expects it.
func startStatsD(c Config, reg *prometheus.Registry, m *metrics.Metrics, lim *sluice.Limiter, log *slog.Logger) (*statsd.Sink, error) {
	if c.statsd.addr == "" {
		return nil, nil
	}
	tags := statsd.TagsDogStatsD
	switch c.statsd.tags {
	case "":
		if c.envoy.StatsD != "" && c.envoy.StatsD == c.statsd.addr {
			tags = statsd.TagsInName
		}
	case "dogstatsd":
	case "name":
		tags = statsd.TagsInName
	default:
		return nil, fmt.Errorf("--statsd-tags: %q is not dogstatsd or name", c.statsd.tags)
	}
	m.EnableEnvoyValueStats()
	sink, err := statsd.New(c.statsd.addr, reg, statsd.Options{Prefix: c.statsd.prefix, Tags: tags, EnvoyPolicy: lim.Policy, EnvoyValues: m.DrainEnvoyValueStats, Registerer: reg, Log: log})
	if err != nil {
		return nil, fmt.Errorf("--statsd: %w", err)
	}
	sink.Start()
	log.Info("sending metrics to StatsD", "addr", c.statsd.addr)
	return sink, nil
}
