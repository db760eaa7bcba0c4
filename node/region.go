package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tlsreload"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/region"
	"github.com/sluicehq/sluice/transport/regionrpc"
)

// regionFlags are serve's multi-region settings (docs/architecture.md, Regions).
type regionFlags struct {
	name    string
	regions string
	sync    time.Duration
	timeout time.Duration
	ca      string
	// tokenFile holds the region token; SLUICE_REGION_TOKEN wins when set.
	tokenFile string
}

// envRegionToken is the environment variable that holds the region token itself.
const envRegionToken = "SLUICE_REGION_TOKEN"

func (r *regionFlags) register(f *pflag.FlagSet) {
	f.StringVar(&r.name, "region", EnvDefault("SLUICE_REGION", ""), "this region's name; with --regions, rules with regions: global are one limit across the regions, and regions: home:NAME rules are decided in region NAME (SLUICE_REGION)")
	f.StringVar(&r.regions, "regions", EnvDefault("SLUICE_REGIONS", ""), "the other regions, NAME=ADDR,NAME=ADDR: the gRPC address of a node or load balancer in each (SLUICE_REGIONS)")
	f.DurationVar(&r.sync, "region-sync", durationEnv("SLUICE_REGION_SYNC", 100*time.Millisecond), "how often this region sends the others its counts of global rules (SLUICE_REGION_SYNC)")
	f.DurationVar(&r.timeout, "region-timeout", durationEnv("SLUICE_REGION_TIMEOUT", 5*time.Second), "a region not heard from for this long is down (sluice_region_peer_up 0); its last rate is assumed meanwhile (SLUICE_REGION_TIMEOUT)")
	f.StringVar(&r.tokenFile, "region-token-file", EnvDefault("SLUICE_REGION_TOKEN_FILE", ""), "file holding the secret every region's nodes share (at least 16 characters): sent with every call to another region, required of every call from one; "+envRegionToken+" wins when set (SLUICE_REGION_TOKEN_FILE)")
	f.StringVar(&r.ca, "region-ca", EnvDefault("SLUICE_REGION_CA", ""), "PEM CA bundle that the other regions' gRPC certificates are checked against: region links use TLS (and present --tls-cert, if set, as the client certificate) (SLUICE_REGION_CA)")
}

// regionConfig is a region node's configuration: the decorator's (store/region) and its
// links' (transport/regionrpc).
type regionConfig struct {
	region.Config
	regionrpc.Options
}

// config checks the flags and returns the region's configuration, or nil without --region.
// It touches nothing but the CA and certificate files it reads.
func (r regionFlags) config(clientCert, clientKey string, log *slog.Logger) (*regionConfig, error) {
	if r.name == "" {
		switch {
		case r.regions != "":
			return nil, errors.New("--regions: needs --region, this region's name")
		case r.ca != "":
			return nil, errors.New("--region-ca: needs --region")
		case r.tokenFile != "":
			return nil, errors.New("--region-token-file: needs --region")
		}
		return nil, nil
	}
	if msg := policy.ValidRegionName(r.name); msg != "" {
		return nil, fmt.Errorf("--region: %s", msg)
	}
	if r.sync < time.Millisecond || r.sync > time.Minute {
		return nil, fmt.Errorf("--region-sync: %s: want 1ms to 1m", r.sync)
	}
	if r.timeout <= r.sync {
		return nil, fmt.Errorf("--region-timeout: %s: must be longer than --region-sync (%s)", r.timeout, r.sync)
	}
	token, err := r.token()
	if err != nil {
		return nil, err
	}
	cfg := &regionConfig{Config: region.Config{Name: r.name, Peers: map[string]string{}, Sync: r.sync, Timeout: r.timeout, Log: log},
		Options: regionrpc.Options{Token: token, Log: log}}
	for _, pair := range strings.Split(r.regions, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, addr, ok := strings.Cut(pair, "=")
		if !ok || addr == "" {
			return nil, fmt.Errorf("--regions: %q is not NAME=ADDR", pair)
		}
		if msg := policy.ValidRegionName(name); msg != "" {
			return nil, fmt.Errorf("--regions: %s", msg)
		}
		if name == r.name {
			return nil, fmt.Errorf("--regions: %s is this region (--region); list the other regions", name)
		}
		if _, dup := cfg.Peers[name]; dup {
			return nil, fmt.Errorf("--regions: %s listed twice", name)
		}
		cfg.Peers[name] = addr
	}
	if r.ca != "" {
		pool, err := tlsreload.CertPool(r.ca)
		if err != nil {
			return nil, fmt.Errorf("--region-ca: %w", err)
		}
		cfg.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if clientCert != "" && clientKey != "" {
			cert, err := tls.LoadX509KeyPair(clientCert, clientKey)
			if err != nil {
				return nil, fmt.Errorf("--region-ca: client certificate from --tls-cert: %w", err)
			}
			cfg.TLS.Certificates = []tls.Certificate{cert}
		}
	}
	if cfg.TLS == nil && len(cfg.Peers) > 0 {
		log.Warn("region links are plaintext (no --region-ca): the region token and counts travel in clear; keep the links on a private network")
	}
	return cfg, nil
}

// token returns the region token: SLUICE_REGION_TOKEN, else the file's first line. Its
// value never reaches an error message or a log.
func (r regionFlags) token() (string, error) {
	tok := os.Getenv(envRegionToken)
	if tok == "" && r.tokenFile != "" {
		raw, err := os.ReadFile(r.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--region-token-file: %w", err)
		}
		tok, _, _ = strings.Cut(string(raw), "\n")
	}
	tok = strings.TrimSpace(tok)
	switch {
	case tok == "":
		return "", fmt.Errorf("--region-token-file: needed with --region (or %s): the other regions' calls must prove they are theirs", envRegionToken)
	case regionrpc.CheckToken(tok) != nil:
		return "", regionrpc.CheckToken(tok)
	}
	return tok, nil
}

// regionNode is a node's part in the regions, or nil for a node without --region: the store
// decorator and its gRPC transport.
type regionNode struct {
	r *region.Region
	t *regionrpc.Transport
}

// wrapRegion puts the region over st, the store as the limiter uses it; raw is the same store
// unguarded, which the sync reads. Without cfg it returns st.
func wrapRegion(cfg *regionConfig, st, raw sluice.Store) (sluice.Store, *regionNode, error) {
	if cfg == nil {
		return st, nil, nil
	}
	reader, ok := raw.(region.Reader)
	if !ok {
		return nil, nil, fmt.Errorf("--region: the store %T cannot list and read its keys", raw)
	}
	r, err := region.New(cfg.Config, st, reader, nil)
	if err != nil {
		return nil, nil, err
	}
	t, err := regionrpc.New(r, cfg.Options)
	if err != nil {
		return nil, nil, err
	}
	return r, &regionNode{r: r, t: t}, nil
}

// start serves the Regions service on s, exports the peer metrics and begins the sync, with
// lim's policy.
func (n *regionNode) start(s *grpc.Server, reg prometheus.Registerer, lim *sluice.Limiter, log *slog.Logger) error {
	if n == nil {
		return nil
	}
	n.r.UsePolicy(lim.Policy)
	n.t.Register(s)
	reg.MustRegister(n.t)
	if err := n.r.Start(n.t.Dial); err != nil {
		return err
	}
	log.Info("region sync on", "region", n.r.Name(), "peers", len(n.r.Peers()))
	return nil
}
