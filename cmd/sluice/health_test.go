package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runHealth runs `sluice health args...` and returns its output and error.
func runHealth(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := healthCommand()
	cmd.SilenceErrors, cmd.SilenceUsage = true, true // as the root command is
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// wantExit checks that err is the exit code code with a message containing msg.
func wantExit(t *testing.T, err error, code int, msg string) {
	t.Helper()
	var ee exitError
	if !errors.As(err, &ee) {
		t.Fatalf("error %v (%T), want exit code %d", err, err, code)
	}
	if ee.code != code || !strings.Contains(ee.msg, msg) {
		t.Fatalf("exit %d %q, want exit %d containing %q", ee.code, ee.msg, code, msg)
	}
}

// TestHealthExitCodes: 200 is healthy (exit 0, the status printed for `docker inspect`);
// any other status, no answer, a redirect or an answer slower than --timeout is exit 1, with
// the reason.
func TestHealthExitCodes(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"store":"down"}`))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/healthz", http.StatusFound) })
	release := make(chan struct{})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close: the slow handler returns

	closed := httptest.NewServer(mux)
	closedURL := closed.URL
	closed.Close()

	tests := []struct {
		name string
		args []string
		err  string // "" for healthy
	}{
		{name: "200 is healthy", args: []string{"--url", srv.URL + "/healthz"}},
		{name: "503 names the status and body", args: []string{"--url", srv.URL + "/readyz"}, err: `503 Service Unavailable: {"store":"down"}`},
		{name: "404", args: []string{"--url", srv.URL + "/nothing"}, err: "404 Not Found"},
		{name: "a redirect is not followed", args: []string{"--url", srv.URL + "/moved"}, err: "302 Found"},
		{name: "nothing listening", args: []string{"--url", closedURL + "/healthz"}, err: "connection refused"},
		{name: "slower than --timeout", args: []string{"--url", srv.URL + "/slow", "--timeout", "100ms"}, err: "Client.Timeout"},
		{name: "bad timeout", args: []string{"--url", srv.URL + "/healthz", "--timeout", "0s"}, err: "--timeout"},
		{name: "a cert without its key", args: []string{"--url", srv.URL + "/healthz", "--cert-file", "x.crt"}, err: "--cert-file and --key-file go together"},
		{name: "missing CA file", args: []string{"--url", srv.URL + "/healthz", "--ca-file", filepath.Join(t.TempDir(), "none.pem")}, err: "--ca-file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := runHealth(t, tc.args...)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("unhealthy: %v", err)
				}
				if !strings.Contains(out, "200 OK") {
					t.Errorf("output %q, want the status", out)
				}
				return
			}
			wantExit(t, err, 1, tc.err)
		})
	}
	if _, err := runHealth(t, "--url", srv.URL+"/healthz", "extra"); err == nil {
		t.Error("a positional argument was accepted")
	}
}

// TestHealthDefaultURL: without --url the probe asks /healthz on the port SLUICE_HTTP serves,
// on loopback when that address is a wildcard, and over https when SLUICE_TLS_CERT is set.
func TestHealthDefaultURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr string
		tls  bool
		want string
		err  bool
	}{
		{addr: "127.0.0.1:8080", want: "http://127.0.0.1:8080/healthz"},
		{addr: ":9090", want: "http://127.0.0.1:9090/healthz"},
		{addr: "0.0.0.0:8080", want: "http://127.0.0.1:8080/healthz"},
		{addr: "[::]:8080", want: "http://[::1]:8080/healthz"},
		{addr: "10.1.2.3:8080", want: "http://10.1.2.3:8080/healthz"},
		{addr: "[fd00::1]:8080", tls: true, want: "https://[fd00::1]:8080/healthz"},
		{addr: "0.0.0.0:8443", tls: true, want: "https://127.0.0.1:8443/healthz"},
		{addr: "8080", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			got, err := defaultHealthURL(tc.addr, tc.tls)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "SLUICE_HTTP") {
					t.Fatalf("got %q, %v; want an error naming SLUICE_HTTP", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestHealthEnvironment: the command itself takes its default from SLUICE_HTTP, as the image's
// HEALTHCHECK relies on. Not parallel: it sets the environment.
func TestHealthEnvironment(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	t.Setenv("SLUICE_HTTP", "0.0.0.0:"+port)
	t.Setenv("SLUICE_TLS_CERT", "")
	out, err := runHealth(t)
	if err != nil {
		t.Fatalf("unhealthy: %v", err)
	}
	if want := "http://127.0.0.1:" + port + "/healthz: 200 OK"; !strings.Contains(out, want) {
		t.Errorf("output %q, want %q", out, want)
	}
}

// TestHealthTLS: over https the server's certificate is verified (against --ca-file, or
// skipped only with --insecure), and a server that asks for a client certificate gets the one
// --cert-file and --key-file name.
func TestHealthTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })

	srv := httptest.NewTLSServer(ok)
	t.Cleanup(srv.Close)
	serverCA := writePEM(t, dir, "server-ca.pem", "CERTIFICATE", srv.Certificate().Raw)

	clientCA, clientCAKey := newCert(t, "client CA", nil, nil, true)
	clientCert, clientKey := newCert(t, "client", clientCA, clientCAKey, false)
	otherCA, otherCAKey := newCert(t, "other CA", nil, nil, true)
	otherCert, otherKey := newCert(t, "intruder", otherCA, otherCAKey, false)
	certFile := writePEM(t, dir, "client.crt", "CERTIFICATE", clientCert.Raw)
	keyFile := writePEM(t, dir, "client.key", "PRIVATE KEY", marshalKey(t, clientKey))
	otherCertFile := writePEM(t, dir, "other.crt", "CERTIFICATE", otherCert.Raw)
	otherKeyFile := writePEM(t, dir, "other.key", "PRIVATE KEY", marshalKey(t, otherKey))

	mtls := httptest.NewUnstartedServer(ok)
	pool := x509.NewCertPool()
	pool.AddCert(clientCA)
	mtls.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	mtls.StartTLS()
	t.Cleanup(mtls.Close)
	mtlsCA := writePEM(t, dir, "mtls-ca.pem", "CERTIFICATE", mtls.Certificate().Raw)

	tests := []struct {
		name string
		args []string
		err  string
	}{
		{name: "unknown CA is refused", args: []string{"--url", srv.URL}, err: "certificate"},
		{name: "--ca-file", args: []string{"--url", srv.URL, "--ca-file", serverCA}},
		{name: "--insecure", args: []string{"--url", srv.URL, "--insecure"}},
		{name: "mTLS without a client certificate", args: []string{"--url", mtls.URL, "--ca-file", mtlsCA}, err: "unhealthy"},
		{name: "mTLS with a certificate of another CA", args: []string{"--url", mtls.URL, "--ca-file", mtlsCA, "--cert-file", otherCertFile, "--key-file", otherKeyFile}, err: "unhealthy"},
		{name: "mTLS with the client certificate", args: []string{"--url", mtls.URL, "--ca-file", mtlsCA, "--cert-file", certFile, "--key-file", keyFile}},
		{name: "a CA file without PEM", args: []string{"--url", srv.URL, "--ca-file", keyFile + ".none"}, err: "--ca-file"},
		{name: "a key that is not the certificate's", args: []string{"--url", mtls.URL, "--cert-file", certFile, "--key-file", otherKeyFile}, err: "--cert-file, --key-file"},
	}
	if err := os.WriteFile(keyFile+".none", []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The default 2 s is not what this checks, and eight TLS handshakes in parallel
			// with the other packages' tests under -race have run past it.
			_, err := runHealth(t, append(tc.args, "--timeout", "30s")...)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("unhealthy: %v", err)
				}
				return
			}
			wantExit(t, err, 1, tc.err)
		})
	}
}

// newCert makes an ECDSA certificate named cn, signed by parent (self-signed when nil).
func newCert(t *testing.T, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage = nil
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func marshalKey(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
