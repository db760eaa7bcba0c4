package node

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/transport/rls"
)

// envoySettings is what serve takes from the environment variables of Envoy's reference rate
// limit service (github.com/envoyproxy/ratelimit, src/settings/settings.go), so that a
// deployment of it moves to Sluice by changing the image. Each value has a Sluice meaning;
// Sluice's own flags and SLUICE_* variables win over it. Every variable the reference reads
// is either mapped here, refused with an error naming it and what to use instead, or accepted
// with a note logged at start (envoyOther; docs/envoy.md has the table).
type envoySettings struct {
	// defaults are the serve flags the variables set, in the order they are applied.
	defaults []envoyDefault
	// StatsD is the StatsD address (host:port) that USE_STATSD, STATSD_HOST and STATSD_PORT
	// name; empty when StatsD is off.
	StatsD string
	// LimitHeader, RemainingHeader and ResetHeader are LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER: the names of the RLS response headers
	// (rls.Options); empty keeps Sluice's defaults, which are the reference's.
	LimitHeader, RemainingHeader, ResetHeader string
	// GRPCTLS is GRPC_SERVER_USE_TLS and its files: TLS on the gRPC listener only (HTTP stays
	// plaintext, as there).
	GRPCTLS envoyGRPCTLS
	// MaxConnectionAge and MaxConnectionAgeGrace are GRPC_MAX_CONNECTION_AGE[_GRACE]: gRPC
	// connections are closed with a GOAWAY after them; 0 keeps connections open.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// KeyPrefix is CACHE_KEY_PREFIX: put before every Redis key (the store URL's key_prefix).
	KeyPrefix string
	// PerSecondStore is the store URL of REDIS_PERSECOND_*: limits of a second or less go
	// there (store/split); empty keeps every limit in --store.
	PerSecondStore string
	// MergeDomains is MERGE_DOMAIN_CONFIG: one Envoy domain may span several files.
	MergeDomains bool
	// QuotaMode is QUOTA_MODE: every Envoy-format limit in quota_mode
	// (sluice.WithEnvoyQuotaMode).
	QuotaMode bool
	// DynamicMetadata is RESPONSE_DYNAMIC_METADATA: RLS answers carry dynamic_metadata.
	DynamicMetadata bool
	// DebugAddr is DEBUG_HOST:DEBUG_PORT, a listener for Go's profiles (/debug/pprof/) as
	// the reference's debug port serves; empty when neither is set.
	DebugAddr string
	// PrometheusAddr and PrometheusPath are USE_PROMETHEUS's PROMETHEUS_ADDR and
	// PROMETHEUS_PATH: the metrics (also on --http at /metrics) on a listener of their own.
	PrometheusAddr, PrometheusPath string
	// HealthCheckStore is REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: /healthcheck fails while the
	// store does not answer.
	HealthCheckStore bool
	// Notes are the variables accepted with a difference, logged at start.
	Notes []envoyNote
}

// envoyGRPCTLS is the gRPC listener's TLS of GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY,
// GRPC_CLIENT_TLS_CACERT (mutual TLS) and GRPC_CLIENT_TLS_SAN; zero when off.
type envoyGRPCTLS struct {
	Cert, Key, ClientCA, ClientSAN string
}

// envoyNote is a variable accepted where Sluice works otherwise, and what it does instead.
type envoyNote struct {
	Var, Note string
}

// envoyDefault is one serve flag set from the reference's variables.
type envoyDefault struct {
	Flag  string // the serve flag
	Env   string // Sluice's own variable for the flag: when set, it wins
	Value string
	From  string // the reference's variables the value comes from, for errors and logs
}

