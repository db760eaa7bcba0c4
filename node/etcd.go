package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

// The schemes of --config that name an etcd prefix rather than a file or folder.
const (
	etcdScheme      = "etcd://"
	etcdHTTPSScheme = "etcd+https://"
)

const (
	// etcdTimeout bounds each read of the prefix: at start, an etcd that does not answer in
	// it stops serve, as an unreadable policy file does.
	etcdTimeout = 5 * time.Second
	// etcdSettle is how long a change waits for the ones that follow it: keys written one by
	// one rather than in a transaction arrive as separate events, and the policy is read once
	// they have all landed, not in every half-written state between them.
	etcdSettle = 100 * time.Millisecond
	// etcdMaxBackoff caps gRPC's reconnection delay (120 s by default), so that a restarted
	// etcd is found again within seconds.
	etcdMaxBackoff = 3 * time.Second
)

// isEtcd reports whether --config names an etcd prefix.
func isEtcd(config string) bool {
	return strings.HasPrefix(config, etcdScheme) || strings.HasPrefix(config, etcdHTTPSScheme)
}

// policySource is where serve reads its policy files: a file or folder (watched with
// fsnotify and SIGHUP), an etcd prefix (watched with etcd's Watch and SIGHUP), or the built-in
// policy (not watched).
type policySource struct {
	// name is the source as logs and the audit log name it; it never holds a password.
	name string
	// files is the policy read at start.
	files *policy.Files
	// watch follows the source until ctx ends, handing each valid change to rt; nil for the
	// built-in policy.
	watch func(ctx context.Context, rt *follower.Runtime, m *metrics.Metrics, log *slog.Logger)
	// close releases the source's connections.
	close func() error
}

// openPolicy reads the policy that --config names. A source that cannot be read, or whose
// files are invalid, is an error: serve does not start on a policy it was not given.
func openPolicy(ctx context.Context, config string, log *slog.Logger, opts ...policy.LoadOption) (*policySource, error) {
	if isEtcd(config) {
		return openEtcdPolicy(ctx, config, log, opts...)
	}
	files, err := loadFiles(config, opts...)
	if err != nil {
		return nil, err
	}
	src := &policySource{name: config, files: files, close: func() error { return nil }}
	if config != "" {
		src.watch = func(ctx context.Context, rt *follower.Runtime, m *metrics.Metrics, log *slog.Logger) {
			watchPolicy(ctx, config, rt, m, log, opts...)
		}
	}
	return src, nil
}

// etcdPolicy is a policy kept in etcd: every key under a prefix is one policy file, named by
// the key and holding YAML in either format, as the files of a folder do.
type etcdPolicy struct {
	client *clientv3.Client
	prefix string
	name   string // the URL without its password
	opts   []policy.LoadOption
}

// parseEtcdURL reads etcd://[user:pass@]host:port[,host:port...]/prefix (etcd+https:// for
// TLS with the system's roots). The prefix is the URL's path and always ends in "/", so that
// /sluice does not also take the keys of /sluice-staging.
func parseEtcdURL(raw string) (clientv3.Config, string, string, error) {
	var cfg clientv3.Config
	scheme := "http://"
	rest, ok := strings.CutPrefix(raw, etcdScheme)
	if !ok {
		rest, _ = strings.CutPrefix(raw, etcdHTTPSScheme)
		scheme = "https://"
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if user, host, ok := strings.Cut(hosts, "@"); ok {
		hosts = host
		u, err := url.Parse("x://" + user + "@x")
		if err != nil {
			return cfg, "", "", fmt.Errorf("--config %s: user: %w", redactEtcd(raw), err)
		}
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if hosts == "" {
		return cfg, "", "", fmt.Errorf("--config %s: no etcd host", redactEtcd(raw))
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" || strings.ContainsAny(h, "?#") {
			return cfg, "", "", fmt.Errorf("--config %s: bad etcd host %q", redactEtcd(raw), h)
		}
		cfg.Endpoints = append(cfg.Endpoints, scheme+h)
	}
	prefix := "/" + strings.TrimSuffix(path, "/") + "/"
	if prefix == "//" {
		// The whole key space is never a policy: most likely the prefix was forgotten.
		return cfg, "", "", fmt.Errorf("--config %s: no key prefix (etcd://host:2379/PREFIX)", redactEtcd(raw))
	}
	return cfg, prefix, redactEtcd(raw), nil
}

// redactEtcd returns an etcd --config URL with its password replaced, for logs.
func redactEtcd(raw string) string {
	scheme, rest, _ := strings.Cut(raw, "://")
	hosts, path, hasPath := strings.Cut(rest, "/")
	if user, host, ok := strings.Cut(hosts, "@"); ok {
		name, _, _ := strings.Cut(user, ":")
		hosts = name + ":xxxxx@" + host
	}
	if hasPath {
		hosts += "/" + path
	}
	return scheme + "://" + hosts
}

// openEtcdPolicy connects to etcd and reads the policy under the prefix, which must answer
// within etcdTimeout and hold at least one valid document.
func openEtcdPolicy(ctx context.Context, raw string, log *slog.Logger, opts ...policy.LoadOption) (*policySource, error) {
	cfg, prefix, name, err := parseEtcdURL(raw)
	if err != nil {
		return nil, err
	}
	cfg.DialTimeout = etcdTimeout
	// Keepalives find a dead connection in seconds instead of the kernel's minutes.
	cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout = 10*time.Second, 5*time.Second
	bc := backoff.DefaultConfig
	bc.MaxDelay = etcdMaxBackoff
	cfg.DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: etcdTimeout})}
	// The client logs with zap; its connection chatter is dropped, and what matters to an
	// operator (a failed read, a lost watch) is logged here with slog.
	cfg.Logger = zap.NewNop()
	cfg.Context = ctx
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	e := &etcdPolicy{client: client, prefix: prefix, name: name, opts: opts}
	files, _, err := e.read(ctx)
	if err != nil {
		client.Close()
		return nil, err
	}
	return &policySource{name: name, files: files, watch: e.watch, close: client.Close}, nil
}

