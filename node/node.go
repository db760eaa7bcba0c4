// Package node is Sluice's composition root: New builds a whole node from its Config (the
// stores, the engine, the control plane's follower and services, telemetry and the three
// transports), Run serves until its context ends and drains, and Close unwinds exactly what
// New built, in reverse. The binary (cmd/sluice) only parses flags into a Config; tests start
// a node in-process the same way.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/internal/tlsreload"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/allowance"
	"github.com/sluicehq/sluice/store/breaker"
	"github.com/sluicehq/sluice/store/hotkey"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/split"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/transport/grpcapi"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/overload"
	"github.com/sluicehq/sluice/transport/rls"
)

// Node is one Sluice node, built by New. Its parts are closed in the reverse order of their
// building, by Close (or by New itself when a later part fails).
type Node struct {
	cfg     Config
	log     *slog.Logger
	closers []func() error // the closer stack: every part pushes its Close as it is built

	src       *policySource
	storeName string
	ctrlName  string
	m         *metrics.Metrics
	lim       *sluice.Limiter
	rt        *follower.Runtime

	httpLn, grpcLn net.Listener
	httpSrv        *http.Server
	// adminLn and adminSrv serve the admin API and the dashboard with --admin-http; nil
	// without it (they are on the HTTP listener then).
	adminLn   net.Listener
	adminSrv  *http.Server
	grpcSrv   *grpc.Server
	serverTLS *tlsreload.Reloader
	grpcTLS   *tlsreload.Reloader // serverTLS, or GRPC_SERVER_USE_TLS's for gRPC alone
	// debugLn and promLn are the reference's debug (DEBUG_PORT) and Prometheus
	// (USE_PROMETHEUS) listeners; nil unless their variables are set.
	debugLn, promLn   net.Listener
	debugSrv, promSrv *http.Server
	healthSrv         *health.Server
	// storeHealth, with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, is the store's check that the
	// gRPC health service follows; nil otherwise.
	storeHealth func(context.Context) error
	healthcheck *rls.Healthcheck
	closeOnce   sync.Once
	closeErr    error
}

// onClose pushes f on the closer stack.
func (n *Node) onClose(f func() error) { n.closers = append(n.closers, f) }

// onCloseQuiet pushes a Close that reports nothing.
func (n *Node) onCloseQuiet(f func()) { n.onClose(func() error { f(); return nil }) }