// The reference's defaults where Sluice needs them to complete a value a deployment set in
// part (a GRPC_PORT without GRPC_HOST listens on every interface there, so it does here).
const (
	envoyDefaultHost         = "0.0.0.0"
	envoyDefaultHTTPPort     = "8080"
	envoyDefaultGRPCPort     = "8081"
	envoyDefaultDebugPort    = "6070"
	envoyDefaultRuntimeRoot  = "/srv/runtime_data/current"
	envoyDefaultAppDir       = "config"
	envoyDefaultStatsDHost   = "localhost"
	envoyDefaultStatsDPort   = "8125"
	envoyDefaultPromAddr     = ":9090"
	envoyDefaultPromPath     = "/metrics"
	envoyDefaultOTLPEndpoint = "localhost:4317" // the OTLP/gRPC exporter's default
)

// envoyXDS are the reference's variables of its xDS configuration source
// (CONFIG_TYPE=GRPC_XDS_SOTW), read by readEnvoyXDS (envoy_xds.go).
var envoyXDS = []string{
	"CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG",
	"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
}

// envoyMapped are the variables readEnvoyEnv gives a Sluice meaning to, by code below.
var envoyMapped = []string{
	"HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST", "DEBUG_PORT",
	"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL", "LOG_FORMAT",
	"USE_STATSD", "STATSD_HOST", "STATSD_PORT", "USE_DOG_STATSD", "DISABLE_STATS",
	"USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY",
	"CACHE_KEY_PREFIX", "BACKEND_TYPE", "MERGE_DOMAIN_CONFIG", "SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_TLS", "REDIS_SENTINEL_AUTH",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW", "REDIS_TIMEOUT", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
	"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH",
	"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_TIMEOUT",
	"TRACING_ENABLED", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
}

// refuse says which values of a variable of envoyOther stop the start.
type refuse uint8

const (
	refuseNever refuse = iota // accepted, with the note logged
	refuseSet                 // any value
	refuseTrue                // true (a switch whose false is what Sluice does)
	refuseFalse               // false (a switch whose true is what Sluice does)
)

