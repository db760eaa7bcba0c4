package tlsreload

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/testca"
)

// clock is the test's clock: the reloader looks at the files only when it moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// fixture is a reloader over files in a temporary folder, served by a real HTTPS server.
type fixture struct {
	t                         *testing.T
	dir                       string
	ca                        *testca.CA
	certFile, keyFile, caFile string
	clock                     *clock
	r                         *Reloader
	addr                      string
	log                       *strings.Builder
	logMu                     *sync.Mutex
}

func newFixture(t *testing.T, mutual bool) *fixture {
	t.Helper()
	return newFixtureSAN(t, mutual, "")
}

// newFixtureSAN is newFixture whose client certificates must also name san (with mutual).
func newFixtureSAN(t *testing.T, mutual bool, san string) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), ca: testca.New(t, "server CA"), clock: &clock{now: time.Unix(1_800_000_000, 0)}, log: &strings.Builder{}, logMu: &sync.Mutex{}}
	f.certFile, f.keyFile = f.ca.Server(t, "first").Files(t, f.dir, "server")
	opts := Options{CertFile: f.certFile, KeyFile: f.keyFile, Now: f.clock.Now, Logger: slog.New(slog.NewTextHandler(lockedWriter{f.logMu, f.log}, nil))}
	if mutual {
		f.caFile = testca.New(t, "client CA").File(t, f.dir, "clients.pem")
		opts.ClientCAFile = f.caFile
		opts.ClientSAN = san
	}
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		TLSConfig: r.ServerConfig("h2", "http/1.1"),
		ErrorLog:  slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return f
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (f *fixture) logs() string { f.logMu.Lock(); defer f.logMu.Unlock(); return f.log.String() }

// get makes one request on a new connection with cfg and returns the serial of the
// certificate the server presented.
func (f *fixture) get(cfg *tls.Config) (*big.Int, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true, ForceAttemptHTTP2: true}}
	resp, err := c.Get("https://" + f.addr + "/")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		return nil, errors.New("answer " + resp.Status + ": " + string(body))
	}
	return resp.TLS.PeerCertificates[0].SerialNumber, nil
}

// client is a client configuration trusting the server CA, presenting pair if given.
func (f *fixture) client(pair *testca.Pair) *tls.Config {
	f.t.Helper()
	cfg := &tls.Config{RootCAs: f.ca.Pool()}
	if pair != nil {
		cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
		if err != nil {
			f.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// newClientCA makes a CA and writes it to the server's client CA file.
func (f *fixture) newClientCA(name string) *testca.CA {
	ca := testca.New(f.t, name)
	testca.WriteFile(f.t, f.caFile, ca.PEM)
	return ca
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	clientCA := f.newClientCA("client CA")
	f.clock.Add(DefaultInterval) // the client CA just written is the one served
	good := clientCA.Client(t, "good client")
	wrongCA := testca.New(t, "another CA").Client(t, "stranger")
	serverCert := f.ca.Server(t, "a server certificate as a client")
	tls11 := f.client(&good)
	tls11.MaxVersion = tls.VersionTLS11
	cases := []struct {
		name string
		cfg  *tls.Config
		ok   bool
	}{
		{"client certificate from the client CA", f.client(&good), true},
		{"no client certificate", f.client(nil), false},
		{"client certificate from another CA", f.client(&wrongCA), false},
		{"certificate for servers, not clients", f.client(&serverCert), false},
		{"TLS 1.1", tls11, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.get(c.cfg)
			if (err == nil) != c.ok {
				t.Fatalf("err = %v, want accepted=%v", err, c.ok)
			}
		})
	}
	t.Run("plain HTTP", func(t *testing.T) {
		resp, err := http.Get("http://" + f.addr + "/")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("plain HTTP answered %s %q", resp.Status, body)
			}
		}
	})
}

