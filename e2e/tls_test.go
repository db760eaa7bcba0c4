package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/testca"
)

// tlsClient is a client configuration trusting serverCA and presenting pair when given.
func tlsClient(t *testing.T, serverCA *testca.CA, pair *testca.Pair) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: serverCA.Pool()}
	if pair != nil {
		cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// httpsClient opens a new connection for every request, so each sees the certificate the
// server serves at that moment.
func httpsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// httpsCheck posts one decision over HTTPS and returns the status and the serial of the
// certificate the server presented.
func httpsCheck(c *http.Client, addr string) (int, *big.Int, error) {
	resp, err := c.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"tenant":"acme","user":"tls"}`))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return resp.StatusCode, nil, err
	}
	return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber, nil
}

// grpcCheck makes one sluice.v1 Check over a new connection with creds.
func grpcCheck(t *testing.T, addr string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = sluicev1.NewRateLimiterClient(conn).Check(ctx, &sluicev1.CheckRequest{Tenant: "acme", User: "tls"})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// TestMutualTLS runs serve with --tls-cert, --tls-key and --tls-client-ca: plain HTTP and gRPC
// are refused, clients with a certificate from the client CA are served (gRPC health and
// reflection too), clients from another CA are refused, and a certificate written over the
// files is served on new connections by the same process.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCA, clientCA := testca.New(t, "server CA"), testca.New(t, "client CA")
	first := serverCA.Server(t, "sluice first")
	certFile, keyFile := first.Files(t, dir, "server")
	caFile := clientCA.File(t, dir, "clients.pem")
	good := clientCA.Client(t, "good client")
	goodTLS := tlsClient(t, serverCA, &good)
	s := startWith(t, binary, "", filepath.Join(dir, "data"),
		[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile},
		httpsClient(goodTLS), "https")

	t.Run("plain HTTP refused", func(t *testing.T) {
		resp, err := http.Post("http://"+s.http+"/v1/check", "application/json", strings.NewReader(`{"user":"plain"}`))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || strings.Contains(string(body), "allowed") {
				t.Fatalf("plain HTTP decided: %s %s", resp.Status, body)
			}
		}
	})
	t.Run("plain gRPC refused", func(t *testing.T) {
		if conn, err := grpcCheck(t, s.grpc, insecure.NewCredentials()); err == nil {
			conn.Close()
			t.Fatal("plain gRPC decided")
		}
	})
	t.Run("valid client certificate accepted", func(t *testing.T) {
		code, serial, err := httpsCheck(httpsClient(goodTLS), s.http)
		if err != nil || code != http.StatusOK || serial.Cmp(first.Serial) != 0 {
			t.Fatalf("HTTPS: %d %v %v", code, serial, err)
		}
		conn, err := grpcCheck(t, s.grpc, credentials.NewTLS(goodTLS))
		if err != nil {
			t.Fatalf("gRPC over TLS: %v", err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("gRPC health over TLS: %v %v", h, err)
		}
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		out, err := stream.Recv()
		if err != nil || !strings.Contains(out.String(), "sluice.v1") {
			t.Fatalf("gRPC reflection over TLS: %v %v", out, err)
		}
	})
	wrong := testca.New(t, "another CA").Client(t, "stranger")
	for name, cfg := range map[string]*tls.Config{
		"client certificate from another CA refused": tlsClient(t, serverCA, &wrong),
		"no client certificate refused":              tlsClient(t, serverCA, nil),
	} {
		t.Run(name, func(t *testing.T) {
			if code, _, err := httpsCheck(httpsClient(cfg), s.http); err == nil {
				t.Fatalf("HTTPS answered %d", code)
			}
			if conn, err := grpcCheck(t, s.grpc, credentials.NewTLS(cfg)); err == nil {
				conn.Close()
				t.Fatal("gRPC decided")
			}
		})
	}
	t.Run("rotated certificate served without a restart", func(t *testing.T) {
		next := serverCA.Server(t, "sluice second")
		next.Write(t, certFile, keyFile)
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, serial, err := httpsCheck(httpsClient(goodTLS), s.http)
			if err == nil && serial.Cmp(next.Serial) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("still serving serial %v (%v) 10 s after the files changed, want %v", serial, err, next.Serial)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// gRPC takes the same files.
		var state tls.ConnectionState
		cfg := goodTLS.Clone()
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { state = cs; return nil }
		conn, err := grpcCheck(t, s.grpc, credentials.NewTLS(cfg))
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if got := state.PeerCertificates[0].SerialNumber; got.Cmp(next.Serial) != 0 {
			t.Fatalf("gRPC serves serial %v, want the rotated %v", got, next.Serial)
		}
		if s.cmd.ProcessState != nil {
			t.Fatal("the server restarted")
		}
		// The certificate is served before the reload is logged.
		waitFor(t, 10*time.Second, "the reload in the log", func() bool {
			return strings.Contains(s.log.String(), "tls certificate reloaded")
		})
	})
}

// TestTLSFromEnv turns TLS on with SLUICE_TLS_CERT and SLUICE_TLS_KEY alone: clients without a
// certificate are served, plain gRPC is not.
func TestTLSFromEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testca.New(t, "server CA")
	certFile, keyFile := ca.Server(t, "sluice").Files(t, dir, "server")
	cfg := tlsClient(t, ca, nil)
	s := startWith(t, binary, "", filepath.Join(dir, "data"), nil, httpsClient(cfg), "https",
		"SLUICE_TLS_CERT="+certFile, "SLUICE_TLS_KEY="+keyFile)
	if code, _, err := httpsCheck(httpsClient(cfg), s.http); err != nil || code != http.StatusOK {
		t.Fatalf("HTTPS without a client certificate: %d %v", code, err)
	}
	conn, err := grpcCheck(t, s.grpc, credentials.NewTLS(cfg))
	if err != nil {
		t.Fatalf("gRPC over TLS: %v", err)
	}
	conn.Close()
	if conn, err := grpcCheck(t, s.grpc, insecure.NewCredentials()); err == nil {
		conn.Close()
		t.Fatal("plain gRPC decided")
	}
	s.stop()
}

func TestServeRejectsBadTLSFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := testca.New(t, "CA").Server(t, "s").Files(t, dir, "s")
	junk := filepath.Join(dir, "junk.pem")
	testca.WriteFile(t, junk, []byte("junk"))
	for _, c := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"certificate without key", []string{"--tls-cert", certFile}, "--tls-key"},
		{"key without certificate", []string{"--tls-key", keyFile}, "--tls-cert"},
		{"client CA alone", []string{"--tls-client-ca", certFile}, "--tls-cert"},
		{"certificate not PEM", []string{"--tls-cert", junk, "--tls-key", keyFile}, "junk.pem"},
		{"client CA not PEM", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", junk}, "junk.pem"},
		{"missing key file", []string{"--tls-cert", certFile, "--tls-key", filepath.Join(dir, "none.key")}, "none.key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A serve that accepted the flags would run until killed: the deadline turns that
			// into a failure rather than a hang.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			args := append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir()}, c.flags...)
			out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) {
				t.Errorf("serve %v: %v, output %q; want a failure naming %s", c.flags, err, out, c.want)
			}
		})
	}
}