// envoyOther are the reference's variables that Sluice has no setting for: each is refused
// when its value would make Sluice behave otherwise than the reference (the error names the
// variable, says why, and what to use instead), or accepted with a note logged at start where
// the difference is harmless (a tuning knob of the reference's own implementation).
var envoyOther = []struct {
	Var    string
	Refuse refuse
	Why    string
}{
	{"GRPC_UDS", refuseSet, "gRPC on a unix socket is not supported; listen on TCP with GRPC_HOST and GRPC_PORT, or --grpc"},
	{"USE_DOG_STATSD_MOGRIFIERS", refuseSet, "Sluice's StatsD names are its Prometheus metrics' names, with labels as DogStatsD tags; there is nothing for a mogrifier to rewrite: remove it and map names in your agent"},
	{"EXTRA_TAGS", refuseSet, "Sluice sends no fixed tags with its metrics; set them in your StatsD agent or Prometheus relabelling"},
	{"PROMETHEUS_MAPPER_YAML", refuseSet, "Sluice serves its own metric names (docs/metrics); there is no statsd_exporter mapping to load: remove it"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", refuseTrue, "Sluice's latency histograms are in seconds (sluice_decision_duration_seconds), as Prometheus names them; scale in your queries"},
	{"RUNTIME_IGNOREDOTFILES", refuseFalse, "Sluice never reads files whose names start with a dot; rename them, or unset it (true is what Sluice does)"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", refuseNever, "Sluice pipelines every call over a few connections and never waits for a free one: WAIT is what it does"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", refuseNever, "as REDIS_POOL_ON_EMPTY_BEHAVIOR"},
	{"RUNTIME_WATCH_ROOT", refuseNever, "Sluice watches the configuration folder itself (a ConfigMap's swap included) and reloads on change or SIGHUP"},
	{"EXPIRATION_JITTER_MAX_SECONDS", refuseNever, "Sluice expires each key just after its limit is fully restored, to the microsecond; it adds no jitter"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", refuseNever, "Sluice keeps no cache of over-limit keys; --hot-keys decides a node's hottest keys in the process"},
	{"NEAR_LIMIT_RATIO", refuseNever, "it sets only the reference's near_limit statistic, which Sluice counts at the default 0.8; Sluice's warning threshold is each rule's soft: percentage"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", refuseNever, "Sluice never counts a denied request, whatever its value"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", refuseNever, "Sluice does not start without its configuration, so /healthcheck is healthy only with it loaded"},
	{"STATS_FLUSH_INTERVAL", refuseNever, "Sluice sends StatsD every few seconds, and Prometheus is read when scraped"},
	{"REDIS_POOL_SIZE", refuseNever, "Sluice pipelines calls over one connection per Redis node (the --store URL's pipeline_multiplex spreads them)"},
	{"REDIS_PERSECOND_POOL_SIZE", refuseNever, "as REDIS_POOL_SIZE"},
	{"REDIS_PIPELINE_LIMIT", refuseNever, "deprecated and without effect in the reference too"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", refuseNever, "deprecated and without effect in the reference too"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", refuseNever, "Sluice sends the calls of every hash slot of a request in one pipeline, at once"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", refuseNever, "as REDIS_CLUSTER_PIPELINE_PARALLELISM"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", refuseNever, "Sluice does not wait for Redis at start: it exits with an error naming it, and the orchestrator restarts it"},
	{"REDIS_STARTUP_MAX_INTERVAL", refuseNever, "as REDIS_STARTUP_INITIAL_INTERVAL"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", refuseNever, "as REDIS_STARTUP_INITIAL_INTERVAL"},
	{"TRACING_SERVICE_NAME", refuseNever, "spans carry service.name sluice; OTEL_RESOURCE_ATTRIBUTES adds attributes"},
	{"TRACING_SERVICE_NAMESPACE", refuseNever, "as TRACING_SERVICE_NAME"},
	{"TRACING_SERVICE_INSTANCE_ID", refuseNever, "spans carry the node's id (--node-id)"},
}

// envoyMemcache are the memcached settings: refused with BACKEND_TYPE=memcache, ignored (as
// by the reference) with the Redis backend.
var envoyMemcache = []string{
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
}

// readEnvoyEnv reads the reference service's variables through lookup (os.LookupEnv). Only
// variables that are set count: an unset one keeps Sluice's default rather than the
// reference's (Sluice listens on loopback and runs on the built-in policy unless told). A
// variable with a value the reference would refuse, or that Sluice cannot honour, is an error
// naming it.
func readEnvoyEnv(lookup func(string) (string, bool)) (envoySettings, error) {
	var s envoySettings
	get := func(name string) string { v, _ := lookup(name); return strings.TrimSpace(v) }
	set := func(name string) bool { v, ok := lookup(name); return ok && strings.TrimSpace(v) != "" }
	add := func(flag, env, value, from string) {
		s.defaults = append(s.defaults, envoyDefault{Flag: flag, Env: env, Value: value, From: from})
	}
	note := func(name, why string) { s.Notes = append(s.Notes, envoyNote{Var: name, Note: why}) }
	boolean := func(name string) (bool, error) {
		b, err := strconv.ParseBool(get(name))
		if err != nil {
			return false, fmt.Errorf("%s: %q is not true or false", name, get(name))
		}
		return b, nil
	}
	duration := func(name string) (time.Duration, error) {
		d, err := time.ParseDuration(get(name))
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%s: %q is not a duration such as 10s or 1h", name, get(name))
		}
		return d, nil
	}

	for _, o := range envoyOther {
		if !set(o.Var) {
			continue
		}
		refused := o.Refuse == refuseSet
		if o.Refuse == refuseTrue || o.Refuse == refuseFalse {
			b, err := boolean(o.Var)
			if err != nil {
				return s, err
			}
			if refused = b == (o.Refuse == refuseTrue); !refused {
				continue // the other value of a switch is what Sluice does: nothing to note
			}
		}
		if refused {
			return s, fmt.Errorf("%s=%s: %s", o.Var, get(o.Var), o.Why)
		}
		note(o.Var, o.Why)
	}
	for _, name := range []string{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR"} {
		switch v := strings.ToUpper(get(name)); v {
		case "", "WAIT":
		case "CREATE", "ERROR":
			return s, fmt.Errorf("%s=%s: not supported, as in the reference (which stops at start); use WAIT or unset it", name, get(name))
		default:
			return s, fmt.Errorf("%s: %q is not WAIT", name, get(name))
		}
	}

	// The backend: Redis, or refused.
	memcache := false
	if set("BACKEND_TYPE") {
		switch strings.ToLower(get("BACKEND_TYPE")) {
		case "redis":
		case "memcache":
			memcache = true
		default:
			return s, fmt.Errorf("BACKEND_TYPE: %q is not redis or memcache", get("BACKEND_TYPE"))
		}
	}
	if memcache {
		return s, errors.New("BACKEND_TYPE=memcache: Sluice has no memcached backend: memcached has no server-side scripts, so it cannot decide a request's limits in one atomic step; use Redis (BACKEND_TYPE=redis with REDIS_URL, or --store) or the memory store")
	}
	for _, name := range envoyMemcache {
		if set(name) {
			note(name, "ignored with the Redis backend, as by the reference")
		}
	}

	// The policy folder: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, where the
	// reference's runtime loader finds its YAML files.
	if set("RUNTIME_ROOT") || set("RUNTIME_SUBDIRECTORY") {
		root := or(get("RUNTIME_ROOT"), envoyDefaultRuntimeRoot)
		add("config", "SLUICE_CONFIG", filepath.Join(root, get("RUNTIME_SUBDIRECTORY"), or(get("RUNTIME_APPDIRECTORY"), envoyDefaultAppDir)), "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY")
	}
	if set("MERGE_DOMAIN_CONFIG") {
		b, err := boolean("MERGE_DOMAIN_CONFIG")
		if err != nil {
			return s, err
		}
		s.MergeDomains = b
	}

	// Listeners: HOST:PORT for HTTP, GRPC_HOST:GRPC_PORT for gRPC (RLS and sluice.v1).
	for _, l := range []struct{ flag, env, host, port, def string }{
		{"http", "SLUICE_HTTP", "HOST", "PORT", envoyDefaultHTTPPort},
		{"grpc", "SLUICE_GRPC", "GRPC_HOST", "GRPC_PORT", envoyDefaultGRPCPort},
		{"", "", "DEBUG_HOST", "DEBUG_PORT", envoyDefaultDebugPort},
	} {
		if !set(l.host) && !set(l.port) {
			continue
		}
		port := or(get(l.port), l.def)
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return s, fmt.Errorf("%s: %q is not a port number", l.port, port)
		}
		addr := net.JoinHostPort(or(get(l.host), envoyDefaultHost), port)
		if l.flag == "" {
			s.DebugAddr = addr
			continue
		}
		add(l.flag, l.env, addr, l.host+", "+l.port)
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"GRPC_MAX_CONNECTION_AGE", &s.MaxConnectionAge}, {"GRPC_MAX_CONNECTION_AGE_GRACE", &s.MaxConnectionAgeGrace}} {
		if set(d.name) {
			v, err := duration(d.name)
			if err != nil {
				return s, err
			}
			*d.to = v
		}
	}
	if err := readEnvoyGRPCTLS(&s, get, set, boolean); err != nil {
		return s, err
	}

	if set("REDIS_URL") {
		store, err := envoyRedisURL(get, "REDIS_")
		if err != nil {
			return s, err
		}
		add("store", "SLUICE_STORE", store, "REDIS_URL, REDIS_SOCKET_TYPE, REDIS_TYPE, REDIS_AUTH, REDIS_TLS")
	}
	if set("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION") {
		b, err := boolean("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
		if err != nil {
			return s, err
		}
		s.HealthCheckStore = b
	}
	perSecond := false
	if set("REDIS_PERSECOND") {
		b, err := boolean("REDIS_PERSECOND")
		if err != nil {
			return s, err
		}
		perSecond = b
	}
	if perSecond {
		if !set("REDIS_PERSECOND_URL") {
			// The reference's default is a twemproxy socket, which Sluice cannot reach.
			return s, errors.New("REDIS_PERSECOND_URL: not set; with REDIS_PERSECOND=true, set it to the per-second Redis's host:port (and REDIS_PERSECOND_SOCKET_TYPE=tcp)")
		}
		url, err := envoyRedisURL(get, "REDIS_PERSECOND_")
		if err != nil {
			return s, err
		}
		s.PerSecondStore = url
	} else {
		for _, name := range []string{"REDIS_PERSECOND_URL", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS"} {
			if set(name) {
				note(name, "ignored without REDIS_PERSECOND=true, as by the reference")
			}
		}
	}
	if set("CACHE_KEY_PREFIX") {
		s.KeyPrefix = get("CACHE_KEY_PREFIX")
		if strings.ContainsAny(s.KeyPrefix, "{}") {
			return s, fmt.Errorf("CACHE_KEY_PREFIX: %q: braces are not allowed (they would move Sluice's Redis hash tags)", s.KeyPrefix)
		}
	}

	if err := readEnvoyStats(&s, get, set, boolean, add); err != nil {
		return s, err
	}
	if err := readEnvoyTracing(get, set, boolean, add); err != nil {
		return s, err
	}

	if set("LOG_LEVEL") {
		// The reference logs with logrus, whose level names are a superset of slog's.
		level := strings.ToLower(get("LOG_LEVEL"))
		switch level {
		case "trace":
			level = "debug"
		case "warning":
			level = "warn"
		case "fatal", "panic":
			level = "error"
		case "debug", "info", "warn", "error":
		default:
			return s, fmt.Errorf("LOG_LEVEL: %q is not trace, debug, info, warn, error, fatal or panic", get("LOG_LEVEL"))
		}
		add("log-level", "SLUICE_LOG_LEVEL", level, "LOG_LEVEL")
	}
	if set("LOG_FORMAT") {
		format := strings.ToLower(get("LOG_FORMAT"))
		if format != "text" && format != "json" {
			return s, fmt.Errorf("LOG_FORMAT: %q is not text or json", get("LOG_FORMAT"))
		}
		add("log-format", "SLUICE_LOG_FORMAT", format, "LOG_FORMAT")
	}

	if set("SHADOW_MODE") {
		b, err := boolean("SHADOW_MODE")
		if err != nil {
			return s, err
		}
		add("shadow", "SLUICE_SHADOW", strconv.FormatBool(b), "SHADOW_MODE")
	}

	for _, sw := range []struct {
		name string
		to   *bool
	}{{"QUOTA_MODE", &s.QuotaMode}, {"RESPONSE_DYNAMIC_METADATA", &s.DynamicMetadata}} {
		if set(sw.name) {
			b, err := boolean(sw.name)
			if err != nil {
				return s, err
			}
			*sw.to = b
		}
	}

	// CONFIG_TYPE=GRPC_XDS_SOTW and its CONFIG_GRPC_XDS_* variables (envoy_xds.go).
	if err := readEnvoyXDS(&s, get); err != nil {
		return s, err
	}
	s.LimitHeader, s.RemainingHeader, s.ResetHeader = get("LIMIT_LIMIT_HEADER"), get("LIMIT_REMAINING_HEADER"), get("LIMIT_RESET_HEADER")
	return s, nil
}

// readEnvoyGRPCTLS reads GRPC_SERVER_USE_TLS and its files into s.GRPCTLS. Files given with
// TLS off are an error rather than plaintext a deployment did not mean.
func readEnvoyGRPCTLS(s *envoySettings, get func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	on := false
	if set("GRPC_SERVER_USE_TLS") {
		b, err := boolean("GRPC_SERVER_USE_TLS")
		if err != nil {
			return err
		}
		on = b
	}
	files := []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"}
	if !on {
		for _, name := range files {
			if set(name) {
				return fmt.Errorf("%s: set without GRPC_SERVER_USE_TLS=true, so gRPC would be plaintext; set GRPC_SERVER_USE_TLS=true, or unset it", name)
			}
		}
		return nil
	}
	for _, name := range files[:2] {
		if !set(name) {
			return fmt.Errorf("%s: needed with GRPC_SERVER_USE_TLS=true", name)
		}
	}
	if set("GRPC_CLIENT_TLS_SAN") && !set("GRPC_CLIENT_TLS_CACERT") {
		return errors.New("GRPC_CLIENT_TLS_SAN: needs GRPC_CLIENT_TLS_CACERT, the CA client certificates must chain to")
	}
	s.GRPCTLS = envoyGRPCTLS{Cert: get(files[0]), Key: get(files[1]), ClientCA: get(files[2]), ClientSAN: get(files[3])}
	return nil
}

// readEnvoyStats reads the reference's StatsD and Prometheus switches.
func readEnvoyStats(s *envoySettings, get func(string) string, set func(string) bool, boolean func(string) (bool, error), add func(flag, env, value, from string)) error {
	disabled := false
	if set("DISABLE_STATS") {
		b, err := boolean("DISABLE_STATS")
		if err != nil {
			return err
		}
		disabled = b
	}
	// StatsD: on when USE_STATSD=true, or when an address is given without USE_STATSD.
	useStatsD := set("STATSD_HOST") || set("STATSD_PORT")
	if set("USE_STATSD") {
		b, err := boolean("USE_STATSD")
		if err != nil {
			return err
		}
		useStatsD = b
	}
	if useStatsD && disabled {
		s.Notes = append(s.Notes, envoyNote{"DISABLE_STATS", "StatsD is off, as there; Sluice's Prometheus metrics are still served on --http at /metrics"})
		useStatsD = false
	}
	if useStatsD {
		port := or(get("STATSD_PORT"), envoyDefaultStatsDPort)
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("STATSD_PORT: %q is not a port number", port)
		}
		s.StatsD = net.JoinHostPort(or(get("STATSD_HOST"), envoyDefaultStatsDHost), port)
		add("statsd", "SLUICE_STATSD", s.StatsD, "USE_STATSD, STATSD_HOST, STATSD_PORT")
	}
	if set("USE_DOG_STATSD") {
		b, err := boolean("USE_DOG_STATSD")
		if err != nil {
			return err
		}
		if b {
			add("statsd-tags", "SLUICE_STATSD_TAGS", "dogstatsd", "USE_DOG_STATSD")
		}
	}
	usePrometheus := false
	if set("USE_PROMETHEUS") {
		b, err := boolean("USE_PROMETHEUS")
		if err != nil {
			return err
		}
		usePrometheus = b
	}
	if !usePrometheus {
		for _, name := range []string{"PROMETHEUS_ADDR", "PROMETHEUS_PATH"} {
			if set(name) {
				s.Notes = append(s.Notes, envoyNote{name, "ignored without USE_PROMETHEUS=true, as by the reference; the metrics are on --http at /metrics"})
			}
		}
		return nil
	}
	s.PrometheusAddr, s.PrometheusPath = or(get("PROMETHEUS_ADDR"), envoyDefaultPromAddr), or(get("PROMETHEUS_PATH"), envoyDefaultPromPath)
	if _, port, err := net.SplitHostPort(s.PrometheusAddr); err != nil || port == "" {
		return fmt.Errorf("PROMETHEUS_ADDR: %q is not host:port or :port", s.PrometheusAddr)
	}
	if !strings.HasPrefix(s.PrometheusPath, "/") {
		return fmt.Errorf("PROMETHEUS_PATH: %q does not start with /", s.PrometheusPath)
	}
	return nil
}

