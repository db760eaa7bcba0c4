package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

// controlSQLite is --control's default: the embedded store, <data-dir>/control.db.
const controlSQLite = "sqlite"

// isSQLiteControl tells whether --control names the embedded store, which lives in the data
// directory and so needs its lock.
func isSQLiteControl(url string) bool { return url == controlSQLite || url == "" }

// isPostgresControl tells whether --control is a PostgreSQL URL.
func isPostgresControl(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// checkControl validates --control before anything is opened.
func checkControl(url string) error {
	if isSQLiteControl(url) || isPostgresControl(url) {
		return nil
	}
	return fmt.Errorf("--control: %q is not sqlite or a postgres:// URL", redact(url))
}

// redact hides a password in a URL-like value for messages.
func redact(s string) string {
	at := strings.LastIndexByte(s, '@')
	scheme := strings.Index(s, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return s
	}
	creds := s[scheme+3 : at]
	if user, _, ok := strings.Cut(creds, ":"); ok {
		return s[:scheme+3] + user + ":xxxxx" + s[at:]
	}
	return s
}

// openControl opens the control store --control names. PostgreSQL is opened lazily: a
// database that is down at start is logged, and the node serves on its policy files until it
// answers, when the runtime catches up.
func openControl(ctx context.Context, c Config, log *slog.Logger) (control.Store, string, error) {
	opts := control.Options{Logger: log}
	if isSQLiteControl(c.control) {
		path := sqlite.Path(c.dataDir)
		s, err := sqlite.Open(ctx, path, opts)
		if err != nil {
			return nil, "", err
		}
		return s, "sqlite " + path, nil
	}
	s, err := postgres.OpenLazy(c.control, opts)
	if err != nil {
		return nil, "", err
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := s.Ping(pctx); err != nil {
		log.Warn("control store unreachable at start; serving on the policy files and retrying", "err", err)
	}
	return s, "postgres", nil
}

// nodeID is --node-id, or hostname:port of the HTTP listener: stable across restarts of the
// same node, and distinct for two nodes on one host.
func nodeID(flag string, httpAddr net.Addr) string {
	if flag != "" {
		return flag
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "sluice"
	}
	port := ""
	if a, ok := httpAddr.(*net.TCPAddr); ok {
		port = fmt.Sprint(a.Port)
	}
	return host + ":" + port
}

// durationFlag is a flag holding a duration that also takes days ("365d"), as retention
// periods are written.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	text, _ := policy.Duration(*f.d).MarshalText() // 1d, 5m, 60s as people write them
	return string(text)
}

func (f durationFlag) Set(s string) error {
	d, err := policy.ParseDuration(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("%q: must be above 0", s)
	}
	*f.d = d
	return nil
}

func (durationFlag) Type() string { return "duration" }

// retentionEnv reads a retention period from the environment, or def.
func retentionEnv(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		var d time.Duration
		if (durationFlag{&d}).Set(v) == nil {
			return d
		}
	}
	return def
}

// adminDeps is what the admin API is built from.
type adminDeps struct {
	tokenFile string
	store     control.Store
	runtime   *follower.Runtime
	limiter   *sluice.Limiter
	metrics   *metrics.Metrics
	dataDir   string
	log       *slog.Logger
	// stats is this node's live statistics (ui.go), for GET /admin/v1/stats and top.
	stats *fleetstats.Collector
	reg   prometheus.Registerer
	// proxies are --trusted-proxies.
	proxies []netip.Prefix
	// waitTimeout is --wait-timeout.
	waitTimeout time.Duration
}

// bootstrapAdmin makes sure an admin token exists, before the node compiles its first policy
// (the token is a change of the control store): the bootstrap secret from SLUICE_ADMIN_TOKEN
// or --admin-token-file, else, at the first start, a random one written to
// <data-dir>/admin.token (its path logged, never the token). With PostgreSQL down at start the
// node still serves and decides; the token is set as soon as the control store answers.
func bootstrapAdmin(ctx context.Context, store control.Store, tokenFile, dataDir string, log *slog.Logger) error {
	secret, err := bootstrapSecret(tokenFile)
	if err != nil {
		return err
	}
	bootstrap := adminapi.BootstrapOptions{Secret: secret, DataDir: dataDir, Log: log}
	if _, err := adminapi.Bootstrap(ctx, store, bootstrap); err != nil {
		log.Warn("admin token bootstrap failed; retrying until the control store answers", "err", err)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(2 * time.Second):
				}
				if _, err := adminapi.Bootstrap(ctx, store, bootstrap); err == nil {
					log.Info("admin token bootstrap done")
					return
				}
			}
		}()
	}
	return nil
}

// adminAPI builds the admin API (control/adminapi), mounted at /admin/v1/ on the HTTP listener.
func adminAPI(d adminDeps) (*adminapi.Server, error) {
	return adminapi.New(adminapi.Options{
		Control: d.store,
		Limiter: d.limiter,
		Files: func() adminapi.FilePolicy {
			f := d.runtime.Files()
			fp := adminapi.FilesFromConfigs(f.Configs()...)
			fp.Envoy, fp.Domains = f.Envoy(), f.EnvoyDomains()
			return fp
		},
		PolicyVersion:  d.runtime.PolicyVersion,
		Applied:        d.runtime.Sync,
		NodeWindow:     follower.LiveNodeWindow,
		Fleet:          fleetstats.View{Local: d.stats.Snapshot, Logger: d.log},
		Registerer:     d.reg,
		TrustedProxies: d.proxies,
		WaitTimeout:    d.waitTimeout,
		Logger:         d.log,
	})
}

// bootstrapSecret reads the bootstrap admin token: SLUICE_ADMIN_TOKEN, else the file named by
// --admin-token-file, else none.
func bootstrapSecret(file string) (string, error) {
	if v := os.Getenv("SLUICE_ADMIN_TOKEN"); v != "" {
		return v, nil
	}
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
