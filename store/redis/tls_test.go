package redis

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testca"
	"github.com/sluicehq/sluice/store"
)

// TestTLS talks to a real redis-server over TLS, its certificate signed by a CA the test makes;
// the store trusts it through tls_ca_file, and refuses it without.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCertificates(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	redistest.Start(t, redistest.WithConfig(
		"tls-port "+strconv.Itoa(tlsPort),
		"tls-cert-file "+certFile, "tls-key-file "+keyFile, "tls-ca-cert-file "+caFile,
		"tls-auth-clients no",
	))
	url := "rediss://127.0.0.1:" + strconv.Itoa(tlsPort)
	if _, err := New(ctx, url, WithTimeout(2*time.Second)); err == nil {
		t.Fatal("connected over TLS to a certificate from an unknown CA")
	}
	c := newClock()
	st := connect(t, url+"?tls_ca_file="+caFile, c)
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 2, 0, time.Minute)
	res := make([]algorithm.Result, 1)
	for i := range 3 {
		if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: key.AppendHead(nil, "tls", "1"), Params: &p, Cost: 1}}}, res); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i < 2) {
			t.Fatalf("request %d over TLS: allowed=%v", i, res[0].Allowed)
		}
	}
}

// writeCertificates makes a CA and a certificate for 127.0.0.1 signed by it, as PEM files.
func writeCertificates(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestTLSClientCertificate talks to a real redis-server that requires client certificates
// (tls-auth-clients yes): the store gets in with tls_cert_file and tls_key_file from the CA
// Redis trusts, and not without them or with a certificate from another CA.
func TestTLSClientCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testca.New(t, "redis CA")
	caFile := ca.File(t, dir, "ca.pem")
	srvCert, srvKey := ca.Server(t, "redis").Files(t, dir, "redis")
	cliCert, cliKey := ca.Client(t, "sluice").Files(t, dir, "client")
	strangerCert, strangerKey := testca.New(t, "another CA").Client(t, "stranger").Files(t, dir, "stranger")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	redistest.Start(t, redistest.WithConfig(
		"tls-port "+strconv.Itoa(tlsPort),
		"tls-cert-file "+srvCert, "tls-key-file "+srvKey, "tls-ca-cert-file "+caFile,
		"tls-auth-clients yes",
	))
	base := "rediss://127.0.0.1:" + strconv.Itoa(tlsPort) + "?tls_ca_file=" + caFile
	for _, c := range []struct{ name, query string }{
		{"no client certificate", ""},
		{"client certificate from another CA", "&tls_cert_file=" + strangerCert + "&tls_key_file=" + strangerKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			if st, err := New(ctx, base+c.query, WithTimeout(2*time.Second)); err == nil {
				st.Close()
				t.Fatal("Redis with tls-auth-clients let the store in")
			}
		})
	}
	st := connect(t, base+"&tls_cert_file="+cliCert+"&tls_key_file="+cliKey, newClock())
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1, 0, time.Minute)
	res := make([]algorithm.Result, 1)
	for i := range 2 {
		if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: key.AppendHead(nil, "mtls", "1"), Params: &p, Cost: 1}}}, res); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i == 0) {
			t.Fatalf("request %d over mutual TLS: allowed=%v", i, res[0].Allowed)
		}
	}
}

func TestTLSClientCertificateURLErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := testca.New(t, "CA").Client(t, "c").Files(t, dir, "c")
	junk := filepath.Join(dir, "junk.pem")
	testca.WriteFile(t, junk, []byte("junk"))
	for _, c := range []struct{ name, url, want string }{
		{"certificate without key", "rediss://127.0.0.1:1?tls_cert_file=" + cert, "tls_cert_file needs tls_key_file"},
		{"key without certificate", "rediss://127.0.0.1:1?tls_key_file=" + key, "tls_key_file needs tls_cert_file"},
		{"without TLS", "redis://127.0.0.1:1?tls_cert_file=" + cert + "&tls_key_file=" + key, "needs rediss://"},
		{"certificate not PEM", "rediss://127.0.0.1:1?tls_cert_file=" + junk + "&tls_key_file=" + key, "--store: tls_cert_file: tls certificate " + junk},
		{"missing key", "rediss://127.0.0.1:1?tls_cert_file=" + cert + "&tls_key_file=" + filepath.Join(dir, "none"), "--store: tls_cert_file: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(ctx, c.url, WithTimeout(time.Second))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestTLSSkipHostnameVerification reaches a real redis-server over TLS by a name its
// certificate does not hold (localhost; the certificate names 127.0.0.1 only):
// tls_skip_hostname_verification lets the store in when the chain is good, and not when the
// certificate's CA is not trusted.
func TestTLSSkipHostnameVerification(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCertificates(t, dir)
	otherCA := testca.New(t, "another CA").File(t, dir, "other-ca.pem")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	redistest.Start(t, redistest.WithConfig(
		"tls-port "+strconv.Itoa(tlsPort),
		"tls-cert-file "+certFile, "tls-key-file "+keyFile, "tls-ca-cert-file "+caFile,
		"tls-auth-clients no",
	))
	url := "rediss://localhost:" + strconv.Itoa(tlsPort)
	for _, c := range []struct {
		name, query string
		ok          bool
	}{
		{"name checked", "?tls_ca_file=" + caFile, false},
		{"name not checked, chain good", "?tls_ca_file=" + caFile + "&tls_skip_hostname_verification=true", true},
		{"name not checked, chain from another CA", "?tls_ca_file=" + otherCA + "&tls_skip_hostname_verification=true", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := New(ctx, url+c.query, WithTimeout(2*time.Second))
			if err == nil {
				st.Close()
			}
			if (err == nil) != c.ok {
				t.Fatalf("err = %v, want connected=%v", err, c.ok)
			}
		})
	}
}

// TestSentinelAuth: sentinel_auth gives the sentinels a password of their own (user:password
// or password; empty is none); without it they get the URL's credentials.
func TestSentinelAuth(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url, user, pass string
	}{
		{"redis-sentinel://u:pw@s1:26379/m", "u", "pw"},
		{"redis-sentinel://u:pw@s1:26379/m?sentinel_auth=spw", "", "spw"},
		{"redis-sentinel://u:pw@s1:26379/m?sentinel_auth=su:spw", "su", "spw"},
		{"redis-sentinel://u:pw@s1:26379/m?sentinel_auth=", "", ""},
	} {
		opt, _, err := parseURL(c.url)
		if err != nil {
			t.Fatal(err)
		}
		if opt.Sentinel.Username != c.user || opt.Sentinel.Password != c.pass || opt.Username != "u" || opt.Password != "pw" {
			t.Errorf("%s: sentinel %q:%q, master %q:%q; want sentinel %q:%q, master u:pw", c.url, opt.Sentinel.Username, opt.Sentinel.Password, opt.Username, opt.Password, c.user, c.pass)
		}
	}
}
