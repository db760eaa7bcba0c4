// Package httpapi serves Sluice's JSON API over HTTP (DESIGN.md, Native HTTP): POST /v1/check,
// /v1/quota and /v1/reset, with health, readiness and metrics endpoints.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
)

// DefaultMaxBody caps request bodies: a check is a few hundred bytes.
const DefaultMaxBody = 64 << 10

// Options configure the API.
type Options struct {
	// MaxBodyBytes caps request bodies (default DefaultMaxBody).
	MaxBodyBytes int64
	// Metrics is served at GET /metrics when set.
	Metrics http.Handler
	// Ready reports readiness for GET /readyz; nil means always ready.
	Ready func() error
}

// Server is the HTTP API.
type Server struct {
	lim     *sluice.Limiter
	m       *metrics.Metrics
	opts    Options
	mux     *http.ServeMux
	buffers sync.Pool // *scratch
}

type scratch struct {
	body bytes.Buffer
	out  []byte
	req  checkBody
	d    sluice.Decision
}

// New returns the API over l.
func New(l *sluice.Limiter, m *metrics.Metrics, o Options) *Server {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBody
	}
	s := &Server{lim: l, m: m, opts: o, mux: http.NewServeMux()}
	s.buffers.New = func() any { return &scratch{out: make([]byte, 0, 1024)} }
	s.mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) { s.check(w, r, false) })
	s.mux.HandleFunc("POST /v1/quota", func(w http.ResponseWriter, r *http.Request) { s.check(w, r, true) })
	s.mux.HandleFunc("POST /v1/reset", s.reset)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	if o.Metrics != nil {
		s.mux.Handle("GET /metrics", o.Metrics)
	}
	return s
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// checkBody is the wire form of a request (DESIGN.md, Request attributes).
type checkBody struct {
	Tenant         string            `json:"tenant"`
	User           string            `json:"user"`
	APIKey         string            `json:"api_key"`
	IP             string            `json:"ip"`
	Endpoint       string            `json:"endpoint"`
	Method         string            `json:"method"`
	Tier           string            `json:"tier"`
	Descriptors    map[string]string `json:"descriptors"`
	Cost           optionalInt       `json:"cost"`
	IdempotencyKey string            `json:"idempotency_key"`
	Rule           string            `json:"rule"` // reset only
}

// optionalInt tells an absent cost (1) from an explicit 0 (look) without allocating a pointer.
type optionalInt struct {
	v   int64
	set bool
}

func (o *optionalInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return &policy.FieldError{Field: "cost", Msg: fmt.Sprintf("%s is not an integer", b)}
	}
	o.v, o.set = v, true
	return nil
}

func (b *checkBody) request() sluice.Request {
	return sluice.Request{
		Tenant: b.Tenant, User: b.User, APIKey: b.APIKey, IP: b.IP, Endpoint: b.Endpoint,
		Method: b.Method, Tier: b.Tier, Descriptors: b.Descriptors, Cost: b.Cost.v,
		IdempotencyKey: b.IdempotencyKey,
	}
}

// decode reads and validates the body into sc.req. Invalid UTF-8 is refused before decoding,
// because encoding/json would silently replace it and two callers could share a bucket.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	sc.body.Reset()
	sc.req = checkBody{}
	if _, err := sc.body.ReadFrom(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &policy.FieldError{Field: "body", Msg: fmt.Sprintf("larger than %d bytes", s.opts.MaxBodyBytes)}
		}
		return &policy.FieldError{Field: "body", Msg: "unreadable: " + err.Error()}
	}
	body := sc.body.Bytes()
	if len(bytes.TrimSpace(body)) == 0 {
		return &policy.FieldError{Field: "body", Msg: "empty; send a JSON object of request attributes"}
	}
	if !utf8.Valid(body) {
		return &policy.FieldError{Field: "body", Msg: "not valid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc.req); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return &policy.FieldError{Field: "body", Msg: "more than one JSON value"}
	}
	return nil
}

// jsonError turns encoding/json's errors into ones that name the field.
func jsonError(err error) error {
	var fe *policy.FieldError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		return &policy.FieldError{Field: field, Msg: fmt.Sprintf("must be %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)}
	case errors.As(err, &syntaxErr):
		return &policy.FieldError{Field: "body", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", syntaxErr.Offset, err)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &policy.FieldError{Field: name, Msg: "unknown field"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &policy.FieldError{Field: "body", Msg: "truncated JSON"}
	}
	return &policy.FieldError{Field: "body", Msg: "invalid JSON: " + err.Error()}
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "map", "struct":
		return "an object"
	case "int64", "int":
		return "an integer"
	}
	return k
}

func (s *Server) check(w http.ResponseWriter, r *http.Request, quota bool) {
	start := time.Now()
	sc := s.buffers.Get().(*scratch)
	defer s.buffers.Put(sc)
	if err := s.decode(w, r, sc); err != nil {
		s.fail(w, err)
		return
	}
	req := sc.req.request()
	var err error
	if quota || (sc.req.Cost.set && sc.req.Cost.v == 0) {
		err = s.lim.Quota(r.Context(), &req, &sc.d)
	} else {
		err = s.lim.Check(r.Context(), &req, &sc.d)
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	s.m.ObserveCheck("http", &sc.d, time.Since(start))
	h := w.Header()
	h["Content-Type"] = jsonContentType
	httplimit.SetHeaders(h, &sc.d)
	if !sc.d.Allowed && !quota {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	sc.out = sc.d.AppendJSON(sc.out[:0])
	w.Write(sc.out)
}

var jsonContentType = []string{"application/json"}

func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	sc := s.buffers.Get().(*scratch)
	defer s.buffers.Put(sc)
	if err := s.decode(w, r, sc); err != nil {
		s.fail(w, err)
		return
	}
	req := sc.req.request()
	n, err := s.lim.Reset(r.Context(), &req, sc.req.Rule)
	if err != nil {
		s.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"keys_reset":%d}`, n)
}

func (s *Server) ready(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	version := s.lim.Policy().Version
	if s.opts.Ready != nil {
		if err := s.opts.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"status": "not ready", "error": err.Error(), "policy_version": version})
			return
		}
	}
	json.NewEncoder(w).Encode(map[string]string{"status": "ready", "policy_version": version})
}

// fail answers 400 for bad input, 422 for an idempotency key reused for another request, and
// 503 when the limiter could not decide.
func (s *Server) fail(w http.ResponseWriter, err error) {
	status := http.StatusServiceUnavailable
	body := map[string]string{"error": err.Error()}
	switch {
	case errors.Is(err, policy.ErrInvalid):
		status = http.StatusBadRequest
		s.m.Rejected("http", "invalid")
	case errors.Is(err, sluice.ErrIdempotencyMismatch):
		// Well-formed, but it contradicts what the key was first used for: 422, as for an
		// Idempotency-Key reused with another payload.
		status = http.StatusUnprocessableEntity
		body["field"] = "idempotency_key"
		s.m.Rejected("http", "idempotency_mismatch")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}