// read returns the policy under the prefix and the etcd revision it was read at.
func (e *etcdPolicy) read(ctx context.Context) (*policy.Files, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := e.client.Get(ctx, e.prefix, clientv3.WithPrefix())
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return nil, 0, fmt.Errorf("%s: no answer from etcd within %v: %w", e.name, etcdTimeout, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%s: read: %w", e.name, err)
	}
	if len(resp.Kvs) == 0 {
		// Refused rather than read as an empty policy: a mistyped prefix, or every key
		// deleted by accident, would otherwise lift every limit.
		return nil, resp.Header.Revision, fmt.Errorf("%s: no keys under %s", e.name, e.prefix)
	}
	docs := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		// The key names the document in errors: /prefix/file.yaml:3: rules[0].limit: ...
		docs[string(kv.Key)] = kv.Value
	}
	files, err := policy.ParseFiles(docs, e.opts...)
	if err != nil {
		return nil, resp.Header.Revision, err
	}
	return files, resp.Header.Revision, nil
}

// watch follows the prefix until ctx ends: every change under it, every reconnection to etcd
// (changes may have been missed while it was away) and SIGHUP re-read the whole prefix and
// hand it to rt. A policy that is invalid, or that cannot be read, is logged, counted in
// sluice_policy_reloads_total{result="error"} and ignored: the running one stays.
func (e *etcdPolicy) watch(ctx context.Context, rt *follower.Runtime, m *metrics.Metrics, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	reconnected := make(chan struct{}, 1)
	go e.watchConnection(ctx, reconnected)

	rev := int64(0)
	reload := func(why string) {
		files, r, err := e.read(ctx)
		if r > 0 {
			// The cluster's revision now, even below one seen before: a member restored from
			// a backup, or a new cluster, counts from there, and a watch from the old revision
			// would wait for revisions that came long ago.
			rev = r
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Logged before counted: whoever sees the count finds the line.
			log.Error("policy reload failed; keeping the running policy", "source", e.name, "trigger", why, "version", rt.Files().Version, "err", err)
			m.PolicyLoaded("", err)
			return
		}
		if files.Version == rt.Files().Version {
			return
		}
		if err := rt.SetFiles(files, why); err != nil {
			log.Error("policy reload failed; keeping the running policy", "source", e.name, "trigger", why, "err", err)
			return
		}
		log.Info("policy files reloaded", "source", e.name, "trigger", why, "files", Describe(files.Snapshot()))
	}
	// The start read happened before the runtime existed: read again, so a change made in
	// between is not missed, and watch from the revision of that read.
	reload("etcd start")

	var (
		events <-chan clientv3.WatchResponse
		cancel context.CancelFunc = func() {}
		settle <-chan time.Time
		retry  <-chan time.Time
	)
	defer func() { cancel() }()
	rewatch := func() {
		cancel()
		var wctx context.Context
		wctx, cancel = context.WithCancel(ctx)
		// WithRequireLeader ends the watch when the member loses its cluster, instead of
		// waiting silently on a partitioned member.
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev+1)) // nothing after the read is missed
		}
		events = e.client.Watch(clientv3.WithRequireLeader(wctx), e.prefix, opts...)
	}
	rewatch()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			reload("SIGHUP")
		case <-reconnected:
			reload("etcd reconnect")
			// etcd's client resumes the watch from its own last revision, which a member with
			// other data may never reach: watch from the read's.
			rewatch()
		case resp, ok := <-events:
			if !ok || resp.Err() != nil || resp.Canceled {
				// Compacted past our revision, no leader, or the stream ended: read it all
				// again, then watch from there.
				var err error
				if ok {
					err = resp.Err()
				}
				events = nil
				if ctx.Err() == nil {
					log.Warn("etcd policy watch ended; re-reading", "source", e.name, "err", err)
					retry = time.After(time.Second)
				}
				continue
			}
			if len(resp.Events) > 0 && settle == nil {
				settle = time.After(etcdSettle)
			}
		case <-settle:
			settle = nil
			reload("etcd change")
		case <-retry:
			retry = nil
			reload("etcd watch restart")
			rewatch()
		}
	}
}

// watchConnection signals reconnected whenever the client's connection to etcd becomes ready
// again after it was lost: etcd's client resumes watches by itself, but a member that came
// back with other data (restored from a backup, or a new cluster) would not replay what
// changed, so the prefix is read again.
func (e *etcdPolicy) watchConnection(ctx context.Context, reconnected chan<- struct{}) {
	conn := e.client.ActiveConnection()
	state := conn.GetState()
	lost := state != connectivity.Ready
	for conn.WaitForStateChange(ctx, state) {
		if state == connectivity.Ready {
			// It left Ready, however briefly: a reconnection fast enough to be Ready again by
			// the next read of the state is still one, and the member may hold other data.
			lost = true
		}
		state = conn.GetState()
		switch {
		case state == connectivity.Ready && lost:
			lost = false
			select {
			case reconnected <- struct{}{}:
			default:
			}
		case state == connectivity.TransientFailure || state == connectivity.Idle || state == connectivity.Connecting:
			lost = true
		}
	}
}