// New builds a node from c: it opens the stores, compiles the policy, starts the follower,
// the control plane's services and telemetry, and binds the listeners, but serves nothing
// until Run. When a part fails, what was built before it is closed, and the error returned.
func New(ctx context.Context, c Config) (n *Node, err error) {
	log, err := newLogger(c)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(log)
	if c.grpcWorkers < 1 || c.grpcWorkers > maxGRPCWorkers {
		return nil, fmt.Errorf("--grpc-workers: %d: want 1 to %d", c.grpcWorkers, maxGRPCWorkers)
	}
	if err := applyMemory(ctx, c, log); err != nil {
		return nil, err
	}
	if err := checkControl(c.control); err != nil {
		return nil, err
	}
	if err := c.abuse.validate(); err != nil {
		return nil, err
	}
	if err := c.storeDeadline.validate(c.storeTimeout); err != nil {
		return nil, err
	}
	regionCfg, err := c.region.config(c.tls.cert, c.tls.key, log)
	if err != nil {
		return nil, err
	}
	proxies, err := parsePrefixes("--trusted-proxies", c.trustedProxies)
	if err != nil {
		return nil, err
	}

	n = &Node{cfg: c, log: log}
	defer func() {
		if err != nil {
			n.Close()
			n = nil
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tp, stopTracing, err := startTracing(ctx, c.tracing, tracingNode(c), c.Version, reg, log)
	if err != nil {
		return n, err
	}
	n.onCloseQuiet(stopTracing) // after the drain, so the last decisions' spans are sent
	if n.serverTLS, err = c.tls.open(log); err != nil {
		return n, err
	}
	if n.grpcTLS, err = openEnvoyGRPCTLS(c.envoy.GRPCTLS, n.serverTLS, log); err != nil {
		return n, err
	}
	logEnvoyNotes(c.envoy, log)
	if n.src, err = openPolicySource(ctx, c, log); err != nil {
		return n, fmt.Errorf("load policy: %w", err)
	}
	n.onClose(n.src.close)
	files := n.src.files
	snap := files.Snapshot()
	if isMemory(c.storeURL) || isSQLiteControl(c.control) {
		// The memory store's snapshot and the SQLite control store live in --data-dir: one
		// process per folder, or each would overwrite the other's snapshot and two nodes
		// would share one node's control store. Taken before either is read; held until
		// Close.
		lock, err := lockDataDir(c.dataDir)
		if err != nil {
			return n, err
		}
		n.onClose(lock.Close)
	}
	ctrl, ctrlName, err := openControl(ctx, c, log)
	if err != nil {
		return n, err
	}
	n.ctrlName = ctrlName
	n.onClose(ctrl.Close)
	if err := bootstrapAdmin(ctx, ctrl, c.adminTokenFile, c.dataDir, log); err != nil {
		return n, err
	}

	st, storeName, redisStores, err := openStore(ctx, c, log)
	if err != nil {
		return n, err
	}
	n.storeName = storeName
	// The limiter closes the store once it holds it; until then the node does.
	n.onClose(func() error {
		if n.lim == nil {
			return st.Close()
		}
		return nil
	})
	rawStore := st // the region sync reads it unguarded
	tracer := newTracer(tp, storeName)
	m := metrics.New(reg, storeName)
	n.m = m
	if len(redisStores) > 0 {
		m.WatchRedis(func() metrics.RedisStats { return redisStats(redisStores) })
	}
	if storeName == "memory" && (c.hotKeys || c.allowances) {
		log.Warn("--hot-keys and --allowances spare a shared store round trips; the memory store has none: ignored")
	}
	if storeName != "memory" {
		m.BreakerState("closed")
		st = breaker.New(st, breaker.Options{Timeout: c.storeTimeout, MaxTimeout: c.storeDeadline.max, OnStateChange: func(from, to string) {
			log.Warn("store circuit breaker", "from", from, "to", to)
			m.BreakerState(to)
		}})
		if c.allowances {
			al, err := allowance.New(st, allowance.Options{})
			if err != nil {
				return n, fmt.Errorf("allowances: %w", err)
			}
			m.WatchAllowances(func() metrics.AllowanceStats {
				st := al.Stats()
				return metrics.AllowanceStats{Local: st.Local, Shared: st.Shared, Grants: st.Grants, GivenBack: st.GivenBack, Uncounted: st.Uncounted}
			})
			st = al
		}
		if c.hotKeys {
			hk := hotkey.New(st, hotkey.Options{Threshold: c.hotKeyThreshold, Overage: c.hotKeyOverage, Nodes: c.fleetSize})
			m.WatchHotKeys(func() metrics.HotKeyStats {
				st := hk.Stats()
				return metrics.HotKeyStats{Hot: st.Hot, Local: st.Local, Mixed: st.Mixed, Syncs: st.Syncs}
			})
			st = hk
		}
	}
	// Region-token failures count beside the admin API's, once it is built; the Regions
	// service is registered after it.
	var authCounter atomic.Pointer[adminapi.Server]
	if regionCfg != nil {
		regionCfg.OnAuthFailure = func(reason string) {
			if a := authCounter.Load(); a != nil {
				a.CountAuthFailure("region_" + reason)
			}
		}
	}
	wrapped, rgn, err := wrapRegion(regionCfg, st, rawStore)
	if err != nil {
		return n, err
	}
	st = wrapped
	// Escalation's penalties count in sluice_overrides_applied_total, whose metrics the abuse
	// runtime registers once the listeners are up; the escalator writes none before Start.
	var abuseMetrics atomic.Pointer[abuseRuntime]
	esc, err := newEscalator(ctrl, reg, log, func(o control.Override) {
		if ab := abuseMetrics.Load(); ab != nil {
			ab.m.OverrideApplied(o.Type, o.Source)
		}
	})
	if err != nil {
		return n, err
	}
	n.onCloseQuiet(esc.Close)
	storeErrors := &storeErrorLog{log: log, now: time.Now}
	opts := []sluice.Option{sluice.WithLogger(log), sluice.WithStoreErrorHook(func(err error) {
		m.StoreError(err)
		storeErrors.record(err)
	}), sluice.WithBurstHook(esc.Report)}
	if c.shadow {
		opts = append(opts, sluice.WithShadow())
	}
	if c.envoy.QuotaMode {
		opts = append(opts, sluice.WithEnvoyQuotaMode())
	}
	attrs, err := c.envoyAttributesOption()
	if err != nil {
		return n, err
	}
	opts = append(opts, attrs)
	if storeName != "memory" {
		// Rules with on_store_error: local limit in this process while the shared store is
		// down, each node to its share of the fleet.
		opts = append(opts, sluice.WithFallback(tracer.Fallback(memory.New(memory.WithLogger(log)))), sluice.WithLocalShare(c.fleetSize))
	}
	lim, err := sluice.New(tracer.Store(st, storeName), snap, opts...)
	if err != nil {
		return n, err
	}
	n.lim = lim
	n.onClose(func() error {
		if err := lim.Close(); err != nil {
			log.Error("close store", "err", err)
			return err
		}
		log.Info("stopped; state saved", "data_dir", c.dataDir)
		return nil
	})
	log.Info("policy files loaded", "source", orBuiltIn(n.src.name), "policy", Describe(snap), "store", storeName, "control", ctrlName)
	sink, err := startStatsD(c, reg, m, lim, log)
	if err != nil {
		return n, err
	}
	if sink != nil {
		n.onClose(sink.Close) // after the drain, so the last send counts every decision
	}

	if n.httpLn, err = net.Listen("tcp", c.httpAddr); err != nil {
		return n, fmt.Errorf("--http: %w", err)
	}
	n.onClose(ignoreClosed(n.httpLn.Close))
	if n.grpcLn, err = net.Listen("tcp", c.grpcAddr); err != nil {
		return n, fmt.Errorf("--grpc: %w", err)
	}
	n.onClose(ignoreClosed(n.grpcLn.Close))
	if c.adminHTTP != "" {
		if n.adminLn, err = net.Listen("tcp", c.adminHTTP); err != nil {
			return n, fmt.Errorf("--admin-http: %w", err)
		}
		n.onClose(ignoreClosed(n.adminLn.Close))
	}
	if err := n.listenEnvoyExtras(c.envoy, reg, log); err != nil {
		return n, err
	}
	id := nodeID(c.nodeID, n.httpLn.Addr())

	statsCtx, stopStats := context.WithCancel(context.WithoutCancel(ctx))
	n.onCloseQuiet(stopStats)
	fleet := startFleetStats(statsCtx, id, storeName, st, reg, log)
	planes := startControlPlanes(statsCtx, rawStore, c, id, log)

	// From here the follower sets the limiter's policy: the files and the control store
	// compiled together.
	rt, err := follower.New(follower.Options{
		Store: ctrl, Limiter: lim, Files: files, FilesPath: n.src.name,
		NodeID: id, Addr: n.httpLn.Addr().String(),
		Metrics: m, Logger: log, Stats: heartbeatStats(fleet, log),
		AuditRetention: c.auditRetention, CountsRetention: c.countsRetention,
	})
	if err != nil {
		return n, err
	}
	n.rt = rt
	rt.Start(ctx)
	n.onCloseQuiet(rt.Close)
	ab, err := startAbuse(ctx, c.abuse, ctrl, id, reg, log)
	if err != nil {
		return n, err
	}
	n.onCloseQuiet(ab.Close)
	abuseMetrics.Store(ab)
	esc.Start(ctx, rt.Sync)

	adminHandler, err := adminAPI(adminDeps{store: ab.CountOverrides(ctrl), runtime: rt, limiter: lim, metrics: m, dataDir: c.dataDir, log: log, stats: fleet, reg: reg, proxies: proxies, waitTimeout: c.waitTimeout})
	if err != nil {
		return n, err
	}
	n.onClose(adminHandler.Close)
	authCounter.Store(adminHandler)
	rec, err := startEvents(c.events, ctrl, m, fleet.Observe, log)
	if err != nil {
		return n, err
	}
	n.onCloseQuiet(func() { closeEvents(rec, log) }) // after the listeners stop: the last decisions are written
	api := httpapi.New(lim, m, httpapi.Options{
		// Resets restore quota: they need a write token, as every change does.
		ResetAuth:    func(h http.Handler) http.Handler { return adminHandler.RequireRole(control.RoleWrite, h) },
		MaxBodyBytes: c.maxBody,
		Events:       rec,
		Tracer:       tracer,
		Metrics:      promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		Ready: []httpapi.ReadyCheck{
			{Name: "store", Check: storeCheck(st)},
			// The node decides on its last policy while the control store is down.
			{Name: "control_store", Check: rt.Health, Optional: true},
			// Nodes on one data store that follow other control stores still decide, each
			// on its own policy: said in the body, not unready (the fleet would go down).
			{Name: "control_plane", Check: planes.Health, Optional: true},
		},
	})
	gate := overload.NewGate(c.maxInFlight, func(api string) { m.Rejected(api, "overloaded") })
	adminLim, err := sluice.New(memory.New(), mustPolicy(overload.AdminPolicy))
	if err != nil {
		return n, err
	}
	n.onClose(adminLim.Close)
	admin := overload.NewAdmin(adminLim)
	mux := http.NewServeMux()
	// Envoy's reference service's HTTP endpoints, so its deployments' probes and tools work.
	rlsOpts := rlsOptions(c)
	rlsOpts.Events, rlsOpts.Tracer = rec, tracer
	rlsSrv := rls.New(lim, m, rlsOpts)
	n.healthcheck = &rls.Healthcheck{}
	if c.envoy.HealthCheckStore {
		n.healthcheck.Check = storeCheck(st)
		n.storeHealth = storeCheck(st)
	}
	mux.Handle("/json", gate.HTTP(rlsSrv.JSONHandler(c.maxBody)))
	mux.Handle("GET /healthcheck", n.healthcheck)
	mux.Handle("/", gate.HTTP(admin.HTTP(api)))
	adminMux := mux
	if n.adminLn != nil {
		adminMux = http.NewServeMux()
	}
	adminMux.Handle("/admin/v1/", adminHandler)
	mountUI(adminMux)
	if c.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	n.httpSrv = httpServer(mux, log)
	if n.adminLn != nil {
		n.adminSrv = httpServer(adminMux, log)
	}
	n.grpcSrv = grpc.NewServer(
		grpc.MaxRecvMsgSize(1<<20),
		grpcCreds(n.grpcTLS),
		envoyKeepalive(c.envoy),
		grpc.ChainUnaryInterceptor(gate.UnaryInterceptor(), admin.UnaryInterceptor()),
		// A fixed pool of stream workers instead of a goroutine per RPC: less stack growth and
		// scheduling per call. A call that finds every worker busy gets a goroutine of its own,
		// so the pool must cover the calls in flight, which on Redis wait for the store.
		grpc.NumStreamWorkers(uint32(c.grpcWorkers)),
		// A connection that has not finished its TLS and HTTP/2 handshake by then is closed,
		// as the HTTP listener closes one without headers: idle half-open connections would
		// otherwise hold a file descriptor and a goroutine each for grpc-go's 120 s.
		grpc.ConnectionTimeout(handshakeTimeout),
	)
	n.onCloseQuiet(n.grpcSrv.Stop) // a no-op after Run's graceful stop
	grpcapi.New(lim, m, grpcapi.WithResetAuth(adminHandler.GRPCAuth(control.RoleWrite)), grpcapi.WithEvents(rec), grpcapi.WithTracer(tracer)).Register(n.grpcSrv)
	rlsSrv.Register(n.grpcSrv)
	n.healthSrv = health.NewServer()
	healthpb.RegisterHealthServer(n.grpcSrv, n.healthSrv)
	if c.grpcReflection {
		reflection.Register(n.grpcSrv)
	}
	if err := rgn.start(n.grpcSrv, reg, lim, log); err != nil {
		return n, err
	}
	return n, nil
}

// httpServer is an HTTP server of the node: bounded headers and bodies in time and size, so
// that slow or silent clients cannot hold connections.
func httpServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// ignoreClosed makes a listener's Close quiet when the server closed it already.
func ignoreClosed(close func() error) func() error {
	return func() error {
		if err := close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}

// HTTPAddr is the address the HTTP listener is bound to (useful with --http 127.0.0.1:0).
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// AdminHTTPAddr is the address the admin listener is bound to, or "" without --admin-http
// (the admin API is on HTTPAddr then).
func (n *Node) AdminHTTPAddr() string {
	if n.adminLn == nil {
		return ""
	}
	return n.adminLn.Addr().String()
}

// GRPCAddr is the address the gRPC listener is bound to.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// Limiter is the node's engine.
func (n *Node) Limiter() *sluice.Limiter { return n.lim }

// Run serves HTTP and gRPC and follows the policy source until ctx ends or a listener fails,
// then drains: health checks turn to failing, the servers finish the requests in flight
// (10 s at most) and the follower stops. Close releases the rest; Run does not.
func (n *Node) Run(ctx context.Context) error {
	errs := make(chan error, 5)
	go func() { errs <- serveHTTP(n.httpSrv, n.httpLn, n.serverTLS) }()
	if n.adminSrv != nil {
		go func() { errs <- serveHTTP(n.adminSrv, n.adminLn, n.serverTLS) }()
	}
	go func() { errs <- n.grpcSrv.Serve(n.grpcLn) }()
	if n.debugSrv != nil {
		go func() { errs <- n.debugSrv.Serve(n.debugLn) }()
	}
	if n.promSrv != nil {
		go func() { errs <- n.promSrv.Serve(n.promLn) }()
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if n.storeHealth != nil {
		go followStoreHealth(watchCtx, n.healthSrv, n.storeHealth, time.Second)
	}
	watched := make(chan struct{})
	if n.src.watch != nil {
		go func() { defer close(watched); n.src.watch(watchCtx, n.rt, n.m, n.log) }()
	} else {
		close(watched)
	}
	n.log.Info("sluice serving", "version", n.cfg.Version, "http", n.HTTPAddr(), "admin_http", n.AdminHTTPAddr(), "grpc", n.GRPCAddr(), "store", n.storeName, "control", n.ctrlName, "data_dir", n.cfg.dataDir, "policy", n.lim.Policy().Version)

	var serveErr error
	select {
	case <-ctx.Done():
		n.log.Info("shutting down: draining requests")
	case serveErr = <-errs:
		n.log.Error("listener failed; shutting down", "err", serveErr)
	}
	n.healthSrv.Shutdown()
	n.healthcheck.Fail()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, srv := range []*http.Server{n.httpSrv, n.adminSrv, n.debugSrv, n.promSrv} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(shutdownCtx); err != nil {
			n.log.Warn("http shutdown", "err", err)
		}
	}
	stopped := make(chan struct{})
	go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-shutdownCtx.Done():
		n.grpcSrv.Stop()
	}
	stopWatch()
	<-watched
	n.rt.Close()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return serveErr
	}
	return nil
}

// Close unwinds what New built, last built first, and returns the first error; the store's
// state is saved (the memory store's snapshot) when the limiter closes. Call it after Run
// returns; a second call returns the first's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		for i := len(n.closers) - 1; i >= 0; i-- {
			if err := n.closers[i](); err != nil && n.closeErr == nil {
				n.closeErr = err
			}
		}
		n.closers = nil
	})
	return n.closeErr
}