// readEnvoyTracing maps TRACING_ENABLED and its settings to the OTLP exporter's flags.
func readEnvoyTracing(get func(string) string, set func(string) bool, boolean func(string) (bool, error), add func(flag, env, value, from string)) error {
	on := false
	if set("TRACING_ENABLED") {
		b, err := boolean("TRACING_ENABLED")
		if err != nil {
			return err
		}
		on = b
	}
	if !on {
		return nil
	}
	switch p := strings.ToLower(or(get("TRACING_EXPORTER_PROTOCOL"), "http")); p {
	case "grpc":
	case "http":
		return errors.New("TRACING_EXPORTER_PROTOCOL: http (the reference's default): Sluice exports traces over OTLP/gRPC only; set TRACING_EXPORTER_PROTOCOL=grpc and OTEL_EXPORTER_OTLP_ENDPOINT to the collector's gRPC port (4317), or --otlp-endpoint")
	default:
		return fmt.Errorf("TRACING_EXPORTER_PROTOCOL: %q is not grpc or http", p)
	}
	if !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_ENDPOINT") {
		add("otlp-endpoint", "SLUICE_OTLP_ENDPOINT", envoyDefaultOTLPEndpoint, "TRACING_ENABLED")
	}
	// The reference samples every trace unless told.
	ratio := or(get("TRACING_SAMPLING_RATE"), "1")
	if r, err := strconv.ParseFloat(ratio, 64); err != nil || r < 0 || r > 1 {
		return fmt.Errorf("TRACING_SAMPLING_RATE: %q is not a number from 0 to 1", ratio)
	}
	add("trace-sample-ratio", "SLUICE_TRACE_SAMPLE_RATIO", ratio, "TRACING_ENABLED, TRACING_SAMPLING_RATE")
	return nil
}

