package node

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/transport/rls"
)

// envoySettings is what serve takes from the environment variables of Envoy's reference rate
// limit service (github.com/envoyproxy/ratelimit, src/settings/settings.go), so that a
// deployment of it moves to Sluice by changing the image. Each value has a Sluice meaning;
// Sluice's own flags and SLUICE_* variables win over it.
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
	envoyDefaultHost        = "0.0.0.0"
	envoyDefaultHTTPPort    = "8080"
	envoyDefaultGRPCPort    = "8081"
	envoyDefaultRuntimeRoot = "/srv/runtime_data/current"
	envoyDefaultAppDir      = "config"
	envoyDefaultStatsDHost  = "localhost"
	envoyDefaultStatsDPort  = "8125"
)

// readEnvoyEnv reads the reference service's variables through lookup (os.LookupEnv). Only
// variables that are set count: an unset one keeps Sluice's default rather than the
// reference's (Sluice listens on loopback and runs on the built-in policy unless told). A
// variable with a value the reference would refuse is an error naming it.
func readEnvoyEnv(lookup func(string) (string, bool)) (envoySettings, error) {
	var s envoySettings
	get := func(name string) string { v, _ := lookup(name); return strings.TrimSpace(v) }
	set := func(name string) bool { v, ok := lookup(name); return ok && strings.TrimSpace(v) != "" }
	add := func(flag, env, value, from string) {
		s.defaults = append(s.defaults, envoyDefault{Flag: flag, Env: env, Value: value, From: from})
	}

	// The policy folder: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, where the
	// reference's runtime loader finds its YAML files.
	if set("RUNTIME_ROOT") || set("RUNTIME_SUBDIRECTORY") {
		root := or(get("RUNTIME_ROOT"), envoyDefaultRuntimeRoot)
		add("config", "SLUICE_CONFIG", filepath.Join(root, get("RUNTIME_SUBDIRECTORY"), or(get("RUNTIME_APPDIRECTORY"), envoyDefaultAppDir)), "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY")
	}

	// Listeners: HOST:PORT for HTTP, GRPC_HOST:GRPC_PORT for gRPC (RLS and sluice.v1).
	for _, l := range []struct{ flag, env, host, port, def string }{
		{"http", "SLUICE_HTTP", "HOST", "PORT", envoyDefaultHTTPPort},
		{"grpc", "SLUICE_GRPC", "GRPC_HOST", "GRPC_PORT", envoyDefaultGRPCPort},
	} {
		if !set(l.host) && !set(l.port) {
			continue
		}
		port := or(get(l.port), l.def)
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return s, fmt.Errorf("%s: %q is not a port number", l.port, port)
		}
		add(l.flag, l.env, net.JoinHostPort(or(get(l.host), envoyDefaultHost), port), l.host+", "+l.port)
	}

	if set("REDIS_URL") {
		store, err := envoyRedisURL(get)
		if err != nil {
			return s, err
		}
		add("store", "SLUICE_STORE", store, "REDIS_URL, REDIS_SOCKET_TYPE, REDIS_TYPE, REDIS_AUTH, REDIS_TLS")
	}

	// StatsD: on when USE_STATSD=true, or when an address is given without USE_STATSD.
	useStatsD := set("STATSD_HOST") || set("STATSD_PORT")
	if set("USE_STATSD") {
		b, err := strconv.ParseBool(get("USE_STATSD"))
		if err != nil {
			return s, fmt.Errorf("USE_STATSD: %q is not true or false", get("USE_STATSD"))
		}
		useStatsD = b
	}
	if useStatsD {
		port := or(get("STATSD_PORT"), envoyDefaultStatsDPort)
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return s, fmt.Errorf("STATSD_PORT: %q is not a port number", port)
		}
		s.StatsD = net.JoinHostPort(or(get("STATSD_HOST"), envoyDefaultStatsDHost), port)
		add("statsd", "SLUICE_STATSD", s.StatsD, "USE_STATSD, STATSD_HOST, STATSD_PORT")
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
		b, err := strconv.ParseBool(get("SHADOW_MODE"))
		if err != nil {
			return s, fmt.Errorf("SHADOW_MODE: %q is not true or false", get("SHADOW_MODE"))
		}
		add("shadow", "SLUICE_SHADOW", strconv.FormatBool(b), "SHADOW_MODE")
	}

	// CONFIG_TYPE=GRPC_XDS_SOTW and its CONFIG_GRPC_XDS_* variables (envoy_xds.go).
	if err := readEnvoyXDS(&s, get); err != nil {
		return s, err
	}
	s.LimitHeader, s.RemainingHeader, s.ResetHeader = get("LIMIT_LIMIT_HEADER"), get("LIMIT_REMAINING_HEADER"), get("LIMIT_RESET_HEADER")
	return s, nil
}

// envoyRedisURL builds a --store URL from REDIS_SOCKET_TYPE, REDIS_TYPE, REDIS_URL,
// REDIS_AUTH and REDIS_TLS as the reference reads them.
func envoyRedisURL(get func(string) string) (string, error) {
	switch st := strings.ToLower(or(get("REDIS_SOCKET_TYPE"), "unix")); st {
	case "tcp":
	case "unix":
		// The reference's default, for a twemproxy socket in the pod.
		return "", fmt.Errorf("REDIS_SOCKET_TYPE: unix sockets are not supported; Sluice reaches Redis over TCP: set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port, or --store")
	default:
		return "", fmt.Errorf("REDIS_SOCKET_TYPE: %q is not tcp or unix", st)
	}
	u := url.URL{Scheme: "redis"}
	tlsOn := false
	if v := get("REDIS_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", fmt.Errorf("REDIS_TLS: %q is not true or false", v)
		}
		tlsOn = b
	}
	if auth := get("REDIS_AUTH"); auth != "" {
		// "password", or "user:password" for Redis 6 ACLs, as in the reference.
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", auth)
		}
	}
	addrs := get("REDIS_URL")
	switch typ := strings.ToUpper(or(get("REDIS_TYPE"), "SINGLE")); typ {
	case "SINGLE":
		u.Host = addrs
		if tlsOn {
			u.Scheme = "rediss"
		}
	case "SENTINEL":
		// The reference's form: the master's name, then the sentinels.
		master, sentinels, ok := strings.Cut(addrs, ",")
		if !ok || master == "" || sentinels == "" {
			return "", fmt.Errorf("REDIS_URL: with REDIS_TYPE=SENTINEL, want master,host:port[,host:port...]")
		}
		u.Scheme, u.Host, u.Path = "redis-sentinel", sentinels, "/"+master
	case "CLUSTER":
		u.Scheme, u.Host = "redis-cluster", addrs
	default:
		return "", fmt.Errorf("REDIS_TYPE: %q is not SINGLE, SENTINEL or CLUSTER", typ)
	}
	if tlsOn && u.Scheme != "rediss" {
		u.RawQuery = "tls=true"
	}
	if ca := get("REDIS_TLS_CACERT"); ca != "" && tlsOn {
		q := u.Query()
		q.Set("tls_ca_file", ca)
		u.RawQuery = q.Encode()
	}
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

// rlsOptions are the RLS server's options: LIMIT_RESPONSE_HEADERS_ENABLED and the header
// names of LIMIT_*_HEADER.
func rlsOptions(c Config) rls.Options {
	return rls.Options{
		ResponseHeaders: c.responseHeaders,
		LimitHeader:     c.envoy.LimitHeader,
		RemainingHeader: c.envoy.RemainingHeader,
		ResetHeader:     c.envoy.ResetHeader,
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
