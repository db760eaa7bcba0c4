package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

// xdsFlags are serve's settings for taking the Envoy domains from an xDS server (--envoy-xds),
// as Envoy's reference service does with CONFIG_TYPE=GRPC_XDS_SOTW, whose variables set them
// (readEnvoyXDS).
type xdsFlags struct {
	server     string
	nodeID     string
	metadata   string
	retry      time.Duration
	retryMax   time.Duration
	tls        bool
	ca         string
	cert       string
	key        string
	san        string
	forceStart bool
	headers    string
	maxMessage int
}

// The reference's defaults for its CONFIG_GRPC_XDS_* variables.
const (
	envoyDefaultXDSServer = "localhost:18000"
	envoyDefaultXDSNodeID = "default"
)

// The xDS flags registered with a plain default join flagEnv here, so that a bad value in
// their variables stops serve naming it.
func init() {
	for flag, env := range map[string]string{
		"envoy-xds-retry":       "SLUICE_ENVOY_XDS_RETRY",
		"envoy-xds-retry-max":   "SLUICE_ENVOY_XDS_RETRY_MAX",
		"envoy-xds-max-message": "SLUICE_ENVOY_XDS_MAX_MESSAGE",
	} {
		flagEnv[flag] = env
	}
}

func (x *xdsFlags) register(f *pflag.FlagSet) {
	f.StringVar(&x.server, "envoy-xds", EnvDefault("SLUICE_ENVOY_XDS", ""), "take the Envoy domains from this xDS server (host:port), as CONFIG_TYPE=GRPC_XDS_SOTW of Envoy's reference service: resources of type RateLimitConfig over ADS, instead of --config; the last configuration stays while the server is away (SLUICE_ENVOY_XDS)")
	f.StringVar(&x.nodeID, "envoy-xds-node-id", EnvDefault("SLUICE_ENVOY_XDS_NODE_ID", envoyDefaultXDSNodeID), "node id announced to the xDS server, which picks the snapshot by it (SLUICE_ENVOY_XDS_NODE_ID)")
	f.StringVar(&x.metadata, "envoy-xds-node-metadata", EnvDefault("SLUICE_ENVOY_XDS_NODE_METADATA", ""), "node metadata announced to the xDS server: key=value[,key=value...] (key:value also) (SLUICE_ENVOY_XDS_NODE_METADATA)")
	f.DurationVar(&x.retry, "envoy-xds-retry", xds.DefaultRetryInterval, "wait between attempts to reach the xDS server, plus up to half of it at random (SLUICE_ENVOY_XDS_RETRY)")
	f.DurationVar(&x.retryMax, "envoy-xds-retry-max", 0, "when above --envoy-xds-retry, the wait doubles at each failed attempt in a row up to it; 0 keeps it at --envoy-xds-retry (SLUICE_ENVOY_XDS_RETRY_MAX)")
	f.BoolVar(&x.tls, "envoy-xds-tls", os.Getenv("SLUICE_ENVOY_XDS_TLS") == "true", "reach the xDS server over TLS, verified against the system's roots or --envoy-xds-ca (SLUICE_ENVOY_XDS_TLS=true)")
	f.StringVar(&x.ca, "envoy-xds-ca", EnvDefault("SLUICE_ENVOY_XDS_CA", ""), "PEM CA bundle that signs the xDS server's certificate, with --envoy-xds-tls (SLUICE_ENVOY_XDS_CA)")
	f.StringVar(&x.cert, "envoy-xds-cert", EnvDefault("SLUICE_ENVOY_XDS_CERT", ""), "PEM client certificate presented to the xDS server, with --envoy-xds-key and --envoy-xds-tls (SLUICE_ENVOY_XDS_CERT)")
	f.StringVar(&x.key, "envoy-xds-key", EnvDefault("SLUICE_ENVOY_XDS_KEY", ""), "PEM private key of --envoy-xds-cert (SLUICE_ENVOY_XDS_KEY)")
	f.StringVar(&x.san, "envoy-xds-san", EnvDefault("SLUICE_ENVOY_XDS_SAN", ""), "name the xDS server's certificate must carry, when it is not the host of --envoy-xds (SLUICE_ENVOY_XDS_SAN)")
	f.StringVar(&x.headers, "envoy-xds-headers", EnvDefault("SLUICE_ENVOY_XDS_HEADERS", ""), "gRPC metadata sent to the xDS server on the stream, such as a token: key=value[,key=value...] (key:value also) (SLUICE_ENVOY_XDS_HEADERS)")
	f.IntVar(&x.maxMessage, "envoy-xds-max-message", 0, "largest response taken from the xDS server, in bytes; 0 is gRPC's 4 MiB (SLUICE_ENVOY_XDS_MAX_MESSAGE)")
	f.BoolVar(&x.forceStart, "envoy-xds-force-start", os.Getenv("SLUICE_ENVOY_XDS_FORCE_START") == "true", "start serving before the xDS server sent a configuration, with no Envoy domains until it does; without it serve waits for the first one (SLUICE_ENVOY_XDS_FORCE_START=true)")
}