// envoyRedisURL builds a --store URL from the variables of one of the reference's Redis
// connections, named from prefix (REDIS_ or REDIS_PERSECOND_): SOCKET_TYPE, TYPE, URL, AUTH,
// TLS, SENTINEL_AUTH, PIPELINE_WINDOW and TIMEOUT, with the TLS files both share
// (REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT and _KEY, REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
func envoyRedisURL(get func(string) string, prefix string) (string, error) {
	switch st := strings.ToLower(or(get(prefix+"SOCKET_TYPE"), "unix")); st {
	case "tcp":
	case "unix":
		// The reference's default, for a twemproxy socket in the pod.
		return "", fmt.Errorf("%sSOCKET_TYPE: unix sockets are not supported; Sluice reaches Redis over TCP: set %sSOCKET_TYPE=tcp and %sURL=host:port, or --store", prefix, prefix, prefix)
	default:
		return "", fmt.Errorf("%sSOCKET_TYPE: %q is not tcp or unix", prefix, st)
	}
	u := url.URL{Scheme: "redis"}
	q := url.Values{}
	tlsOn := false
	if v := get(prefix + "TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", fmt.Errorf("%sTLS: %q is not true or false", prefix, v)
		}
		tlsOn = b
	}
	if auth := get(prefix + "AUTH"); auth != "" {
		// "password", or "user:password" for Redis 6 ACLs, as in the reference.
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", auth)
		}
	}
	addrs := get(prefix + "URL")
	switch typ := strings.ToUpper(or(get(prefix+"TYPE"), "SINGLE")); typ {
	case "SINGLE":
		u.Host = addrs
		if tlsOn {
			u.Scheme = "rediss"
		}
	case "SENTINEL":
		// The reference's form: the master's name, then the sentinels.
		master, sentinels, ok := strings.Cut(addrs, ",")
		if !ok || master == "" || sentinels == "" {
			return "", fmt.Errorf("%sURL: with %sTYPE=SENTINEL, want master,host:port[,host:port...]", prefix, prefix)
		}
		u.Scheme, u.Host, u.Path = "redis-sentinel", sentinels, "/"+master
		// The sentinels' own password, none unless given, as there.
		q.Set("sentinel_auth", get(prefix+"SENTINEL_AUTH"))
	case "CLUSTER":
		u.Scheme, u.Host = "redis-cluster", addrs
	default:
		return "", fmt.Errorf("%sTYPE: %q is not SINGLE, SENTINEL or CLUSTER", prefix, typ)
	}
	if tlsOn && u.Scheme != "rediss" {
		q.Set("tls", "true")
	}
	if tlsOn {
		// The TLS files are REDIS_TLS_*, shared by both connections, as there.
		if ca := get("REDIS_TLS_CACERT"); ca != "" {
			q.Set("tls_ca_file", ca)
		}
		cert, key := get("REDIS_TLS_CLIENT_CERT"), get("REDIS_TLS_CLIENT_KEY")
		if (cert == "") != (key == "") {
			return "", errors.New("REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: give both or neither")
		}
		if cert != "" {
			q.Set("tls_cert_file", cert)
			q.Set("tls_key_file", key)
		}
		if v := get("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return "", fmt.Errorf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: %q is not true or false", v)
			}
			if b {
				q.Set("tls_skip_hostname_verification", "true")
			}
		}
	}
	if v := get(prefix + "PIPELINE_WINDOW"); v != "" {
		// The reference's write-flush interval is the store's max_flush_delay.
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return "", fmt.Errorf("%sPIPELINE_WINDOW: %q is not a duration such as 150us", prefix, v)
		}
		q.Set("max_flush_delay", d.String())
	}
	if v := get(prefix + "TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return "", fmt.Errorf("%sTIMEOUT: %q is not a duration such as 10s", prefix, v)
		}
		// Connecting and writing; each decision's wait is --store-timeout's.
		q.Set("dial_timeout", d.String())
		q.Set("write_timeout", d.String())
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// policyOptions are the policy loader's options of MERGE_DOMAIN_CONFIG.
func (s envoySettings) policyOptions() []policy.LoadOption {
	if s.MergeDomains {
		return []policy.LoadOption{policy.MergeDomains()}
	}
	return nil
}

