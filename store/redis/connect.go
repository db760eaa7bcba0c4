package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/maphash"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// New connects to the Redis that rawURL names:
//
//	redis://[user:pass@]host:port[/db]           one server (a Cluster node is detected)
//	rediss://...                                 the same over TLS
//	redis-sentinel://[user:pass@]h1:p1,h2:p2/master[?db=N]
//	redis-cluster://[user:pass@]h1:p1,h2:p2,...  a Cluster from several seeds
//
// Query parameters: read_timeout (bounds every call, default 1s), dial_timeout, write_timeout,
// max_flush_delay (durations; the last defaults to DefaultMaxFlushDelay, 0 turns it off),
// pool_size, pipeline_multiplex (integers), coalesce=false (one script call per request rather
// than one per lane's gathered requests, see coalesce.go), plain_windows=false (every fixed
// window decided by the script, see plain.go), tls=true (sentinel and
// cluster forms), tls_ca_file (PEM of the CA that signed Redis's certificate),
// tls_insecure_skip_verify=true, tls_cert_file and tls_key_file (PEM client certificate and key
// for a Redis with tls-auth-clients, read again when they change),
// tls_skip_hostname_verification=true (the chain is verified, the name in it is not),
// sentinel_auth ([user:]password for the sentinels themselves; absent, they get the URL's
// credentials; empty, none), key_prefix (put before every key, e.g. one per deployment sharing
// a Redis; no braces). New fails with a clear error when Redis cannot be
// reached or is older than MinVersion.
func New(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	opt, cluster, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	timeout := time.Second
	if v := queryOf(rawURL).Get("read_timeout"); v != "" {
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			return nil, fmt.Errorf("--store: read_timeout %q: want a positive duration", v)
		}
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("redis store: connect to %s: %w", redact(rawURL), err)
	}
	prefix := queryOf(rawURL).Get("key_prefix")
	s := &Store{client: client, cluster: cluster, timeout: timeout, coalesce: queryOf(rawURL).Get("coalesce") != "false", prefix: prefix, inbox: prefix + inboxKey,
		plainWindows: queryOf(rawURL).Get("plain_windows") != "false"}
	s.clock.born = time.Now()
	s.keySeed = maphash.MakeSeed()
	s.calls.New = func() any { return newCall(s) }
	s.pendings.New = func() any { return &pending{done: make(chan struct{}, 1)} }
	s.scratches.New = func() any { return new(scratch) }
	s.lane = newLane(s, 0)
	s.single = nodeRoute{client: client, node: node{clock: &s.clock}}
	for _, o := range opts {
		o(s)
	}
	if err := s.check(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store %s: %w", redact(rawURL), err)
	}
	if s.cluster {
		s.slotLanes = new([16384]atomic.Pointer[lane])
	}
	return s, nil
}

// check verifies the server's version and whether it runs as a Cluster.
func (s *Store) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := s.client.Do(ctx, s.client.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return fmt.Errorf("unreachable: %w", err)
	}
	version := field(info, "redis_version")
	parts := strings.SplitN(version, ".", 3)
	major, _ := strconv.Atoi(parts[0])
	minor := 0
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	if major < MinVersion || (major == MinVersion && minor < 2) {
		return fmt.Errorf("Redis %s is too old: the scripts need 6.2 or newer (SET ... PXAT)", version)
	}
	if info, err := s.client.Do(ctx, s.client.B().Info().Section("cluster").Build()).ToString(); err == nil && field(info, "cluster_enabled") == "1" {
		s.cluster = true
	}
	if major >= 7 && !s.scripts {
		if err := s.loadLibrary(ctx); err != nil {
			return fmt.Errorf("load the function library: %w", err)
		}
		s.functions = true
	}
	return nil
}