// readEnvoyXDS reads CONFIG_TYPE and, for GRPC_XDS_SOTW, the reference's CONFIG_GRPC_XDS_*
// variables into serve flags. The configuration then comes from the xDS server alone, as in
// the reference, so the policy folder of RUNTIME_ROOT is dropped. Other xDS variables are read
// only with CONFIG_TYPE=GRPC_XDS_SOTW, as there.
func readEnvoyXDS(s *envoySettings, get func(string) string) error {
	switch t := strings.ToUpper(get("CONFIG_TYPE")); t {
	case "", "FILE":
		return nil
	case "GRPC_XDS_SOTW":
	default:
		return fmt.Errorf("CONFIG_TYPE: %q is not FILE or GRPC_XDS_SOTW", get("CONFIG_TYPE"))
	}
	kept := s.defaults[:0]
	for _, d := range s.defaults {
		if d.Flag != "config" {
			kept = append(kept, d)
		}
	}
	s.defaults = kept
	add := func(flag, env, value, from string) {
		s.defaults = append(s.defaults, envoyDefault{Flag: flag, Env: env, Value: value, From: from})
	}
	add("envoy-xds", "SLUICE_ENVOY_XDS", or(get("CONFIG_GRPC_XDS_SERVER_URL"), envoyDefaultXDSServer), "CONFIG_TYPE, CONFIG_GRPC_XDS_SERVER_URL")
	if v := get("CONFIG_GRPC_XDS_NODE_ID"); v != "" {
		add("envoy-xds-node-id", "SLUICE_ENVOY_XDS_NODE_ID", v, "CONFIG_GRPC_XDS_NODE_ID")
	}
	for _, kv := range []struct{ env, flag, sluice string }{
		{"CONFIG_GRPC_XDS_NODE_METADATA", "envoy-xds-node-metadata", "SLUICE_ENVOY_XDS_NODE_METADATA"},
		{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "envoy-xds-headers", "SLUICE_ENVOY_XDS_HEADERS"},
	} {
		if v := get(kv.env); v != "" {
			if _, err := parseKeyValues(v); err != nil {
				return fmt.Errorf("%s: %w", kv.env, err)
			}
			add(kv.flag, kv.sluice, v, kv.env)
		}
	}
	if v := get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			return fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: %q is not a number of bytes", v)
		}
		add("envoy-xds-max-message", "SLUICE_ENVOY_XDS_MAX_MESSAGE", v, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	}
	if v := get("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"); v != "" {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			return fmt.Errorf("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL: %q is not a positive duration such as 3s", v)
		}
		add("envoy-xds-retry", "SLUICE_ENVOY_XDS_RETRY", v, "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")
	}
	// The reference's later backoff settings: the first wait unless
	// CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL gives it, and the longest.
	for _, d := range []struct{ env, flag, sluice string }{
		{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "envoy-xds-retry", "SLUICE_ENVOY_XDS_RETRY"},
		{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "envoy-xds-retry-max", "SLUICE_ENVOY_XDS_RETRY_MAX"},
	} {
		v := get(d.env)
		if v == "" || (d.flag == "envoy-xds-retry" && get("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL") != "") {
			continue
		}
		if t, err := time.ParseDuration(v); err != nil || t <= 0 {
			return fmt.Errorf("%s: %q is not a positive duration such as 10s", d.env, v)
		}
		add(d.flag, d.sluice, v, d.env)
	}
	// Sluice adds up to half of each wait at random: the reference's default jitter.
	if v := get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR"); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f != 0.5 {
			return fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR: %q: only 0.5 is supported (Sluice adds up to half of each wait at random); leave it unset", v)
		}
	}
	if v := get("XDS_CLIENT_BACKOFF_JITTER"); v != "" {
		if on, err := strconv.ParseBool(v); err != nil || !on {
			return fmt.Errorf("XDS_CLIENT_BACKOFF_JITTER: %q: only true is supported (Sluice always adds jitter); leave it unset", v)
		}
	}
	for _, b := range []struct{ env, flag, sluice string }{
		{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "envoy-xds-tls", "SLUICE_ENVOY_XDS_TLS"},
		{"FORCE_START_WITHOUT_INITIAL_CONFIG", "envoy-xds-force-start", "SLUICE_ENVOY_XDS_FORCE_START"},
	} {
		if v := get(b.env); v != "" {
			on, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%s: %q is not true or false", b.env, v)
			}
			add(b.flag, b.sluice, strconv.FormatBool(on), b.env)
		}
	}
	for _, p := range []struct{ env, flag, sluice string }{
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "envoy-xds-ca", "SLUICE_ENVOY_XDS_CA"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "envoy-xds-cert", "SLUICE_ENVOY_XDS_CERT"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "envoy-xds-key", "SLUICE_ENVOY_XDS_KEY"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-xds-san", "SLUICE_ENVOY_XDS_SAN"},
	} {
		if v := get(p.env); v != "" {
			add(p.flag, p.sluice, v, p.env)
		}
	}
	return nil
}

