// Package httplimit is net/http middleware that rate-limits requests with a sluice.Limiter and
// speaks the rate-limit headers: IETF RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers), the common X-RateLimit-*, and Retry-After on 429.
//
// # Identity
//
// By default a caller is the connection's peer address (the host of http.Request.RemoteAddr),
// and no request header is read: a header is whatever the client chooses to send, so a limit
// keyed on one is escaped by changing it, and an exemption matched on one is claimed by sending
// it. Identity comes from the request only through options the application sets on purpose:
//
//   - WithIdentity: a function that fills the attributes (user, api_key, tenant, tier, cost...)
//     from what the application has verified, such as a token or a session.
//   - WithAPIKeyHeader, WithUserHeader, WithTenantHeader: take an attribute from a header as is;
//     safe only behind a gateway that authenticates callers and sets (overwrites) that header.
//   - WithClientIPHeader: take the client address from X-Forwarded-For or the like; safe only
//     behind proxies you trust, named by their address ranges.
//
// A request with no identity at all (a peer address that is not an IP, as on a Unix socket,
// and no identity option) shares one bucket with every other such request.
//
// # Errors
//
// The middleware never lets a request through because the limiter could not decide it:
//
//   - Bad attributes (an attribute longer than policy.MaxAttribute bytes or not UTF-8, such as
//     an over-long path or a header read by an identity option; an IP header that is not an
//     address; a cost out of range) answer 400 with {"error": "...", "field": "..."}.
//   - An identity function's error answers 401, or 400 when it wraps policy.ErrInvalid.
//   - A store outage is decided by each rule's on_store_error inside the Limiter: open lets the
//     request through (the decision is marked degraded), closed answers 429 with the decision,
//     local limits in process with the Limiter's fallback store. Should the Limiter still fail
//     (its fallback failed too) the answer is 503.
//
// WithErrorHandler changes these answers, for example to fail open on 503.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy"
)

// ErrIdentity is wrapped by the error the error handler receives when the identity function
// failed; the function's own error is wrapped too.
var ErrIdentity = errors.New("httplimit: caller not identified")

// Middleware limits every request through a sluice.Limiter. It identifies the caller by the
// connection's peer address unless options say otherwise (see the package documentation), and
// answers 429 with the JSON decision and Retry-After when a limit denies.
type Middleware struct {
	lim      *sluice.Limiter
	apiKey   string // canonical header names, so that reading them allocates nothing; empty: not read
	user     string
	tenant   string
	ipHeader string
	trusted  []netip.Prefix
	identity func(*http.Request, *sluice.Request) error
	onError  func(http.ResponseWriter, *http.Request, error) bool
	log      *slog.Logger
	pool     sync.Pool // of *check
	// hold reserves instead of checking, and holdTTL is the leases' ttl (WithHold).
	hold    bool
	holdTTL time.Duration
}

// check is the per-request state, pooled so that a request allocates neither its attributes
// nor its decision.
type check struct {
	req sluice.Request
	d   sluice.Decision
}

// Option configures the middleware.
type Option func(*Middleware)

// WithIdentity sets the function that identifies the caller: it fills or adjusts req (user,
// api_key, tenant, tier, descriptors, cost...) from r, typically from a credential the
// application has verified. req arrives with IP (the peer, or WithClientIPHeader's address),
// Endpoint (the URL path), Method and any header options already set; the function may
// overwrite any of them. req is valid only during the call: do not keep it.
//
// An error refuses the request: 400 with the field when it wraps policy.ErrInvalid (return a
// *policy.FieldError for a malformed credential), 401 otherwise. The error handler receives it
// wrapped with ErrIdentity.
func WithIdentity(f func(r *http.Request, req *sluice.Request) error) Option {
	return func(m *Middleware) { m.identity = f }
}

// WithAPIKeyHeader takes the api_key attribute from the named header, as the client sent it.
// A client that changes it becomes another caller, and one that sends an exempt key is exempt:
// use it only behind a gateway that authenticates the key and sets the header, replacing any
// the client sent. Otherwise verify the key in WithIdentity.
func WithAPIKeyHeader(name string) Option {
	return func(m *Middleware) { m.apiKey = http.CanonicalHeaderKey(name) }
}

