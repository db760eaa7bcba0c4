// Package xdstest runs go-control-plane's own xDS server (pkg/server/v3 on a snapshot cache)
// on a loopback port for tests: the server Envoy's control planes are built on, so that
// Sluice's xDS client is tested against the real protocol, not a copy of it.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Server is one xDS server. Addr stays the same across Restart; the snapshots do not (a
// restarted control plane starts empty, as a real one does). Its methods are safe for
// concurrent use.
type Server struct {
	// Addr is "127.0.0.1:PORT".
	Addr string

	t        testing.TB
	tls      *tls.Config // nil: plaintext
	mu       sync.Mutex
	cache    cachev3.SnapshotCache
	srv      *grpc.Server
	cancel   context.CancelFunc
	requests []*discoverypb.DiscoveryRequest
	headers  metadata.MD // of the last stream opened
}

// Start starts a server on a free loopback port; it stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, Addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// StartTLS is Start with the server speaking TLS as cfg says (a certificate, and ClientCAs
// with ClientAuth for mutual TLS).
func StartTLS(t testing.TB, cfg *tls.Config) *Server {
	t.Helper()
	s := &Server{t: t, Addr: "127.0.0.1:0", tls: cfg}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	var ln net.Listener
	var err error
	// The port of a stopped server is free at once on Linux; a few tries cover a slow close.
	for range 50 {
		if ln, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("xdstest: listen %s: %v", s.Addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	cb := serverv3.CallbackFuncs{StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		s.mu.Lock()
		s.headers = md.Copy()
		s.mu.Unlock()
		return nil
	}, StreamRequestFunc: func(_ int64, req *discoverypb.DiscoveryRequest) error {
		s.mu.Lock()
		s.requests = append(s.requests, req)
		s.mu.Unlock()
		return nil
	}}
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	srv := grpc.NewServer(opts...)
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(ctx, cache, cb))
	s.mu.Lock()
	s.Addr, s.cache, s.srv, s.cancel = ln.Addr().String(), cache, srv, cancel
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// Set publishes a snapshot of version holding cfgs for the node id.
func (s *Server) Set(nodeID, version string, cfgs ...*rlsconfpb.RateLimitConfig) {
	s.t.Helper()
	res := make([]cachetypes.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatalf("xdstest: snapshot: %v", err)
	}
	s.mu.Lock()
	cache := s.cache
	s.mu.Unlock()
	if err := cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		s.t.Fatalf("xdstest: set snapshot: %v", err)
	}
}

// Requests returns the discovery requests the server has received, ACKs and NACKs included.
func (s *Server) Requests() []*discoverypb.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoverypb.DiscoveryRequest(nil), s.requests...)
}

// Headers returns the gRPC metadata of the last stream opened.
func (s *Server) Headers() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.headers.Copy()
}

// Stop stops the server, closing its streams; a second Stop does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	srv, cancel := s.srv, s.cancel
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	cancel()
	srv.Stop()
}

// Restart starts a new, empty server on the same address.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Config is a RateLimitConfig of one domain whose descriptors each limit key=value to
// perMinute requests a minute, a shorthand for tests.
func Config(name, domain string, perMinute uint32, keyValues ...[2]string) *rlsconfpb.RateLimitConfig {
	c := &rlsconfpb.RateLimitConfig{Name: name, Domain: domain}
	for _, kv := range keyValues {
		c.Descriptors = append(c.Descriptors, &rlsconfpb.RateLimitDescriptor{
			Key: kv[0], Value: kv[1],
			RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
		})
	}
	return c
}