// withKeyPrefix adds key_prefix=prefix to a Redis store URL that has none.
func withKeyPrefix(storeURL, prefix string) (string, error) {
	if prefix == "" || !strings.HasPrefix(storeURL, "redis") {
		return storeURL, nil
	}
	u, err := url.Parse(storeURL)
	if err != nil {
		return "", errors.New("--store: not a valid URL")
	}
	q := u.Query()
	if q.Has("key_prefix") {
		return storeURL, nil
	}
	q.Set("key_prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// applyEnvoyEnv sets each serve flag that the reference's variables give a value, unless the
// flag was given on the command line or through its SLUICE_* variable. Flags that this build
// does not have are skipped.
func applyEnvoyEnv(flags *pflag.FlagSet, s envoySettings, lookup func(string) (string, bool)) error {
	for _, d := range s.defaults {
		f := flags.Lookup(d.Flag)
		if f == nil || f.Changed {
			continue
		}
		if v, ok := lookup(d.Env); ok && v != "" {
			continue
		}
		if err := flags.Set(d.Flag, d.Value); err != nil {
			return fmt.Errorf("%s: --%s %q: %w", d.From, d.Flag, d.Value, err)
		}
	}
	return nil
}

// readEnvoy reads the reference's variables from the environment into c.envoy and applies
// them to the flags that were not given.
func (c *Config) readEnvoy(flags *pflag.FlagSet) error {
	s, err := readEnvoyEnv(os.LookupEnv)
	if err != nil {
		return err
	}
	c.envoy = s
	return applyEnvoyEnv(flags, s, os.LookupEnv)
}

// rlsOptions are the RLS server's options: LIMIT_RESPONSE_HEADERS_ENABLED, the header names
// of LIMIT_*_HEADER and RESPONSE_DYNAMIC_METADATA.
func rlsOptions(c Config) rls.Options {
	return rls.Options{
		ResponseHeaders: c.responseHeaders,
		LimitHeader:     c.envoy.LimitHeader,
		RemainingHeader: c.envoy.RemainingHeader,
		ResetHeader:     c.envoy.ResetHeader,
		DynamicMetadata: c.envoy.DynamicMetadata,
	}
}

// envoyFlags registers the serve flags that exist for the reference's settings and reads
// those settings into c.envoy, as defaults applied by applyEnvoyEnv after parsing.
func envoyFlags(f *pflag.FlagSet, c *Config) {
	f.BoolVar(&c.shadow, "shadow", os.Getenv("SLUICE_SHADOW") == "true", "global shadow mode: decide, count and report every request but deny none; as SHADOW_MODE of Envoy's reference service (SLUICE_SHADOW=true)")
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
