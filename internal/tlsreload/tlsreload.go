// Package tlsreload serves TLS from certificate files that may change while the process runs.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often, at most, the files are looked at again.
const DefaultInterval = time.Second

// Options names the files. CertFile and KeyFile are required; ClientCAFile turns on mutual TLS.
type Options struct {
	// CertFile is the PEM certificate chain to present, leaf first.
	CertFile string
	// KeyFile is the PEM private key of the leaf certificate.
	KeyFile string
	// ClientCAFile, when set, is a PEM bundle of the CAs client certificates must chain to;
	// a client without such a certificate is refused during the handshake.
	ClientCAFile string
	// ClientSAN, when set, is a name (DNS or IP) a client certificate must carry among its
	// subject alternative names, besides chaining to ClientCAFile: mutual TLS that admits one
	// caller, not every holder of a certificate from the CA. Needs ClientCAFile.
	ClientSAN string
	// Interval is the least time between two looks at the files (default DefaultInterval).
	Interval time.Duration
	// Logger receives reloads and rejected files (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock that paces the looks (default time.Now); tests drive it.
	Now func() time.Time
}

// Reloader holds the last good certificate, key and client CA pool read from the files, and
// reads them again on a handshake when one of the files changed (checked at most once per
// Interval, by a stat of each file: no goroutine, no watch to lose on a rename). A change
// that does not load (half-written file, key not matching the certificate, no PEM) is logged
// and the last good set is kept; it is read again when a file changes again.
type Reloader struct {
	opts Options
	log  *slog.Logger

	cur       atomic.Pointer[state]
	nextCheck atomic.Int64 // unix nanoseconds before which the files are not looked at
	mu        sync.Mutex   // serialises reloads; handshakes never wait for it (TryLock)
	seen      [3]stamp     // the files as last read, good or bad; guarded by mu
}

// state is one good set of files.
type state struct {
	cert      *tls.Certificate
	clientCAs *x509.CertPool
}

// stamp tells whether a file changed: size and modification time, and the file itself, since
// Kubernetes swaps a Secret's files by a symlink and the new one may have the same mtime.
type stamp struct {
	info os.FileInfo
}

func (s stamp) same(o stamp) bool {
	if s.info == nil || o.info == nil {
		return s.info == nil && o.info == nil
	}
	return s.info.Size() == o.info.Size() && s.info.ModTime().Equal(o.info.ModTime()) && os.SameFile(s.info, o.info)
}

// New reads the files once; unlike a later reload, a failure here is returned: a server must
// not start without its certificate.
func New(opts Options) (*Reloader, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("tls: a certificate file and a key file are both needed")
	}
	if opts.ClientSAN != "" && opts.ClientCAFile == "" {
		return nil, errors.New("tls: a client SAN needs a client CA file")
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Reloader{opts: opts, log: opts.Logger}
	r.seen = r.stamps()
	st, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(st)
	r.nextCheck.Store(opts.Now().Add(opts.Interval).UnixNano())
	return r, nil
}

// MutualTLS tells whether client certificates are required.
func (r *Reloader) MutualTLS() bool { return r.opts.ClientCAFile != "" }

// Certificate returns the certificate being served, after looking at the files if Interval
// has passed since the last look.
func (r *Reloader) Certificate() *tls.Certificate { return r.current().cert }

// ServerConfig returns a server configuration that serves the current files on every new
// connection, offering nextProtos by ALPN (e.g. "h2", "http/1.1"). TLS 1.2 is the minimum;
// with a client CA file, clients must present a certificate that chains to it.
func (r *Reloader) ServerConfig(nextProtos ...string) *tls.Config {
	v := &view{r: r, protos: nextProtos}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		// Certificates and client CAs come from GetConfigForClient; this one is for callers
		// that check the outer configuration holds a certificate source.
		GetCertificate:     func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.Certificate(), nil },
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return v.config(), nil },
	}
}

