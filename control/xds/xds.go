// Package xds takes Envoy rate limit domains from an xDS server, as Envoy's reference rate
// limit service does with CONFIG_TYPE=GRPC_XDS_SOTW: one aggregated (ADS) state-of-the-world
// stream that asks for the resources of type RateLimitConfig
// (ratelimit.config.ratelimit.v3). Each response is turned into documents in the reference's
// YAML format, one per resource, and handed to Options.Apply, which validates and swaps them
// in; a response Apply refuses is NACKed with its error and the last good configuration stays.
// While the server is away the client retries every RetryInterval and the last configuration
// stays in force.
package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// DefaultRetryInterval is the reference's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL.
const DefaultRetryInterval = 3 * time.Second

// nackRepeatDelay is how long the client waits before it NACKs again a configuration it has
// NACKed already, with the same error.
const nackRepeatDelay = 500 * time.Millisecond

// Options configure a Client. Server and Apply are required.
type Options struct {
	// Server is the xDS server's gRPC target, host:port (CONFIG_GRPC_XDS_SERVER_URL).
	Server string
	// NodeID is the node id the client announces; the server picks the snapshot by it
	// (CONFIG_GRPC_XDS_NODE_ID).
	NodeID string
	// NodeMetadata is the node's metadata, sent as string fields
	// (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are gRPC metadata sent on the stream (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// RetryInterval is the wait between attempts while the server cannot be reached or the
	// stream fails, with up to half of it added at random so that a fleet does not retry in
	// step; 0 is DefaultRetryInterval.
	RetryInterval time.Duration
	// MaxRetryInterval, when above RetryInterval, makes the wait double at each failed
	// attempt in a row up to it; 0 keeps every wait at RetryInterval.
	MaxRetryInterval time.Duration
	// TLS, when not nil, is the TLS configuration towards the server; nil is plaintext.
	TLS *tls.Config
	// MaxMessageBytes bounds a response's size; 0 is gRPC's default (4 MiB).
	MaxMessageBytes int
	// Apply takes the configuration of one response: its version and the reference-format
	// YAML documents of its resources, named by Document. It is called from one goroutine at
	// a time. An error NACKs the response; the caller keeps its last good configuration.
	Apply func(version string, docs map[string][]byte) error
	// Logger receives the stream's events; nil is slog.Default().
	Logger *slog.Logger
}

// Client keeps an ADS stream to one xDS server. Build it with New, run it with Run.
type Client struct {
	o    Options
	conn *grpc.ClientConn
	node *corepb.Node
	log  *slog.Logger

	mu    sync.Mutex
	state State
}

// State is what a Client has seen, for logs and tests.
type State struct {
	// Acked is the version of the last configuration applied; empty before the first.
	Acked string
	// Nacked is the version of the last configuration refused, and NackErr its error.
	Nacked, NackErr string
	// Connected tells whether the current stream has had a response from the server.
	Connected bool
}

// New checks o and prepares the connection; nothing is dialled until Run.
func New(o Options) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("xds: no server address")
	}
	if o.Apply == nil {
		return nil, errors.New("xds: no Apply function")
	}
	if o.RetryInterval < 0 {
		return nil, fmt.Errorf("xds: retry interval %v is negative", o.RetryInterval)
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.MaxRetryInterval < o.RetryInterval {
		o.MaxRetryInterval = o.RetryInterval
	}
	if o.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("xds: max message size %d is negative", o.MaxMessageBytes)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	node := &corepb.Node{Id: o.NodeID, UserAgentName: "sluice"}
	if len(o.NodeMetadata) > 0 {
		fields := make(map[string]any, len(o.NodeMetadata))
		for k, v := range o.NodeMetadata {
			fields[k] = v
		}
		md, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, fmt.Errorf("xds: node metadata: %w", err)
		}
		node.Metadata = md
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// A server that went away without closing the connection is found in seconds, not
		// the kernel's minutes, so the client starts retrying.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		// gRPC's own reconnection backs off up to 120 s, which would outlast RetryInterval
		// by far once the server has been away a while: reconnect at its pace instead.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: o.RetryInterval, Multiplier: 2, Jitter: 0.2, MaxDelay: o.MaxRetryInterval,
		}}),
	}
	if o.MaxMessageBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMessageBytes)))
	}
	conn, err := grpc.NewClient(o.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("xds: server %q: %w", o.Server, err)
	}
	return &Client{o: o, conn: conn, node: node, log: o.Logger.With("xds_server", o.Server)}, nil
}