// WithUserHeader takes the user attribute from the named header, as the client sent it: use it
// only behind a gateway that authenticates users and sets the header, replacing any the client
// sent. Otherwise take the user from the request's verified credential in WithIdentity.
func WithUserHeader(name string) Option {
	return func(m *Middleware) { m.user = http.CanonicalHeaderKey(name) }
}

// WithTenantHeader takes the tenant attribute from the named header, as the client sent it:
// use it only behind a gateway that sets the header, replacing any the client sent.
func WithTenantHeader(name string) Option {
	return func(m *Middleware) { m.tenant = http.CanonicalHeaderKey(name) }
}

// WithClientIPHeader takes the client address from a header that proxies append to, such as
// X-Forwarded-For (a comma-separated list, oldest hop first; repeated header lines are read as
// one list), instead of the connection's peer. Use it only behind proxies you trust: the
// left-most entries are whatever the client wrote, so the address taken is the right-most one
// that no trusted proxy could have written.
//
// With trusted address ranges, the header is read only when the peer is in one of them, and
// the address taken is the right-most entry outside them (the left-most entry when all are in
// them). With none, the peer is trusted as the one proxy in front, and the right-most entry,
// the address that proxy saw, is taken: then every connection must come through that proxy.
// An entry that is not an IP address (with or without a port) answers 400 naming ip.
func WithClientIPHeader(name string, trusted ...netip.Prefix) Option {
	return func(m *Middleware) { m.ipHeader, m.trusted = http.CanonicalHeaderKey(name), slices.Clone(trusted) }
}

// WithErrorHandler sets what happens when a request cannot be decided: the identity function
// failed (err wraps ErrIdentity), an attribute is invalid (err wraps policy.ErrInvalid; a
// *policy.FieldError names the field), or the Limiter failed even after each rule's
// on_store_error (anything else). The handler writes the answer and returns false, or returns
// true, having written nothing, to let the request through. WriteError writes the default
// answers (400, 401, 503), so a handler can change one case and leave the others to it.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error) bool) Option {
	return func(m *Middleware) { m.onError = f }
}

// WithLogger sets the logger the default error handler notes refusals on, at debug level only:
// the refusals are the clients' doing, and a log line each would let any client flood the log
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(m *Middleware) { m.log = l } }

// WithHold makes the middleware hold the request's concurrency slots for the handler's
// duration: it reserves (sluice.Limiter.Reserve) instead of checking, so that each concurrency
// limit (algorithm: concurrency) that applies takes a slot and the other limits take the
// request's cost as a check would; when the handler returns, or panics (the panic goes on),
// the lease is committed at what it reserved, which frees the slots and leaves the rate
// limits charged. While the handler runs the lease is renewed every third of ttl, so a slot
// outlives a long handler but returns within ttl of a process that died holding it. A ttl of
// 0 takes sluice.DefaultLeaseTTL. The Limiter's store must keep leases (memory or Redis).
func WithHold(ttl time.Duration) Option {
	return func(m *Middleware) {
		if ttl <= 0 {
			ttl = sluice.DefaultLeaseTTL
		}
		m.hold, m.holdTTL = true, min(ttl, sluice.MaxLeaseTTL)
	}
}