// ClientConfig returns a client configuration presenting the current certificate to servers
// that ask for one (Redis with tls-auth-clients): each new connection gets the files as they
// are then. RootCAs and the rest are the caller's to set.
func (r *Reloader) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.Certificate(), nil },
	}
}

// view is ServerConfig's cache of the configuration made from the current state, so a
// handshake allocates nothing unless the files changed.
type view struct {
	r      *Reloader
	protos []string
	cache  atomic.Pointer[cached]
}

type cached struct {
	st  *state
	cfg *tls.Config
}

func (v *view) config() *tls.Config {
	st := v.r.current()
	if c := v.cache.Load(); c != nil && c.st == st {
		return c.cfg
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   v.protos,
		Certificates: []tls.Certificate{*st.cert},
	}
	if st.clientCAs != nil {
		cfg.ClientCAs = st.clientCAs
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if san := v.r.opts.ClientSAN; san != "" {
			cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifySAN(cs, san) }
		}
	}
	v.cache.Store(&cached{st: st, cfg: cfg})
	return cfg
}

// verifySAN checks that the client's verified leaf certificate names san, as the handshake
// has already checked its chain.
func verifySAN(cs tls.ConnectionState, san string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: no client certificate")
	}
	if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
		return fmt.Errorf("tls: client certificate: %w", err)
	}
	return nil
}

// current returns the state to serve, reloading first when it is time to look and a file
// changed.
func (r *Reloader) current() *state {
	r.Check(r.opts.Now())
	return r.cur.Load()
}

// Check looks at the files if Interval has passed since the last look at now, and loads them
// if one changed. Handshakes call it; it returns at once while another call is loading.
func (r *Reloader) Check(now time.Time) {
	next := r.nextCheck.Load()
	if now.UnixNano() < next || !r.nextCheck.CompareAndSwap(next, now.Add(r.opts.Interval).UnixNano()) {
		return
	}
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	stamps := r.stamps()
	if r.sameAsSeen(stamps) {
		return
	}
	// Remember the files even when they fail to load, so a bad file is logged once, not on
	// every look; a further change is read again.
	r.seen = stamps
	st, err := r.load()
	if err != nil {
		r.log.Error("tls files changed but do not load; serving the previous certificate", "cert", r.opts.CertFile, "key", r.opts.KeyFile, "client_ca", r.opts.ClientCAFile, "err", err)
		return
	}
	r.cur.Store(st)
	r.log.Info("tls certificate reloaded", "cert", r.opts.CertFile, "subject", st.cert.Leaf.Subject.String(), "serial", st.cert.Leaf.SerialNumber.String(), "not_after", st.cert.Leaf.NotAfter)
}

func (r *Reloader) sameAsSeen(stamps [3]stamp) bool {
	for i := range stamps {
		if !stamps[i].same(r.seen[i]) {
			return false
		}
	}
	return true
}

// stamps stats the files; a file that cannot be stat'ed gets the zero stamp (and its load
// then fails and is logged).
func (r *Reloader) stamps() [3]stamp {
	var s [3]stamp
	for i, path := range []string{r.opts.CertFile, r.opts.KeyFile, r.opts.ClientCAFile} {
		if path == "" {
			continue
		}
		if info, err := os.Stat(path); err == nil {
			s[i] = stamp{info}
		}
	}
	return s
}

// load reads and checks all the files.
func (r *Reloader) load() (*state, error) {
	cert, err := tls.LoadX509KeyPair(r.opts.CertFile, r.opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls certificate %s and key %s: %w", r.opts.CertFile, r.opts.KeyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls certificate %s: %w", r.opts.CertFile, err)
		}
	}
	st := &state{cert: &cert}
	if r.opts.ClientCAFile != "" {
		pool, err := CertPool(r.opts.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls client CA: %w", err)
		}
		st.clientCAs = pool
	}
	return st, nil
}

// CertPool reads a PEM file of CA certificates into a pool; a file without one is an error,
// not an empty pool that would refuse every peer without saying why.
func CertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}
