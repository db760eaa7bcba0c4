package node

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// Config is everything a node is told: the flags of `sluice serve` and their environment
// variables (RegisterFlags, ReadEnv), validated once by New and passed down.
type Config struct {
	// Version is what the node reports as its build (`sluice version`).
	Version          string
	config           string
	httpAddr         string
	adminHTTP        string
	trustedProxies   string
	waitTimeout      time.Duration
	grpcAddr         string
	dataDir          string
	storeURL         string
	snapshotInterval time.Duration
	logLevel         string
	logFormat        string
	maxBody          int64
	responseHeaders  bool
	pprof            bool
	grpcReflection   bool
	grpcWorkers      int
	gcPercent        int
	memory           memoryFlags // --memory-limit (serve_memory.go)
	storeTimeout     time.Duration
	storeDeadline    storeDeadlineFlags // serve_storedeadline.go
	maxInFlight      int
	hotKeys          bool
	allowances       bool
	hotKeyThreshold  int
	hotKeyOverage    float64
	fleetSize        int
	control          string
	auditRetention   time.Duration
	countsRetention  time.Duration
	nodeID           string
	adminTokenFile   string
	tls              tlsFlags
	statsd           statsdFlags
	abuse            abuseFlags
	tracing          tracingFlags
	shadow           bool
	envoyAttributes  string        // --envoy-attributes (envoy_attributes.go)
	envoy            envoySettings // Envoy's reference service's variables (envoy_env.go)
	xds              xdsFlags      // --envoy-xds (envoy_xds.go)
	events           eventsConfig
	region           regionFlags // serve_region.go
}

// handshakeTimeout bounds a new gRPC connection's handshakes, as ReadHeaderTimeout bounds an
// HTTP request's headers.
const handshakeTimeout = 5 * time.Second

// maxGRPCWorkers bounds --grpc-workers: each worker is a goroutine started at once.
const maxGRPCWorkers = 1 << 16

// Help is the long help of `sluice serve`.
const Help = `Run the rate-limit service.

With no flags it runs on the embedded default: the memory store with snapshots under ./data,
the SQLite control store ./data/control.db, the built-in example policy (sluice config show),
HTTP on 127.0.0.1:8080 and gRPC on 127.0.0.1:8081. Every flag can also be set by the
environment variable named at the end of its help. The policy files reload on SIGHUP and
when they change; an invalid new policy is logged and the running one kept. Changes made in
the control store are compiled with the files and enforced within a second; while the
control store is down the node keeps enforcing the last policy it compiled.`