func TestRotation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	first, err := f.get(f.client(nil))
	if err != nil {
		t.Fatal(err)
	}
	next := f.ca.Server(t, "second")
	next.Write(t, f.certFile, f.keyFile) // in place, as cp does

	if got, err := f.get(f.client(nil)); err != nil || got.Cmp(first) != 0 {
		t.Fatalf("within the interval: serial %v (%v), want the first %v", got, err, first)
	}
	f.clock.Add(DefaultInterval)
	if got, err := f.get(f.client(nil)); err != nil || got.Cmp(next.Serial) != 0 {
		t.Fatalf("after the interval: serial %v (%v), want the new %v", got, err, next.Serial)
	}
	if !strings.Contains(f.logs(), "tls certificate reloaded") {
		t.Errorf("reload not logged:\n%s", f.logs())
	}

	// Kubernetes updates a Secret's files by pointing a symlink at a new folder.
	third := f.ca.Server(t, "third")
	c3, k3 := third.Files(t, t.TempDir(), "server")
	for _, p := range [][2]string{{c3, f.certFile}, {k3, f.keyFile}} {
		os.Remove(p[1])
		if err := os.Symlink(p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Add(DefaultInterval)
	if got, err := f.get(f.client(nil)); err != nil || got.Cmp(third.Serial) != 0 {
		t.Fatalf("after a symlink swap: serial %v (%v), want %v", got, err, third.Serial)
	}
}

// TestBadFilesKeepTheLastGood changes the files to each kind of bad content: the server goes on
// with the certificate it had, logs it, and takes the next good one.
func TestBadFilesKeepTheLastGood(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		spoil func(f *fixture)
	}{
		{"certificate not PEM", func(f *fixture) { testca.WriteFile(f.t, f.certFile, []byte("not a certificate")) }},
		{"empty key", func(f *fixture) { testca.WriteFile(f.t, f.keyFile, nil) }},
		{"key of another certificate", func(f *fixture) {
			testca.WriteFile(f.t, f.keyFile, f.ca.Server(f.t, "other").KeyPEM)
		}},
		{"certificate removed", func(f *fixture) { os.Remove(f.certFile) }},
		{"client CA not PEM", func(f *fixture) { testca.WriteFile(f.t, f.caFile, []byte("junk")) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, true)
			clientCA := f.newClientCA("client CA")
			f.clock.Add(DefaultInterval)
			pair := clientCA.Client(t, "client")
			client := f.client(&pair)
			first, err := f.get(client)
			if err != nil {
				t.Fatal(err)
			}
			c.spoil(f)
			f.clock.Add(DefaultInterval)
			if got, err := f.get(client); err != nil || got.Cmp(first) != 0 {
				t.Fatalf("after a bad file: serial %v (%v), want the last good %v", got, err, first)
			}
			if !strings.Contains(f.logs(), "do not load") {
				t.Errorf("bad file not logged:\n%s", f.logs())
			}
			next := f.ca.Server(t, "fixed")
			next.Write(t, f.certFile, f.keyFile)
			testca.WriteFile(t, f.caFile, clientCA.PEM)
			f.clock.Add(DefaultInterval)
			if got, err := f.get(client); err != nil || got.Cmp(next.Serial) != 0 {
				t.Fatalf("after fixing the files: serial %v (%v), want %v", got, err, next.Serial)
			}
		})
	}
}

// TestClientCARotation replaces the client CA file: clients of the new CA get in, those of the
// old one no longer do.
func TestClientCARotation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	oldCA := f.newClientCA("old client CA")
	f.clock.Add(DefaultInterval)
	oldPair := oldCA.Client(t, "old")
	if _, err := f.get(f.client(&oldPair)); err != nil {
		t.Fatal(err)
	}
	newCA := f.newClientCA("new client CA")
	f.clock.Add(DefaultInterval)
	newPair := newCA.Client(t, "new")
	if _, err := f.get(f.client(&newPair)); err != nil {
		t.Fatalf("client of the new CA: %v", err)
	}
	if _, err := f.get(f.client(&oldPair)); err == nil {
		t.Fatal("client of the replaced CA still accepted")
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testca.New(t, "CA")
	cert, key := ca.Server(t, "s").Files(t, dir, "s")
	junk := filepath.Join(dir, "junk")
	testca.WriteFile(t, junk, []byte("junk"))
	for _, c := range []struct {
		name string
		opts Options
		want string
	}{
		{"no key", Options{CertFile: cert}, "both needed"},
		{"missing certificate", Options{CertFile: filepath.Join(dir, "none"), KeyFile: key}, "none"},
		{"certificate not PEM", Options{CertFile: junk, KeyFile: key}, "junk"},
		{"client CA not PEM", Options{CertFile: cert, KeyFile: key, ClientCAFile: junk}, "client CA"},
		{"missing client CA", Options{CertFile: cert, KeyFile: key, ClientCAFile: filepath.Join(dir, "none")}, "client CA"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one naming %q", err, c.want)
			}
		})
	}
}

// BenchmarkHandshakeConfig is the cost a new connection pays to get its configuration.
func BenchmarkHandshakeConfig(b *testing.B) {
	dir := b.TempDir()
	ca := testca.New(b, "CA")
	cert, key := ca.Server(b, "s").Files(b, dir, "s")
	r, err := New(Options{CertFile: cert, KeyFile: key})
	if err != nil {
		b.Fatal(err)
	}
	cfg := r.ServerConfig("h2")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cfg.GetConfigForClient(nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClientSAN: with ClientSAN, a client certificate from the client CA is admitted only when
// it names the SAN (testca's certificates name localhost and 127.0.0.1).
func TestClientSAN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		san string
		ok  bool
	}{
		{"localhost", true},
		{"127.0.0.1", true},
		{"rls-client.example", false},
	} {
		t.Run(c.san, func(t *testing.T) {
			t.Parallel()
			f := newFixtureSAN(t, true, c.san)
			clientCA := f.newClientCA("client CA")
			f.clock.Add(DefaultInterval)
			good := clientCA.Client(t, "client")
			if _, err := f.get(f.client(&good)); (err == nil) != c.ok {
				t.Fatalf("err = %v, want accepted=%v", err, c.ok)
			}
			if _, err := f.get(f.client(nil)); err == nil {
				t.Fatal("no client certificate was accepted")
			}
		})
	}
	if _, err := New(Options{CertFile: "c", KeyFile: "k", ClientSAN: "x"}); err == nil || !strings.Contains(err.Error(), "client CA") {
		t.Fatalf("a SAN without a client CA: err = %v", err)
	}
}