// loadLibrary loads the function library on every node. One already there is fine; a replica
// refuses the write and gets the library from its primary.
func (s *Store) loadLibrary(ctx context.Context) error {
	load := func(c rueidis.Client) error {
		err := c.Do(ctx, c.B().FunctionLoad().FunctionCode(library).Build()).Error()
		if err != nil && !strings.Contains(err.Error(), "already exists") && !strings.Contains(err.Error(), "READONLY") {
			return err
		}
		return nil
	}
	if !s.cluster {
		return load(s.client)
	}
	for addr, c := range s.client.Nodes() {
		if err := load(c); err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
	}
	return nil
}

func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func parseURL(raw string) (rueidis.ClientOption, bool, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error repeats the URL, password and all.
		return rueidis.ClientOption{}, false, errors.New("--store: not a valid URL")
	}
	q := u.Query()
	if p := q.Get("key_prefix"); strings.ContainsAny(p, "{}") {
		// A brace would move the hash tag, and with it the slot, of every key.
		return rueidis.ClientOption{}, false, fmt.Errorf("--store: key_prefix %q: braces are not allowed", p)
	}
	var opt rueidis.ClientOption
	cluster := false
	switch u.Scheme {
	case "redis", "rediss":
		// rueidis reads host, credentials, db, TLS and addr= from these itself.
		clean := *u
		clean.RawQuery = ""
		if opt, err = rueidis.ParseURL(clean.String()); err != nil {
			return opt, false, fmt.Errorf("--store %s: %v", redact(raw), strings.ReplaceAll(err.Error(), clean.String(), redact(clean.String())))
		}
	case "redis-sentinel", "redis-cluster":
		opt.InitAddress = strings.Split(u.Host, ",")
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		if u.Scheme == "redis-sentinel" {
			opt.Sentinel.MasterSet = strings.Trim(u.Path, "/")
			if opt.Sentinel.MasterSet == "" {
				return opt, false, errors.New("--store: redis-sentinel:// needs the master name as its path")
			}
			opt.Sentinel.Username, opt.Sentinel.Password = opt.Username, opt.Password
			if q.Has("sentinel_auth") {
				// As REDIS_SENTINEL_AUTH: "password" or "user:password"; empty is none.
				opt.Sentinel.Username, opt.Sentinel.Password = "", q.Get("sentinel_auth")
				if user, pass, ok := strings.Cut(q.Get("sentinel_auth"), ":"); ok {
					opt.Sentinel.Username, opt.Sentinel.Password = user, pass
				}
			}
			if db := q.Get("db"); db != "" {
				if opt.SelectDB, err = strconv.Atoi(db); err != nil {
					return opt, false, fmt.Errorf("--store: db %q: %w", db, err)
				}
			}
		} else {
			cluster = true
			opt.ShuffleInit = true
		}
		if q.Get("tls") == "true" {
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	default:
		return opt, false, fmt.Errorf("--store: unsupported scheme %q (memory, redis://, rediss://, redis-sentinel://, redis-cluster://)", u.Scheme)
	}
	if len(opt.InitAddress) == 0 || opt.InitAddress[0] == "" {
		return opt, false, errors.New("--store: no Redis address")
	}
	if v := q.Get("dial_timeout"); v != "" {
		if opt.Dialer.Timeout, err = time.ParseDuration(v); err != nil {
			return opt, false, fmt.Errorf("--store: dial_timeout: %w", err)
		}
	}
	if v := q.Get("write_timeout"); v != "" {
		if opt.ConnWriteTimeout, err = time.ParseDuration(v); err != nil {
			return opt, false, fmt.Errorf("--store: write_timeout: %w", err)
		}
	}
	if q.Get("tls_insecure_skip_verify") == "true" && opt.TLSConfig != nil {
		opt.TLSConfig.InsecureSkipVerify = true
	}
	if q.Get("tls_skip_hostname_verification") == "true" {
		if opt.TLSConfig == nil {
			return opt, false, errors.New("--store: tls_skip_hostname_verification needs rediss:// or tls=true")
		}
		skipHostname(opt.TLSConfig)
	}
	if path := q.Get("tls_ca_file"); path != "" {
		if opt.TLSConfig == nil {
			return opt, false, errors.New("--store: tls_ca_file needs rediss:// or tls=true")
		}
		pool, err := tlsreload.CertPool(path)
		if err != nil {
			return opt, false, fmt.Errorf("--store: tls_ca_file: %w", err)
		}
		opt.TLSConfig.RootCAs = pool
	}
	if err := clientCertificate(q, opt.TLSConfig); err != nil {
		return opt, false, err
	}
	// The limiter wants answers, not client-side caching of them.
	opt.DisableCache = true
	// Checks are pipelined over one connection per node; pool_size sizes the pool that
	// blocking commands would use, and pipeline_multiplex spreads pipelining over 2^n
	// connections.
	if v := q.Get("pool_size"); v != "" {
		if opt.BlockingPoolSize, err = strconv.Atoi(v); err != nil || opt.BlockingPoolSize < 1 {
			return opt, false, fmt.Errorf("--store: pool_size %q: want a positive integer", v)
		}
	}
	if v := q.Get("pipeline_multiplex"); v != "" {
		if opt.PipelineMultiplex, err = strconv.Atoi(v); err != nil || opt.PipelineMultiplex < 0 || opt.PipelineMultiplex > 8 {
			return opt, false, fmt.Errorf("--store: pipeline_multiplex %q: want 0 to 8", v)
		}
	}
	// max_flush_delay lets a connection gather concurrent requests before one write, so Sluice
	// and Redis make fewer system calls per check; rueidis waits only while several calls are
	// in flight, never for a lone one. 0 turns it off.
	opt.MaxFlushDelay = DefaultMaxFlushDelay
	if v := q.Get("max_flush_delay"); v != "" {
		if opt.MaxFlushDelay, err = time.ParseDuration(v); err != nil || opt.MaxFlushDelay < 0 {
			return opt, false, fmt.Errorf("--store: max_flush_delay %q: want a duration >= 0", v)
		}
	}
	return opt, cluster, nil
}

