package node

import (
	"github.com/spf13/cobra"
	"strings"
	"testing"
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
			if s.StatsD != tc.s.StatsD || s.LimitHeader != tc.s.LimitHeader || s.RemainingHeader != tc.s.RemainingHeader || s.ResetHeader != tc.s.ResetHeader {
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