// redisStats sums the figures of the Redis stores behind the node's store.
func redisStats(stores []*redisstore.Store) metrics.RedisStats {
	var sum metrics.RedisStats
	for _, st := range stores {
		s := st.Stats()
		sum.ScriptCalls += s.ScriptCalls
		sum.ScriptBatches += s.ScriptBatches
		sum.PlainDecided += s.PlainDecided
		sum.PlainFellBack += s.PlainFellBack
		sum.Redirects += s.Redirects
		sum.RoutedSlots += s.RoutedSlots
	}
	return sum
}

// openStore opens the store --store names: memory, or a Redis URL; with REDIS_PERSECOND, the
// limits of a second or less go to a Redis of their own (store/split). It returns the Redis
// stores behind it too, for their figures.
func openStore(ctx context.Context, c Config, log *slog.Logger) (sluice.Store, string, []*redisstore.Store, error) {
	if isMemory(c.storeURL) {
		if c.envoy.PerSecondStore != "" {
			return nil, "", nil, errors.New("REDIS_PERSECOND: the per-second Redis needs a Redis store for the other limits: set REDIS_URL (or --store)")
		}
		if c.envoy.KeyPrefix != "" {
			log.Info("CACHE_KEY_PREFIX: the memory store has its keys to itself; the prefix applies to Redis stores only")
		}
		return memory.New(memory.WithSnapshot(filepath.Join(c.dataDir, "memory.snapshot"), c.snapshotInterval), memory.WithLogger(log)), "memory", nil, nil
	}
	if !strings.HasPrefix(c.storeURL, "redis") {
		return nil, "", nil, fmt.Errorf("--store: %q is not memory or a redis://, rediss://, redis-sentinel:// or redis-cluster:// URL", c.storeURL)
	}
	storeURL, err := withKeyPrefix(c.storeURL, c.envoy.KeyPrefix)
	if err != nil {
		return nil, "", nil, err
	}
	st, err := redisstore.New(ctx, storeURL)
	if err != nil {
		return nil, "", nil, err
	}
	if c.envoy.PerSecondStore == "" {
		return st, "redis", []*redisstore.Store{st}, nil
	}
	perSecondURL, err := withKeyPrefix(c.envoy.PerSecondStore, c.envoy.KeyPrefix)
	if err != nil {
		st.Close()
		return nil, "", nil, err
	}
	perSecond, err := redisstore.New(ctx, perSecondURL)
	if err != nil {
		st.Close()
		return nil, "", nil, fmt.Errorf("REDIS_PERSECOND_URL: %w", err)
	}
	log.Info("limits of a second or less on their own Redis (REDIS_PERSECOND)", "per_second_store", redact(perSecondURL))
	return split.New(st, perSecond, split.DefaultCutoff), "redis", []*redisstore.Store{st, perSecond}, nil
}