// skipHostname makes cfg verify the server's chain against cfg.RootCAs (the system's roots
// when nil) without checking the name in it: for a Redis reached by an address its
// certificate does not name (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION). Unlike
// tls_insecure_skip_verify, a certificate from another CA is still refused.
func skipHostname(cfg *tls.Config) {
	cfg.InsecureSkipVerify = true // the name check only; VerifyConnection checks the chain
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("redis tls: no server certificate")
		}
		opts := x509.VerifyOptions{Roots: cfg.RootCAs, Intermediates: x509.NewCertPool()}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("redis tls: %w", err)
		}
		return nil
	}
}

func queryOf(raw string) url.Values {
	u, err := url.Parse(raw)
	if err != nil {
		return url.Values{}
	}
	return u.Query()
}

// redact hides the password of a URL for errors and logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// clientCertificate sets the client certificate that tls_cert_file and tls_key_file name, if
// any, on cfg. The files are read again on a new connection when they changed (checked at most
// once a second), so a rotated certificate is used from the next reconnect on; a bad file is
// logged and the last good pair kept.
func clientCertificate(q url.Values, cfg *tls.Config) error {
	certFile, keyFile := q.Get("tls_cert_file"), q.Get("tls_key_file")
	if certFile == "" && keyFile == "" {
		return nil
	}
	if certFile == "" {
		return errors.New("--store: tls_key_file needs tls_cert_file")
	}
	if keyFile == "" {
		return errors.New("--store: tls_cert_file needs tls_key_file")
	}
	if cfg == nil {
		return errors.New("--store: tls_cert_file needs rediss:// or tls=true")
	}
	r, err := tlsreload.New(tlsreload.Options{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		return fmt.Errorf("--store: tls_cert_file: %w", err)
	}
	cfg.GetClientCertificate = r.ClientConfig().GetClientCertificate
	return nil
}