// RegisterFlags registers the node's flags on cmd (`sluice serve`), each with the environment
// variable named at the end of its help (read at once, or by ReadEnv for those in flagEnv),
// and groups them by concern in cmd's usage.
func (c *Config) RegisterFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.config, "config", EnvDefault("SLUICE_CONFIG", ""), "policy file or folder of YAML files, native or Envoy format, or etcd://host:2379[,host:2379]/prefix (etcd+https:// for TLS) whose keys are such files, watched; empty uses the built-in policy (SLUICE_CONFIG)")
	f.StringVar(&c.httpAddr, "http", EnvDefault("SLUICE_HTTP", "127.0.0.1:8080"), "HTTP listen address (SLUICE_HTTP)")
	f.StringVar(&c.adminHTTP, "admin-http", EnvDefault("SLUICE_ADMIN_HTTP", ""), "serve the admin API (/admin/v1) and the dashboard (/ui/) on this address, and not on --http, so that the data port can face callers while the admin port stays private; empty serves them on --http (SLUICE_ADMIN_HTTP)")
	f.DurationVar(&c.waitTimeout, "wait-timeout", durationEnv("SLUICE_WAIT_TIMEOUT", 5*time.Second), "how long an admin change with ?wait=fleet (or the header Sluice-Wait: fleet) waits for every live node to enforce it before answering 504 naming the nodes that lag; the change is stored either way (SLUICE_WAIT_TIMEOUT)")
	f.StringVar(&c.trustedProxies, "trusted-proxies", EnvDefault("SLUICE_TRUSTED_PROXIES", ""), "comma-separated addresses or CIDRs of the load balancers in front: the admin API's failed-authentication limit then keys on the client their X-Forwarded-For names; empty reads no forwarded header (SLUICE_TRUSTED_PROXIES)")
	f.StringVar(&c.grpcAddr, "grpc", EnvDefault("SLUICE_GRPC", "127.0.0.1:8081"), "gRPC listen address (SLUICE_GRPC)")
	f.StringVar(&c.dataDir, "data-dir", EnvDefault("SLUICE_DATA_DIR", "data"), "where the memory store keeps its snapshot and the sqlite control store its file (SLUICE_DATA_DIR)")
	f.StringVar(&c.control, "control", EnvDefault("SLUICE_CONTROL", controlSQLite), "control store of rules, overrides, exemptions, identities, tokens and audit: sqlite (<data-dir>/control.db, one node) or postgres://user:pass@host:5432/db (a fleet) (SLUICE_CONTROL)")
	c.auditRetention = retentionEnv("SLUICE_AUDIT_RETENTION", follower.DefaultAuditRetention)
	f.Var(durationFlag{&c.auditRetention}, "audit-retention", "how long audit events are kept, e.g. 365d (SLUICE_AUDIT_RETENTION)")
	c.countsRetention = retentionEnv("SLUICE_VIOLATIONS_RETENTION", follower.DefaultCountsRetention)
	f.Var(durationFlag{&c.countsRetention}, "violations-retention", "how long violation and usage counts are kept, e.g. 30d (SLUICE_VIOLATIONS_RETENTION)")
	f.StringVar(&c.adminTokenFile, "admin-token-file", EnvDefault("SLUICE_ADMIN_TOKEN_FILE", ""), "file holding the bootstrap admin token (named bootstrap); SLUICE_ADMIN_TOKEN wins when set; with neither, the first start writes a random one to <data-dir>/admin.token (SLUICE_ADMIN_TOKEN_FILE)")
	f.StringVar(&c.nodeID, "node-id", EnvDefault("SLUICE_NODE_ID", ""), "this node's id in the control store's node list; default hostname:http-port (SLUICE_NODE_ID)")
	f.StringVar(&c.storeURL, "store", EnvDefault("SLUICE_STORE", "memory"), "store: memory, or redis://[user:pass@]host:port/db, rediss://..., redis-sentinel://h1,h2/master, redis-cluster://h1,h2,... (SLUICE_STORE)")
	f.DurationVar(&c.snapshotInterval, "snapshot-interval", time.Second, "how often the memory store writes its snapshot (SLUICE_SNAPSHOT_INTERVAL)")
	f.StringVar(&c.logLevel, "log-level", EnvDefault("SLUICE_LOG_LEVEL", "info"), "debug, info, warn or error (SLUICE_LOG_LEVEL)")
	f.StringVar(&c.logFormat, "log-format", EnvDefault("SLUICE_LOG_FORMAT", "text"), "text or json (SLUICE_LOG_FORMAT)")
	f.Int64Var(&c.maxBody, "max-body", httpapi.DefaultMaxBody, "largest HTTP request body in bytes (SLUICE_MAX_BODY)")
	f.DurationVar(&c.storeTimeout, "store-timeout", durationEnv("SLUICE_STORE_TIMEOUT", 10*time.Millisecond), "deadline of each call to a shared store; past it, and while the circuit breaker is open, rules follow on_store_error (SLUICE_STORE_TIMEOUT)")
	f.IntVar(&c.maxInFlight, "max-inflight", intEnv("SLUICE_MAX_INFLIGHT", 4096), "requests decided at once; more are refused at once with 503 / RESOURCE_EXHAUSTED (SLUICE_MAX_INFLIGHT)")
	f.BoolVar(&c.hotKeys, "hot-keys", os.Getenv("SLUICE_HOT_KEYS") == "true", "with a shared store, decide each node's hottest keys locally and write their hits back every 50 ms (SLUICE_HOT_KEYS=true)")
	f.BoolVar(&c.allowances, "allowances", os.Getenv("SLUICE_ALLOWANCES") == "true", "with a shared store, let each node hold a little of each fixed window far from its limit (1/32, at most 4096) and decide that key's next requests without a round trip; never admits past a limit, while other nodes may find under two grants per node counted but unspent, for up to 100 ms after that node's last use of the key (SLUICE_ALLOWANCES=true)")
	f.IntVar(&c.hotKeyThreshold, "hot-key-threshold", intEnv("SLUICE_HOT_KEY_THRESHOLD", 500), "requests per second on one node that make a key hot; a hot key below half of it goes back to the store (SLUICE_HOT_KEY_THRESHOLD)")
	f.Float64Var(&c.hotKeyOverage, "hot-key-overage", 0.05, "share of a limit the fleet may admit beyond it on hot keys (SLUICE_HOT_KEY_OVERAGE)")
	f.IntVar(&c.fleetSize, "fleet-size", intEnv("SLUICE_FLEET_SIZE", 1), "expected number of Sluice nodes sharing the store: splits the hot-key overage and, while the store is down, the limits of on_store_error: local rules (SLUICE_FLEET_SIZE)")
	f.IntVar(&c.grpcWorkers, "grpc-workers", 64, "gRPC stream workers: calls beyond them in flight start a goroutine each (SLUICE_GRPC_WORKERS)")
	f.IntVar(&c.gcPercent, "gc-percent", 0, "Go GC target percentage; 0 = auto: 400 under a memory limit, else following the live heap from 400 down to 100; GOGC wins when set (SLUICE_GC_PERCENT)")
	c.memory.register(f)
	c.tls.register(cmd)
	c.statsd.register(f)
	c.storeDeadline.register(f)
	c.tracing.register(f)
	addAbuseFlags(f, &c.abuse)
	eventFlags(f, &c.events)
	f.BoolVar(&c.grpcReflection, "grpc-reflection", EnvDefault("SLUICE_GRPC_REFLECTION", "true") != "false", "serve gRPC server reflection, which lets grpcurl and other tools list and call the services without their .proto files; false hides the services' shape from callers (SLUICE_GRPC_REFLECTION)")
	f.BoolVar(&c.pprof, "pprof", false, "serve Go profiling at /debug/pprof/ on the HTTP address (do not expose publicly) (SLUICE_PPROF=true)")
	envoyFlags(f, c)
	c.registerEnvoyAttributes(f)
	c.xds.register(f)
	c.region.register(f)
	cmd.SetUsageFunc(groupedUsage)
}

