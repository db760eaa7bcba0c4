package node

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// env is a lookup over a fixed set of variables.
func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestReadEnvoyEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vars map[string]string
		want map[string]string // flag → value
		err  string
		s    envoySettings // the fields other than defaults
	}{
		{name: "nothing set", vars: nil, want: map[string]string{}},
		{name: "runtime folder", vars: map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"},
			want: map[string]string{"config": "/data/ratelimit/config"}},
		{name: "runtime subdirectory on the reference's root", vars: map[string]string{"RUNTIME_SUBDIRECTORY": "rl"},
			want: map[string]string{"config": "/srv/runtime_data/current/rl/config"}},
		{name: "runtime app directory", vars: map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "limits"},
			want: map[string]string{"config": "/data/rl/limits"}},
		{name: "ports on every interface", vars: map[string]string{"PORT": "9080", "GRPC_PORT": "9081"},
			want: map[string]string{"http": "0.0.0.0:9080", "grpc": "0.0.0.0:9081"}},
		{name: "hosts and default ports", vars: map[string]string{"HOST": "127.0.0.1", "GRPC_HOST": "::1"},
			want: map[string]string{"http": "127.0.0.1:8080", "grpc": "[::1]:8081"}},
		{name: "bad port", vars: map[string]string{"GRPC_PORT": "grpc"}, err: `GRPC_PORT: "grpc" is not a port number`},
		{name: "redis single over tcp", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"},
			want: map[string]string{"store": "redis://redis:6379"}},
		{name: "redis auth and tls", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "p@ss/word", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem"},
			want: map[string]string{"store": "rediss://:p%40ss%2Fword@redis:6379?tls_ca_file=%2Fca.pem"}},
		{name: "redis acl user", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "rl:secret"},
			want: map[string]string{"store": "redis://rl:secret@r:6379"}},
		{name: "redis sentinel", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			want: map[string]string{"store": "redis-sentinel://s1:26379,s2:26379/mymaster?sentinel_auth="}},
		{name: "redis cluster with tls", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "c1:6379,c2:6379", "REDIS_TLS": "true"},
			want: map[string]string{"store": "redis-cluster://c1:6379,c2:6379?tls=true"}},
		{name: "redis unix socket", vars: map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}, err: "REDIS_SOCKET_TYPE: unix sockets are not supported"},
		{name: "redis bad type", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TYPE": "ring"}, err: `REDIS_TYPE: "RING"`},
		{name: "redis bad tls", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "yes please"}, err: "REDIS_TLS"},
		{name: "sentinel without sentinels", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "mymaster", "REDIS_TYPE": "SENTINEL"}, err: "REDIS_URL: with REDIS_TYPE=SENTINEL"},
		{name: "redis settings without REDIS_URL keep memory", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_AUTH": "x"}, want: map[string]string{}},
		{name: "statsd on with the reference's address", vars: map[string]string{"USE_STATSD": "true"},
			want: map[string]string{"statsd": "localhost:8125"}, s: envoySettings{StatsD: "localhost:8125"}},
		{name: "statsd address implies on", vars: map[string]string{"STATSD_HOST": "statsd", "STATSD_PORT": "9125"},
			want: map[string]string{"statsd": "statsd:9125"}, s: envoySettings{StatsD: "statsd:9125"}},
		{name: "statsd off wins over an address", vars: map[string]string{"USE_STATSD": "false", "STATSD_HOST": "statsd"}, want: map[string]string{}},
		{name: "statsd bad port", vars: map[string]string{"USE_STATSD": "true", "STATSD_PORT": "0"}, err: "STATSD_PORT"},
		{name: "statsd bad switch", vars: map[string]string{"USE_STATSD": "on"}, err: `USE_STATSD: "on"`},
		{name: "log level in the reference's case", vars: map[string]string{"LOG_LEVEL": "WARN", "LOG_FORMAT": "JSON"},
			want: map[string]string{"log-level": "warn", "log-format": "json"}},
		{name: "logrus levels", vars: map[string]string{"LOG_LEVEL": "trace"}, want: map[string]string{"log-level": "debug"}},
		{name: "bad log level", vars: map[string]string{"LOG_LEVEL": "loud"}, err: `LOG_LEVEL: "loud"`},
		{name: "shadow mode", vars: map[string]string{"SHADOW_MODE": "true"}, want: map[string]string{"shadow": "true"}},
		{name: "shadow mode off", vars: map[string]string{"SHADOW_MODE": "false"}, want: map[string]string{"shadow": "false"}},
		{name: "bad shadow mode", vars: map[string]string{"SHADOW_MODE": "maybe"}, err: "SHADOW_MODE"},
		{name: "header names", vars: map[string]string{"LIMIT_LIMIT_HEADER": "X-Limit", "LIMIT_REMAINING_HEADER": "X-Left", "LIMIT_RESET_HEADER": "X-Reset"},
			want: map[string]string{}, s: envoySettings{LimitHeader: "X-Limit", RemainingHeader: "X-Left", ResetHeader: "X-Reset"}},
		{name: "blank values are unset", vars: map[string]string{"PORT": " ", "LOG_LEVEL": ""}, want: map[string]string{}},
		{name: "redis tls files, skipped hostname, pipeline window and timeout", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true",
			"REDIS_TLS_CLIENT_CERT": "/c.pem", "REDIS_TLS_CLIENT_KEY": "/c.key", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true", "REDIS_PIPELINE_WINDOW": "150us", "REDIS_TIMEOUT": "2s"},
			want: map[string]string{"store": "rediss://r:6379?dial_timeout=2s&max_flush_delay=150%C2%B5s&tls_cert_file=%2Fc.pem&tls_key_file=%2Fc.key&tls_skip_hostname_verification=true&write_timeout=2s"}},
		{name: "redis client cert without key", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/c.pem"}, err: "REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY"},
		{name: "sentinel auth", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "m,s1:26379", "REDIS_AUTH": "pw", "REDIS_SENTINEL_AUTH": "spw"},
			want: map[string]string{"store": "redis-sentinel://:pw@s1:26379/m?sentinel_auth=spw"}},
		{name: "per-second redis", vars: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "r2:6379", "REDIS_PERSECOND_AUTH": "x"},
			want: map[string]string{"store": "redis://r:6379"}, s: envoySettings{PerSecondStore: "redis://:x@r2:6379"}},
		{name: "per-second redis on the reference's unix socket", vars: map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "/var/run/nutcracker/ratelimitpersecond.sock"}, err: "REDIS_PERSECOND_SOCKET_TYPE: unix sockets are not supported"},
		{name: "per-second redis without its url", vars: map[string]string{"REDIS_PERSECOND": "true"}, err: "REDIS_PERSECOND_URL"},
		{name: "per-second settings without the switch are noted", vars: map[string]string{"REDIS_PERSECOND_URL": "r2:6379"}, want: map[string]string{},
			s: envoySettings{Notes: []envoyNote{{"REDIS_PERSECOND_URL", "ignored without REDIS_PERSECOND=true, as by the reference"}}}},
		{name: "cache key prefix", vars: map[string]string{"CACHE_KEY_PREFIX": "team_"}, want: map[string]string{}, s: envoySettings{KeyPrefix: "team_"}},
		{name: "cache key prefix with braces", vars: map[string]string{"CACHE_KEY_PREFIX": "{x}"}, err: "CACHE_KEY_PREFIX"},
		{name: "merge domains", vars: map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, want: map[string]string{}, s: envoySettings{MergeDomains: true}},
		{name: "backend redis", vars: map[string]string{"BACKEND_TYPE": "redis"}, want: map[string]string{}},
		{name: "backend memcache", vars: map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "mc:11211"}, err: "BACKEND_TYPE=memcache: Sluice has no memcached backend"},
		{name: "backend unknown", vars: map[string]string{"BACKEND_TYPE": "dynamo"}, err: `BACKEND_TYPE: "dynamo"`},
		{name: "memcache settings with redis are noted", vars: map[string]string{"MEMCACHE_HOST_PORT": "mc:11211"}, want: map[string]string{},
			s: envoySettings{Notes: []envoyNote{{"MEMCACHE_HOST_PORT", "ignored with the Redis backend, as by the reference"}}}},
		{name: "grpc tls", vars: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/s.pem", "GRPC_SERVER_TLS_KEY": "/s.key", "GRPC_CLIENT_TLS_CACERT": "/ca.pem", "GRPC_CLIENT_TLS_SAN": "envoy"},
			want: map[string]string{}, s: envoySettings{GRPCTLS: envoyGRPCTLS{Cert: "/s.pem", Key: "/s.key", ClientCA: "/ca.pem", ClientSAN: "envoy"}}},
		{name: "grpc tls without its key", vars: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/s.pem"}, err: "GRPC_SERVER_TLS_KEY: needed"},
		{name: "grpc tls files with tls off", vars: map[string]string{"GRPC_SERVER_TLS_CERT": "/s.pem", "GRPC_SERVER_TLS_KEY": "/s.key"}, err: "GRPC_SERVER_TLS_CERT: set without GRPC_SERVER_USE_TLS=true"},
		{name: "grpc client san without a ca", vars: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/s.pem", "GRPC_SERVER_TLS_KEY": "/s.key", "GRPC_CLIENT_TLS_SAN": "envoy"}, err: "GRPC_CLIENT_TLS_SAN: needs GRPC_CLIENT_TLS_CACERT"},
		{name: "grpc connection age", vars: map[string]string{"GRPC_MAX_CONNECTION_AGE": "1h", "GRPC_MAX_CONNECTION_AGE_GRACE": "5m"}, want: map[string]string{}, s: envoySettings{MaxConnectionAge: time.Hour, MaxConnectionAgeGrace: 5 * time.Minute}},
		{name: "bad grpc connection age", vars: map[string]string{"GRPC_MAX_CONNECTION_AGE": "a day"}, err: "GRPC_MAX_CONNECTION_AGE:"},
		{name: "debug port", vars: map[string]string{"DEBUG_PORT": "6071"}, want: map[string]string{}, s: envoySettings{DebugAddr: "0.0.0.0:6071"}},
		{name: "prometheus", vars: map[string]string{"USE_PROMETHEUS": "true"}, want: map[string]string{}, s: envoySettings{PrometheusAddr: ":9090", PrometheusPath: "/metrics"}},
		{name: "prometheus bad path", vars: map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "metrics"}, err: "PROMETHEUS_PATH"},
		{name: "dogstatsd", vars: map[string]string{"USE_STATSD": "true", "USE_DOG_STATSD": "true"}, want: map[string]string{"statsd": "localhost:8125", "statsd-tags": "dogstatsd"}, s: envoySettings{StatsD: "localhost:8125"}},
		{name: "stats disabled", vars: map[string]string{"USE_STATSD": "true", "DISABLE_STATS": "true"}, want: map[string]string{},
			s: envoySettings{Notes: []envoyNote{{"DISABLE_STATS", "StatsD is off, as there; Sluice's Prometheus metrics are still served on --http at /metrics"}}}},
		{name: "tracing over grpc", vars: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "grpc", "TRACING_SAMPLING_RATE": "0.5"},
			want: map[string]string{"otlp-endpoint": "localhost:4317", "trace-sample-ratio": "0.5"}},
		{name: "tracing to the standard endpoint", vars: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "GRPC", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317"},
			want: map[string]string{"trace-sample-ratio": "1"}},
		{name: "tracing over http", vars: map[string]string{"TRACING_ENABLED": "true"}, err: "TRACING_EXPORTER_PROTOCOL: http (the reference's default)"},
		{name: "tracing bad rate", vars: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "grpc", "TRACING_SAMPLING_RATE": "2"}, err: "TRACING_SAMPLING_RATE"},
		{name: "grpc on a unix socket", vars: map[string]string{"GRPC_UDS": "/tmp/rl.sock"}, err: "GRPC_UDS=/tmp/rl.sock: gRPC on a unix socket is not supported"},
		{name: "quota mode", vars: map[string]string{"QUOTA_MODE": "true"}, want: map[string]string{}, s: envoySettings{QuotaMode: true}},
		{name: "bad quota mode", vars: map[string]string{"QUOTA_MODE": "all"}, err: `QUOTA_MODE: "all"`},
		{name: "dynamic metadata", vars: map[string]string{"RESPONSE_DYNAMIC_METADATA": "true"}, want: map[string]string{}, s: envoySettings{DynamicMetadata: true}},
		{name: "dot files read", vars: map[string]string{"RUNTIME_IGNOREDOTFILES": "false"}, err: "RUNTIME_IGNOREDOTFILES=false"},
		{name: "dot files ignored", vars: map[string]string{"RUNTIME_IGNOREDOTFILES": "true"}, want: map[string]string{}},
		{name: "bad switch", vars: map[string]string{"RUNTIME_IGNOREDOTFILES": "sometimes"}, err: `RUNTIME_IGNOREDOTFILES: "sometimes" is not true or false`},
		{name: "pool on empty create", vars: map[string]string{"REDIS_POOL_ON_EMPTY_BEHAVIOR": "create"}, err: "REDIS_POOL_ON_EMPTY_BEHAVIOR=create"},
		{name: "tuning knobs are noted", vars: map[string]string{"NEAR_LIMIT_RATIO": "0.9", "REDIS_POOL_SIZE": "20"}, want: map[string]string{},
			s: envoySettings{Notes: []envoyNote{
				{"NEAR_LIMIT_RATIO", "it sets only the reference's near_limit statistic, which Sluice counts at the default 0.8; Sluice's warning threshold is each rule's soft: percentage"},
				{"REDIS_POOL_SIZE", "Sluice pipelines calls over one connection per Redis node (the --store URL's pipeline_multiplex spreads them)"},
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := readEnvoyEnv(env(tc.vars))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, d := range s.defaults {
				got[d.Flag] = d.Value
			}
			if len(got) != len(tc.want) {
				t.Fatalf("flags %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("--%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			s.defaults = nil
			if !reflect.DeepEqual(s, tc.s) {
				t.Fatalf("settings %+v, want %+v", s, tc.s)
			}
		})
	}
}

// TestEnvoyEnvPrecedence: a flag on the command line and a SLUICE_* variable win over the
// reference's variables; the other flags take them.
func TestEnvoyEnvPrecedence(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"PORT": "9080", "GRPC_PORT": "9081", "LOG_LEVEL": "debug", "SHADOW_MODE": "true", "SLUICE_LOG_LEVEL": "error"}
	s, err := readEnvoyEnv(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	cmd := &cobra.Command{Use: "serve"}
	var c Config
	c.RegisterFlags(cmd)
	if err := cmd.Flags().Parse([]string{"--http", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnvoyEnv(cmd.Flags(), s, env(vars)); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"http":      "127.0.0.1:1",  // the flag given
		"grpc":      "0.0.0.0:9081", // GRPC_PORT
		"log-level": "info",         // SLUICE_LOG_LEVEL is set (here only in vars): the reference's LOG_LEVEL is not applied
		"shadow":    "true",         // SHADOW_MODE
		"statsd":    "",             // not a flag of this build, or unset
	} {
		f := cmd.Flags().Lookup(flag)
		if f == nil {
			if want != "" {
				t.Fatalf("no flag --%s", flag)
			}
			continue
		}
		if f.Value.String() != want {
			t.Errorf("--%s = %q, want %q", flag, f.Value.String(), want)
		}
	}
}

// referenceVars are the variables envoyproxy/ratelimit's src/settings/settings.go reads (at
// f2fb157, July 2026), copied by hand: each must be mapped, refused or noted, or left to the
// xDS work. A variable the reference adds later fails this test once added here.
var referenceVars = []string{
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT",
	"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_SERVER_USE_TLS",
	"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL", "LOG_FORMAT", "CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG",
	"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
	"XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS",
	"STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH",
	"PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT",
	"EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "CACHE_KEY_PREFIX",
	"BACKEND_TYPE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
	"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_SENTINEL_AUTH",
	"REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_TIMEOUT",
	"REDIS_PERSECOND_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME",
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "MERGE_DOMAIN_CONFIG",
	"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
	"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
}

// TestEveryReferenceVariableIsHandled: nothing of the reference's environment is silently
// ignored. Each variable is known to envoy_env.go (mapped, refused or noted, or the xDS
// work's), and each of envoyOther, set to a value it refuses, stops the start with an error
// that names it.
func TestEveryReferenceVariableIsHandled(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	for _, v := range slices.Concat(envoyMapped, envoyXDS, envoyMemcache) {
		known[v] = true
	}
	for _, o := range envoyOther {
		if known[o.Var] {
			t.Errorf("%s is both mapped and in envoyOther", o.Var)
		}
		known[o.Var] = true
	}
	for _, v := range referenceVars {
		if !known[v] {
			t.Errorf("%s: the reference reads it; map it, refuse it or note it", v)
		}
	}
	for _, o := range envoyOther {
		value := map[refuse]string{refuseSet: "x", refuseTrue: "true", refuseFalse: "false", refuseNever: "7"}[o.Refuse]
		if strings.HasSuffix(o.Var, "POOL_ON_EMPTY_BEHAVIOR") {
			value = "WAIT" // its other values are refused by the test above
		}
		_, err := readEnvoyEnv(env(map[string]string{o.Var: value}))
		if o.Refuse == refuseNever {
			if err != nil {
				t.Errorf("%s=%s: %v; want it accepted with a note", o.Var, value, err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), o.Var+"=") {
			t.Errorf("%s=%s: err = %v; want an error naming it", o.Var, value, err)
		}
	}
}
