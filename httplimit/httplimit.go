// Package httplimit is net/http middleware that rate-limits requests with a sluice.Limiter and
// speaks the rate-limit headers: IETF RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers), the common X-RateLimit-*, and Retry-After on 429.
package httplimit

import (
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// Middleware limits every request through l. It identifies the caller by API key header,
// then user, then client IP, and answers 429 with the JSON decision and Retry-After when a
// limit denies.
type Middleware struct {
	lim        *sluice.Limiter
	apiKey     string
	userHeader string
	tenant     string
	ipHeader   string
	attributes func(*http.Request, *sluice.Request)
	onError    func(http.ResponseWriter, *http.Request, error) bool
	pool       sync.Pool
}

// Option configures the middleware.
type Option func(*Middleware)

// WithAPIKeyHeader names the header that carries the API key (default X-API-Key).
func WithAPIKeyHeader(name string) Option { return func(m *Middleware) { m.apiKey = name } }

// WithUserHeader names the header that carries the user id (default X-User-ID). Set it only
// behind a gateway that authenticates users, or use WithAttributes to take the user from the
// request's authenticated context.
func WithUserHeader(name string) Option { return func(m *Middleware) { m.userHeader = name } }

// WithTenantHeader names the header that carries the tenant (default X-Tenant-ID).
func WithTenantHeader(name string) Option { return func(m *Middleware) { m.tenant = name } }

// WithClientIPHeader takes the client IP from the first address of a header such as
// X-Forwarded-For, instead of the connection's peer. Use it only behind a proxy you trust to set
// that header.
func WithClientIPHeader(name string) Option { return func(m *Middleware) { m.ipHeader = name } }

// WithAttributes sets a function that fills or adjusts the attributes of each request after the
// defaults, for example the user from a verified token, a tier or a cost.
func WithAttributes(f func(*http.Request, *sluice.Request)) Option {
	return func(m *Middleware) { m.attributes = f }
}

// WithErrorHandler decides what happens when the limiter fails (bad attributes or a store
// error). It returns true to let the request through. The default logs and lets it through:
// a rate limiter that fails must not take the API down with it.
func WithErrorHandler(f func(http.ResponseWriter, *http.Request, error) bool) Option {
	return func(m *Middleware) { m.onError = f }
}

// New returns the middleware.
func New(l *sluice.Limiter, opts ...Option) *Middleware {
	m := &Middleware{lim: l, apiKey: "X-API-Key", userHeader: "X-User-ID", tenant: "X-Tenant-ID"}
	for _, o := range opts {
		o(m)
	}
	if m.onError == nil {
		m.onError = func(_ http.ResponseWriter, r *http.Request, err error) bool {
			slog.Warn("httplimit: limiter failed; letting the request through", "path", r.URL.Path, "err", err)
			return true
		}
	}
	m.pool.New = func() any { return &sluice.Decision{} }
	return m
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := sluice.Request{
			APIKey:   r.Header.Get(m.apiKey),
			User:     r.Header.Get(m.userHeader),
			Tenant:   r.Header.Get(m.tenant),
			IP:       m.clientIP(r),
			Endpoint: r.URL.Path,
			Method:   r.Method,
		}
		if m.attributes != nil {
			m.attributes(r, &req)
		}
		d := m.pool.Get().(*sluice.Decision)
		defer m.pool.Put(d)
		if err := m.lim.Check(r.Context(), &req, d); err != nil {
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
		next.ServeHTTP(w, r)
	})
}

func (m *Middleware) clientIP(r *http.Request) string {
	if m.ipHeader != "" {
		if v := r.Header.Get(m.ipHeader); v != "" {
			first, _, _ := strings.Cut(v, ",")
			return strings.TrimSpace(first)
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return host
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
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, r.Rule)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, r.Limit, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, ceilSeconds(r.Period), 10)
	}
	h["Ratelimit-Policy"] = []string{string(b)}
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
		h["X-Ratelimit-Warning"] = []string{"soft limit reached for rule " + strconv.Quote(d.Rule)}
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