// New returns the middleware.
func New(l *sluice.Limiter, opts ...Option) *Middleware {
	m := &Middleware{lim: l}
	for _, o := range opts {
		o(m)
	}
	if m.onError == nil {
		m.onError = func(w http.ResponseWriter, r *http.Request, err error) bool {
			log := m.log
			if log == nil {
				log = slog.Default() // read now: the application may set it after New
			}
			log.DebugContext(r.Context(), "httplimit: request refused", "path", r.URL.Path, "err", err)
			WriteError(w, err)
			return false
		}
	}
	m.pool.New = func() any { return &check{} }
	return m
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := m.pool.Get().(*check)
		defer m.pool.Put(c)
		c.req = sluice.Request{IP: m.clientIP(r), Endpoint: r.URL.Path, Method: r.Method}
		if m.apiKey != "" {
			c.req.APIKey = r.Header.Get(m.apiKey)
		}
		if m.user != "" {
			c.req.User = r.Header.Get(m.user)
		}
		if m.tenant != "" {
			c.req.Tenant = r.Header.Get(m.tenant)
		}
		if m.identity != nil {
			if err := m.identity(r, &c.req); err != nil {
				if m.onError(w, r, &identityError{err}) {
					next.ServeHTTP(w, r)
				}
				return
			}
		}
		d := &c.d
		var lease *sluice.Lease
		var err error
		if m.hold {
			lease, err = m.lim.Reserve(r.Context(), &c.req, m.holdTTL, d)
		} else {
			err = m.lim.Check(r.Context(), &c.req, d)
		}
		if err != nil {
			if m.onError(w, r, err) {
				next.ServeHTTP(w, r)
			}
			return
		}
		SetHeaders(w.Header(), d)
		if !d.Allowed {
			WriteDenied(w, d)
			return
		}
		if lease != nil {
			m.serveHolding(w, r, lease, next)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// serveHolding serves r holding lease (WithHold), then settles it.
func (m *Middleware) serveHolding(w http.ResponseWriter, r *http.Request, lease *sluice.Lease, next http.Handler) {
	// The settlement outlives the request's context: a client that went away must not leave
	// the slot held until its ttl.
	ctx := context.WithoutCancel(r.Context())
	stop := m.keepAlive(ctx, lease)
	defer func() {
		stop()
		sctx, cancel := context.WithTimeout(ctx, settleTimeout)
		defer cancel()
		if _, err := lease.Commit(sctx, lease.Reserved); err != nil {
			m.logger().WarnContext(ctx, "httplimit: lease not settled; its slots return at its ttl", "lease", lease.ID, "ttl", m.holdTTL, "err", err)
		}
	}()
	next.ServeHTTP(w, r)
}

// settleTimeout bounds a held lease's settlement and each renewal.
const settleTimeout = 5 * time.Second

// keepAlive renews lease every third of its ttl until the returned stop is called.
func (m *Middleware) keepAlive(ctx context.Context, lease *sluice.Lease) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	every := m.holdTTL / 3
	mu.Lock() // t is set before its first run reads it
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		rctx, cancel := context.WithTimeout(ctx, settleTimeout)
		err := lease.Renew(rctx, m.holdTTL)
		cancel()
		if err != nil {
			m.logger().WarnContext(ctx, "httplimit: lease not renewed", "lease", lease.ID, "err", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

func (m *Middleware) logger() *slog.Logger {
	if m.log != nil {
		return m.log
	}
	return slog.Default()
}

// identityError is an identity function's error: it matches both ErrIdentity and what the
// function returned.
type identityError struct{ err error }

func (e *identityError) Error() string   { return "identity: " + e.err.Error() }
func (e *identityError) Unwrap() []error { return []error{ErrIdentity, e.err} }

// clientIP returns the peer's host, or the address WithClientIPHeader picks. The result is
// checked by the Limiter, which answers for a value that is not an address.
func (m *Middleware) clientIP(r *http.Request) string {
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = ""
	}
	if m.ipHeader == "" {
		return peer
	}
	if len(m.trusted) > 0 && !m.isTrusted(peer) {
		return peer
	}
	values := r.Header.Values(m.ipHeader)
	left := ""
	// Right to left over the entries of every line, last line first: the right-most entries
	// were written by the proxies nearest to us.
	for i := len(values) - 1; i >= 0; i-- {
		v := values[i]
		for v != "" {
			hop := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				hop, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				continue
			}
			ip, addr, ok := parseHop(hop)
			if !ok {
				return hop // not an address: the Limiter rejects it, naming ip
			}
			if len(m.trusted) == 0 || !m.contains(addr) {
				return ip
			}
			left = ip
		}
	}
	if left != "" {
		return left
	}
	return peer
}

func (m *Middleware) isTrusted(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && m.contains(a)
}

func (m *Middleware) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range m.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop reads one forwarded hop: an address, or an address and port ("192.0.2.1:80",
// "[2001:db8::1]:80"), as some proxies write them. ip is the address alone: hop itself when it
// is one, which spares formatting (and allocating) it again.
func parseHop(hop string) (ip string, a netip.Addr, ok bool) {
	if a, err := netip.ParseAddr(hop); err == nil {
		return hop, a, true
	}
	if ap, err := netip.ParseAddrPort(hop); err == nil {
		return ap.Addr().String(), ap.Addr(), true
	}
	return "", netip.Addr{}, false
}

// WriteError writes the default answer for err, an error the error handler receives: 400 with
// {"error", "field"} for invalid input (err wraps policy.ErrInvalid), 401 when the identity
// function failed otherwise (err wraps ErrIdentity), 503 for anything else: the limiter could
// not decide. Only a bad input's message reaches the client; the others may hold details of
// the store or of credentials, and are answered with a fixed message.
func WriteError(w http.ResponseWriter, err error) {
	var body struct {
		Error string `json:"error"`
		Field string `json:"field,omitempty"`
	}
	status := http.StatusServiceUnavailable
	body.Error = "rate limiter unavailable"
	var fe *policy.FieldError
	switch {
	case errors.As(err, &fe):
		status, body.Error, body.Field = http.StatusBadRequest, fe.Error(), fe.Field
	case errors.Is(err, policy.ErrInvalid):
		status, body.Error = http.StatusBadRequest, err.Error()
	case errors.Is(err, ErrIdentity):
		status, body.Error = http.StatusUnauthorized, "caller not identified"
	case errors.Is(err, sluice.ErrIdempotencyMismatch):
		status, body.Error, body.Field = http.StatusUnprocessableEntity, err.Error(), "idempotency_key"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// WriteDenied answers 429 with the JSON decision. Call SetHeaders first.
func WriteDenied(w http.ResponseWriter, d *sluice.Decision) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(d.AppendJSON(make([]byte, 0, 512)))
}

// SetHeaders sets the rate-limit headers of d on h: X-RateLimit-Limit, -Remaining, -Reset
// (seconds), RateLimit-Policy with every limit that applied, RateLimit for the deciding one,
// Retry-After when denied, and X-RateLimit-Warning in the soft state. Nothing is set for an
// exempt or unlimited request.
func SetHeaders(h http.Header, d *sluice.Decision) {
	if d.Exempt || len(d.Results) == 0 {
		return
	}
	var buf [20]byte
	h["X-Ratelimit-Limit"] = []string{string(strconv.AppendInt(buf[:0], d.Limit, 10))}
	h["X-Ratelimit-Remaining"] = []string{string(strconv.AppendInt(buf[:0], d.Remaining, 10))}
	h["X-Ratelimit-Reset"] = []string{string(strconv.AppendInt(buf[:0], ceilSeconds(d.ResetAfter), 10))}

	var b []byte
	for i := range d.Results {
		r := &d.Results[i]
		if r.Algorithm == algorithm.Concurrency {
			continue // leases in flight, not a quota over a window
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, r.Rule)
		// The policy is the rate (a bucket's refill per period), while X-RateLimit-Limit is
		// what can be spent at once: the draft's quota policy describes the window.
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, r.Quota, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, ceilSeconds(r.Period), 10)
	}
	if len(b) > 0 {
		h["Ratelimit-Policy"] = []string{string(b)}
	}
	b = appendSFString(b[:0], d.Rule)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(d.ResetAfter), 10)
	h["Ratelimit"] = []string{string(b)}
	if !d.Allowed && d.RetryAfter > 0 {
		h["Retry-After"] = []string{string(strconv.AppendInt(buf[:0], ceilSeconds(d.RetryAfter), 10))}
	}
	if d.Allowed && d.State == sluice.StateSoft {
		if d.Warning != "" {
			h["X-Ratelimit-Warning"] = []string{d.Warning} // a warning override's
		} else {
			h["X-Ratelimit-Warning"] = []string{"soft limit reached for rule " + strconv.Quote(d.Rule)}
		}
	}
}

// appendSFString appends s as an HTTP structured-field string (RFC 8941): quoted, with '"' and
// '\' escaped and bytes outside printable ASCII dropped, which the format cannot carry.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