// storeCheck is /readyz's check of st: its Ping, or always up for a store in this process.
func storeCheck(st sluice.Store) func(context.Context) error {
	return func(ctx context.Context) error { return store.Ping(ctx, st) }
}

// mustPolicy compiles a policy built into the binary.
func mustPolicy(yml string) *policy.Snapshot {
	snap, err := policy.LoadFiles(map[string][]byte{"built-in": []byte(yml)})
	if err != nil {
		panic(err) // a built-in policy that does not compile is a bug caught by the tests
	}
	return snap
}

// watchPolicy reloads the policy files on SIGHUP and when they change, and hands them to the
// runtime, which compiles them with the control store's state. A bad policy is logged,
// counted and ignored: the running one stays.
func watchPolicy(ctx context.Context, path string, rt *follower.Runtime, m *metrics.Metrics, log *slog.Logger, opts ...policy.LoadOption) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var events chan fsnotify.Event
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("policy file watching unavailable; reload with SIGHUP", "err", err)
	} else {
		defer watcher.Close()
		// Watch the folder, not the file: editors and ConfigMaps replace files by rename.
		dir := path
		if info, err := os.Stat(path); err == nil && !info.IsDir() {
			dir = filepath.Dir(path)
		}
		if err := watcher.Add(dir); err != nil {
			log.Warn("policy file watching unavailable; reload with SIGHUP", "dir", dir, "err", err)
		} else {
			events = watcher.Events
		}
	}
	reload := func(why string) {
		files, err := loadFiles(path, opts...)
		if err != nil {
			// Logged before counted: whoever sees the count finds the line.
			log.Error("policy reload failed; keeping the running policy", "trigger", why, "version", rt.Files().Version, "err", err)
			m.PolicyLoaded("", err)
			return
		}
		if files.Version == rt.Files().Version {
			return
		}
		if err := rt.SetFiles(files, why); err != nil {
			log.Error("policy reload failed; keeping the running policy", "trigger", why, "err", err)
			return
		}
		log.Info("policy files reloaded", "trigger", why, "files", Describe(files.Snapshot()))
	}
	// Changes come in bursts (write, chmod, rename): settle before reading.
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			reload("SIGHUP")
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if policyEvent(path, ev.Name) {
				settle = time.After(200 * time.Millisecond)
			}
		case <-settle:
			settle = nil
			reload("file change")
		}
	}
}
