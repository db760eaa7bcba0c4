package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// What a node serves for the reference service's variables (envoy_env.go reads them): gRPC
// TLS of its own, connection ages, the debug and Prometheus listeners, and a health service
// that follows the store.

// openEnvoyGRPCTLS opens GRPC_SERVER_USE_TLS's files for the gRPC listener; with it off it
// returns server, the TLS of both listeners (--tls-cert), or nil. Both at once is an error:
// one of them would be ignored.
func openEnvoyGRPCTLS(g envoyGRPCTLS, server *tlsreload.Reloader, log *slog.Logger) (*tlsreload.Reloader, error) {
	if g.Cert == "" {
		return server, nil
	}
	if server != nil {
		return nil, errors.New("GRPC_SERVER_USE_TLS: --tls-cert (SLUICE_TLS_CERT) is set too; use one: --tls-cert for HTTP and gRPC, GRPC_SERVER_TLS_CERT for gRPC alone")
	}
	r, err := tlsreload.New(tlsreload.Options{CertFile: g.Cert, KeyFile: g.Key, ClientCAFile: g.ClientCA, ClientSAN: g.ClientSAN, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT: %w", err)
	}
	leaf := r.Certificate().Leaf
	log.Info("tls on for grpc (GRPC_SERVER_USE_TLS)", "cert", g.Cert, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter, "mutual", r.MutualTLS(), "client_san", g.ClientSAN)
	return r, nil
}

// envoyKeepalive closes gRPC connections after GRPC_MAX_CONNECTION_AGE (plus its grace), so
// that clients spread over new nodes; none when it is unset.
func envoyKeepalive(s envoySettings) grpc.ServerOption {
	if s.MaxConnectionAge == 0 && s.MaxConnectionAgeGrace == 0 {
		return grpc.EmptyServerOption{}
	}
	return grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: s.MaxConnectionAge, MaxConnectionAgeGrace: s.MaxConnectionAgeGrace})
}

// logEnvoyNotes logs each of the reference's variables that is accepted where Sluice works
// otherwise, and what Sluice does instead.
func logEnvoyNotes(s envoySettings, log *slog.Logger) {
	for _, n := range s.Notes {
		log.Info("Envoy reference setting accepted; Sluice differs", "var", n.Var, "note", n.Note)
	}
}

// listenEnvoyExtras binds the reference's extra listeners that its variables ask for: the
// debug port (DEBUG_HOST, DEBUG_PORT) with Go's profiles, and the Prometheus port
// (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH) with the metrics of reg. Run serves them.
func (n *Node) listenEnvoyExtras(s envoySettings, reg *prometheus.Registry, log *slog.Logger) error {
	var err error
	if s.DebugAddr != "" {
		if n.debugLn, err = net.Listen("tcp", s.DebugAddr); err != nil {
			return fmt.Errorf("DEBUG_HOST, DEBUG_PORT: %w", err)
		}
		n.onClose(ignoreClosed(n.debugLn.Close))
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		n.debugSrv = httpServer(mux, log)
		n.debugSrv.WriteTimeout = 0 // a CPU profile takes the seconds it is asked for
		log.Info("debug listener (DEBUG_PORT): Go profiles at /debug/pprof/", "addr", n.debugLn.Addr().String())
	}
	if s.PrometheusAddr != "" {
		if n.promLn, err = net.Listen("tcp", s.PrometheusAddr); err != nil {
			return fmt.Errorf("PROMETHEUS_ADDR: %w", err)
		}
		n.onClose(ignoreClosed(n.promLn.Close))
		mux := http.NewServeMux()
		mux.Handle(s.PrometheusPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		n.promSrv = httpServer(mux, log)
		log.Info("prometheus listener (USE_PROMETHEUS)", "addr", n.promLn.Addr().String(), "path", s.PrometheusPath)
	}
	return nil
}

// DebugAddr is the address of the debug listener of DEBUG_PORT, or "" without it.
func (n *Node) DebugAddr() string {
	if n.debugLn == nil {
		return ""
	}
	return n.debugLn.Addr().String()
}

// PrometheusAddr is the address of the metrics listener of USE_PROMETHEUS, or "" without it.
func (n *Node) PrometheusAddr() string {
	if n.promLn == nil {
		return ""
	}
	return n.promLn.Addr().String()
}

// followStoreHealth sets the gRPC health service to NOT_SERVING while check fails, and back
// to SERVING when it passes, looking every interval until ctx ends
// (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, as /healthcheck does on each probe). A health server
// that was shut down ignores it.
func followStoreHealth(ctx context.Context, hs *health.Server, check func(context.Context) error, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, interval)
		err := check(callCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		state := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			state = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", state)
	}
}