// ReadEnv reads, once the flags are parsed, the settings that only the environment gives:
// LIMIT_RESPONSE_HEADERS_ENABLED, the variables of the flags in flagEnv, the seeds' ABUSE_*
// variables and the variables of Envoy's reference service, which flags given on the command
// line win over.
func (c *Config) ReadEnv(flags *pflag.FlagSet) error {
	c.responseHeaders = os.Getenv("LIMIT_RESPONSE_HEADERS_ENABLED") == "true"
	if err := applyFlagEnv(flags); err != nil {
		return err
	}
	if err := applyAbuseEnv(flags); err != nil {
		return err
	}
	return c.readEnvoy(flags)
}

func newLogger(c Config) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", c.logFormat)
}

// parsePrefixes reads a comma-separated list of addresses and CIDRs (an address is its own
// /32 or /128).
func parsePrefixes(flag, list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an address or a CIDR", flag, f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// isMemory tells whether --store names the memory store.
func isMemory(storeURL string) bool { return storeURL == "memory" || storeURL == "" }

// intEnv reads an integer from the environment, or def.
func intEnv(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// durationEnv reads a duration from the environment, or def.
func durationEnv(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func orBuiltIn(path string) string {
	if path == "" {
		return "built-in"
	}
	return path
}

// EnvDefault returns the environment variable's value, or def: every flag can also be set by
// environment, for containers.
func EnvDefault(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}
