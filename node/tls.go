package node

import (
	"errors"
	"log/slog"
	"net"
	"net/http"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// tlsFlags are serve's TLS settings for its HTTP and gRPC listeners. TLS is off unless a
// certificate is given.
type tlsFlags struct {
	cert     string
	key      string
	clientCA string
}

func (t *tlsFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.cert, "tls-cert", EnvDefault("SLUICE_TLS_CERT", ""), "PEM certificate chain for HTTPS and gRPC over TLS, reloaded when the file changes; needs --tls-key (SLUICE_TLS_CERT)")
	f.StringVar(&t.key, "tls-key", EnvDefault("SLUICE_TLS_KEY", ""), "PEM private key of --tls-cert, reloaded with it (SLUICE_TLS_KEY)")
	f.StringVar(&t.clientCA, "tls-client-ca", EnvDefault("SLUICE_TLS_CLIENT_CA", ""), "PEM CA bundle: clients of HTTP and gRPC must present a certificate it signed (mutual TLS), reloaded when the file changes (SLUICE_TLS_CLIENT_CA)")
}

// open returns the reloader of the certificate files, or nil when TLS is off.
func (t tlsFlags) open(log *slog.Logger) (*tlsreload.Reloader, error) {
	if t.cert == "" && t.key == "" {
		if t.clientCA != "" {
			return nil, errors.New("--tls-client-ca: needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	if t.cert == "" {
		return nil, errors.New("--tls-key: needs --tls-cert")
	}
	if t.key == "" {
		return nil, errors.New("--tls-cert: needs --tls-key")
	}
	r, err := tlsreload.New(tlsreload.Options{CertFile: t.cert, KeyFile: t.key, ClientCAFile: t.clientCA, Logger: log})
	if err != nil {
		return nil, err
	}
	leaf := r.Certificate().Leaf
	log.Info("tls on for http and grpc", "cert", t.cert, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter, "mutual", r.MutualTLS())
	return r, nil
}

// grpcCreds is the gRPC server's transport security: TLS from r, or none when r is nil.
func grpcCreds(r *tlsreload.Reloader) grpc.ServerOption {
	if r == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.Creds(credentials.NewTLS(r.ServerConfig("h2")))
}

// serveHTTP serves srv on ln, over TLS from r unless r is nil.
func serveHTTP(srv *http.Server, ln net.Listener, r *tlsreload.Reloader) error {
	if r == nil {
		return srv.Serve(ln)
	}
	srv.TLSConfig = r.ServerConfig("h2", "http/1.1")
	return srv.ServeTLS(ln, "", "")
}