// State returns what the client has seen so far.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Close releases the connection. Call it after Run returns.
func (c *Client) Close() error { return c.conn.Close() }

// Run keeps a stream to the server until ctx ends: when the stream cannot be opened or
// fails, it waits RetryInterval (doubling up to MaxRetryInterval while attempts fail in a
// row, plus up to half at random) and opens a new one, announcing the version it
// last applied so that a server with nothing newer sends nothing.
func (c *Client) Run(ctx context.Context) {
	failures := 0
	for {
		err := c.stream(ctx)
		if c.State().Connected {
			failures = 0
		}
		c.setConnected(false)
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := retryWait(failures, c.o.RetryInterval, c.o.MaxRetryInterval)
		wait += rand.N(wait/2 + 1)
		// Logged as a warning when the stream is lost and every 20th attempt after; the
		// attempts between are debug lines, not a warning every few seconds.
		level := slog.LevelDebug
		if failures%20 == 1 {
			level = slog.LevelWarn
		}
		c.log.Log(ctx, level, "xDS stream ended; keeping the last configuration and retrying", "err", err, "attempts", failures, "retry_in", wait.Round(time.Millisecond), "version", c.State().Acked)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// retryWait is the wait after the failures-th failed attempt in a row, before jitter: base,
// doubled at each further failure, at most max.
func retryWait(failures int, base, longest time.Duration) time.Duration {
	longest = max(base, longest)
	wait := base
	for i := 1; i < failures && wait < longest; i++ {
		wait *= 2
	}
	return min(wait, longest)
}

func (c *Client) setConnected(v bool) {
	c.mu.Lock()
	c.state.Connected = v
	c.mu.Unlock()
}

// stream runs one ADS stream until it fails or ctx ends.
func (c *Client) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		kv := make([]string, 0, 2*len(c.o.Headers))
		for k, v := range c.o.Headers {
			kv = append(kv, k, v)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("open stream: %w", err)
	}
	acked := c.State().Acked
	if err := s.Send(&discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, VersionInfo: acked}); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	first := true
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("the server closed the stream")
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if first {
			first = false
			c.setConnected(true)
			c.log.Info("xDS stream open", "node_id", c.o.NodeID)
		}
		req := &discoverypb.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if err := c.apply(resp); err != nil {
			c.mu.Lock()
			repeat := c.state.Nacked == resp.GetVersionInfo() && c.state.NackErr == err.Error()
			c.state.Nacked, c.state.NackErr = resp.GetVersionInfo(), err.Error()
			req.VersionInfo = c.state.Acked
			c.mu.Unlock()
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			if !repeat {
				c.log.Error("xDS configuration refused (NACK); keeping the last one", "version", resp.GetVersionInfo(), "kept", req.VersionInfo, "err", err)
			} else {
				// A snapshot cache answers a NACK with the same snapshot at once, and would
				// again after every NACK: the loop is slowed to one round per
				// nackRepeatDelay. A fixed snapshot is sent after the delayed NACK, so it
				// is late by that much at most.
				c.log.Debug("xDS configuration refused again (NACK)", "version", resp.GetVersionInfo())
				t := time.NewTimer(nackRepeatDelay)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			}
		} else {
			c.mu.Lock()
			c.state.Acked = resp.GetVersionInfo()
			c.mu.Unlock()
			req.VersionInfo = resp.GetVersionInfo()
			c.log.Info("xDS configuration applied", "version", resp.GetVersionInfo(), "resources", len(resp.GetResources()))
		}
		if err := s.Send(req); err != nil {
			return fmt.Errorf("send ack: %w", err)
		}
	}
}

// apply converts one response and hands it to Options.Apply.
func (c *Client) apply(resp *discoverypb.DiscoveryResponse) error {
	if resp.GetTypeUrl() != TypeURL {
		return fmt.Errorf("type_url: %q is not %s", resp.GetTypeUrl(), TypeURL)
	}
	docs, err := Documents(resp.GetResources())
	if err != nil {
		return err
	}
	return c.o.Apply(resp.GetVersionInfo(), docs)
}