// parseKeyValues reads key=value pairs separated by commas; key:value is taken too, the form
// the reference's variables use.
func parseKeyValues(v string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(v, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		i := strings.IndexAny(pair, "=:")
		if i <= 0 {
			return nil, fmt.Errorf("%q is not key=value", pair)
		}
		out[strings.TrimSpace(pair[:i])] = strings.TrimSpace(pair[i+1:])
	}
	return out, nil
}

// tlsConfig is the client TLS towards the xDS server, or nil without --envoy-xds-tls.
func (x xdsFlags) tlsConfig() (*tls.Config, error) {
	if !x.tls {
		for _, f := range []struct{ name, v string }{{"--envoy-xds-ca", x.ca}, {"--envoy-xds-cert", x.cert}, {"--envoy-xds-key", x.key}, {"--envoy-xds-san", x.san}} {
			if f.v != "" {
				return nil, fmt.Errorf("%s: needs --envoy-xds-tls", f.name)
			}
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.san}
	if x.ca != "" {
		pem, err := os.ReadFile(x.ca)
		if err != nil {
			return nil, fmt.Errorf("--envoy-xds-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--envoy-xds-ca: %s holds no PEM certificate", x.ca)
		}
	}
	if (x.cert == "") != (x.key == "") {
		return nil, errors.New("--envoy-xds-cert: needs --envoy-xds-key, and the other way round")
	}
	if x.cert != "" {
		pair, err := tls.LoadX509KeyPair(x.cert, x.key)
		if err != nil {
			return nil, fmt.Errorf("--envoy-xds-cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// openPolicySource opens the policy of --config, or the xDS source of --envoy-xds.
func openPolicySource(ctx context.Context, c Config, log *slog.Logger) (*policySource, error) {
	if c.xds.server == "" {
		return openPolicy(ctx, c.config, log)
	}
	if c.config != "" {
		return nil, errors.New("--envoy-xds: the configuration comes from the xDS server; leave --config empty (as CONFIG_TYPE=GRPC_XDS_SOTW reads no files)")
	}
	return openXDSPolicy(ctx, c.xds, log)
}

// xdsPolicy is the policy an xDS server gives: the documents of its last accepted response.
// Each response is parsed as policy files are; until the runtime exists (New) the last one is
// kept for it, afterwards it is handed to the runtime, whose refusal NACKs it too.
type xdsPolicy struct {
	name   string
	log    *slog.Logger
	client *xds.Client

	mu     sync.Mutex
	files  *policy.Files     // the last accepted policy
	rt     *follower.Runtime // nil until watch attaches it, and after it returns
	m      *metrics.Metrics
	first  chan struct{} // closed at the first accepted response
	gotOne bool
}

// openXDSPolicy starts the xDS client and, unless --envoy-xds-force-start, waits for the
// server's first valid configuration, as the reference does.
func openXDSPolicy(ctx context.Context, x xdsFlags, log *slog.Logger) (*policySource, error) {
	md, err := parseKeyValues(x.metadata)
	if err != nil {
		return nil, fmt.Errorf("--envoy-xds-node-metadata: %w", err)
	}
	headers, err := parseKeyValues(x.headers)
	if err != nil {
		return nil, fmt.Errorf("--envoy-xds-headers: %w", err)
	}
	if x.maxMessage < 0 {
		return nil, fmt.Errorf("--envoy-xds-max-message: %d is negative", x.maxMessage)
	}
	if x.retry <= 0 {
		return nil, fmt.Errorf("--envoy-xds-retry: %v is not positive", x.retry)
	}
	if x.retryMax < 0 {
		return nil, fmt.Errorf("--envoy-xds-retry-max: %v is negative", x.retryMax)
	}
	tlsCfg, err := x.tlsConfig()
	if err != nil {
		return nil, err
	}
	p := &xdsPolicy{name: "xds:" + x.server, log: log, first: make(chan struct{})}
	p.client, err = xds.New(xds.Options{
		Server: x.server, NodeID: x.nodeID, NodeMetadata: md, Headers: headers,
		RetryInterval: x.retry, MaxRetryInterval: x.retryMax, TLS: tlsCfg, MaxMessageBytes: x.maxMessage,
		Apply: p.apply, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("--envoy-xds: %w", err)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan struct{})
	go func() { defer close(ran); p.client.Run(runCtx) }()
	closeClient := func() error { stop(); <-ran; return p.client.Close() }

	if x.forceStart {
		empty, err := policy.ParseFiles(nil)
		if err != nil {
			closeClient()
			return nil, err
		}
		p.mu.Lock()
		if p.files == nil {
			// Served until the first configuration comes.
			p.files = empty
		}
		p.mu.Unlock()
	} else {
		log.Info("waiting for the first configuration from the xDS server", "server", x.server, "node_id", x.nodeID)
		select {
		case <-p.first:
		case <-ctx.Done():
			closeClient()
			return nil, fmt.Errorf("--envoy-xds %s: no configuration received before the start was cancelled: %w", x.server, ctx.Err())
		}
	}
	p.mu.Lock()
	files := p.files
	p.mu.Unlock()
	return &policySource{name: p.name, files: files, watch: p.watch, close: closeClient}, nil
}

// apply parses one response; the runtime, once attached, compiles it with the control store's
// state. An error NACKs the response and leaves the running policy.
func (p *xdsPolicy) apply(version string, docs map[string][]byte) error {
	files, err := policy.ParseFiles(docs)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.m != nil {
			p.m.PolicyLoaded("", err)
		}
		return err
	}
	if p.rt != nil && files.Version != p.rt.Files().Version {
		if err := p.rt.SetFiles(files, "xds version "+version); err != nil {
			return err
		}
		p.log.Info("policy files reloaded", "source", p.name, "trigger", "xds version "+version, "files", Describe(files.Snapshot()))
	}
	p.files = files
	if !p.gotOne {
		p.gotOne = true
		close(p.first)
	}
	return nil
}

// watch hands the runtime what the server sent since New read the first configuration, then
// every accepted configuration as it comes, until ctx ends.
func (p *xdsPolicy) watch(ctx context.Context, rt *follower.Runtime, m *metrics.Metrics, log *slog.Logger) {
	p.mu.Lock()
	p.rt, p.m = rt, m
	if p.files.Version != rt.Files().Version {
		if err := rt.SetFiles(p.files, "xds"); err != nil {
			log.Error("policy reload failed; keeping the running policy", "source", p.name, "err", err)
		}
	}
	p.mu.Unlock()
	<-ctx.Done()
	p.mu.Lock()
	p.rt, p.m = nil, nil
	p.mu.Unlock()
}
