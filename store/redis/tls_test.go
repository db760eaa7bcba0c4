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
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/redistest"
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
