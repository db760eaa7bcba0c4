// Package httpapi serves Sluice's JSON API over HTTP (docs/architecture.md, Answers): POST /v1/check,
// /v1/quota, /v1/reset, and the reservations' /v1/reserve, /v1/commit and /v1/release, with health, readiness and metrics endpoints.
package httpapi

import (
	"bytes"
	"context"
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

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/sync/singleflight"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/strictjson"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/tracing"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// DefaultMaxBody caps request bodies: a check is a few hundred bytes.
const DefaultMaxBody = 64 << 10

// Options configure the API.
type Options struct {
	// MaxBodyBytes caps request bodies (default DefaultMaxBody).
	MaxBodyBytes int64
	// Metrics is served at GET /metrics when set.
	Metrics http.Handler
	// Ready lists what GET /readyz reports on; with none the node is always ready.
	Ready []ReadyCheck
	// ReadyTimeout bounds the checks of one GET /readyz (default DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// ResetAuth, when set, wraps the POST /v1/reset handler: resets need a write token
	// (docs/architecture.md, Admin API), and adminapi.Server.RequireRole(control.RoleWrite, ...) checks it (401, 403).
	ResetAuth func(http.Handler) http.Handler
	// Events, when set, counts every check's decision (not looks) for the violations log and
	// usage history.
	Events *usage.Recorder
	// Tracer, when set, gives every check and quota a span, its parent taken from the
	// request's traceparent header; nil traces nothing.
	Tracer *tracing.Tracer
}

// DefaultReadyTimeout bounds a readiness answer: below the 1 s a Kubernetes probe waits by
// default, so the probe reads our reason rather than its own timeout.
const DefaultReadyTimeout = 500 * time.Millisecond

// ReadyCheck is one dependency GET /readyz reports on, under its name in the body: "store":
// "up" or "down".
type ReadyCheck struct {
	// Name is the check's key in the body, such as "store".
	Name string
	// Check answers nil when the dependency is usable. Its context ends at ReadyTimeout; past
	// that the dependency counts as down, whatever Check is still doing.
	Check func(ctx context.Context) error
	// Optional checks are reported but leave the node ready: it still decides without them
	// (the control store: the node enforces its last policy).
	Optional bool
}

// Server is the HTTP API.
type Server struct {
	lim     *sluice.Limiter
	m       *metrics.Metrics
	opts    Options
	mux     *http.ServeMux
	buffers sync.Pool // *scratch
	// probes runs each readiness check once at a time, however many probes ask: a store that
	// hangs holds one goroutine per check, not one per probe.
	probes singleflight.Group
}

type scratch struct {
	body bytes.Buffer
	out  []byte
	req  checkBody
	dec  jsontext.Decoder
	d    sluice.Decision
}

// New returns the API over l.
func New(l *sluice.Limiter, m *metrics.Metrics, o Options) *Server {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBody
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	s := &Server{lim: l, m: m, opts: o, mux: http.NewServeMux()}
	s.buffers.New = func() any { return &scratch{out: make([]byte, 0, 1024)} }
	s.mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) { s.check(w, r, false) })
	s.mux.HandleFunc("POST /v1/quota", func(w http.ResponseWriter, r *http.Request) { s.check(w, r, true) })
	s.mux.HandleFunc("POST /v1/reserve", s.reserve)
	s.mux.HandleFunc("POST /v1/commit", func(w http.ResponseWriter, r *http.Request) { s.settle(w, r, false) })
	s.mux.HandleFunc("POST /v1/release", func(w http.ResponseWriter, r *http.Request) { s.settle(w, r, true) })
	s.mux.HandleFunc("POST /v1/renew", s.renew)
	var reset http.Handler = http.HandlerFunc(s.reset)
	if o.ResetAuth != nil {
		reset = o.ResetAuth(reset)
	}
	s.mux.Handle("POST /v1/reset", reset)
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

// checkBody is the wire form of a request (docs/architecture.md, Request attributes). Its string fields
// are text, which refuses JSON null; the reader (see strictjson.Options) refuses names given
// twice, in another case, or unknown.
type checkBody struct {
	Tenant         text        `json:"tenant"`
	User           text        `json:"user"`
	APIKey         text        `json:"api_key"`
	IP             text        `json:"ip"`
	Endpoint       text        `json:"endpoint"`
	Method         text        `json:"method"`
	Tier           text        `json:"tier"`
	Descriptors    descriptors `json:"descriptors"`
	Cost           optionalInt `json:"cost"`
	IdempotencyKey text        `json:"idempotency_key"`
	Rule           text        `json:"rule"` // reset only
	TTL            text        `json:"ttl"`  // reserve only: the lease's life, such as "90s"
}

// text is a string field that refuses null: null is not "" (a caller sending it most likely
// has a bug), and readers differ on it.
type text string

// UnmarshalJSONFrom refuses null and leaves the rest to the default string reader.
func (t *text) UnmarshalJSONFrom(d *jsontext.Decoder) error {
	if d.PeekKind() == 'n' {
		return strictjson.ErrNull
	}
	return errors.ErrUnsupported
}

// descriptors is the free-form string map, read by hand so that a null value is refused like
// a null field (the default map reader would store "").
type descriptors map[string]string

// UnmarshalJSONFrom reads an object of strings.
func (m *descriptors) UnmarshalJSONFrom(d *jsontext.Decoder) error {
	switch k := d.PeekKind(); k {
	case '{':
	case 'n':
		return strictjson.ErrNull
	default:
		return &policy.FieldError{Field: "descriptors", Msg: "must be an object, not " + strictjson.KindName(k)}
	}
	if _, err := d.ReadToken(); err != nil {
		return err
	}
	if *m == nil {
		*m = descriptors{}
	}
	for d.PeekKind() != '}' {
		tok, err := d.ReadToken() // duplicate names are refused here, by the decoder
		if err != nil {
			return duplicateKey(err)
		}
		name := tok.String() // before the next read, which voids tok
		if k := d.PeekKind(); k != '"' {
			if k == 0 { // a syntax error: let the next read report it with its offset
				_, err := d.ReadToken()
				return err
			}
			return &policy.FieldError{Field: "descriptors", Msg: fmt.Sprintf("must be a string, not %s (key %q)", strictjson.KindName(k), name)}
		}
		value, err := d.ReadToken()
		if err != nil {
			return err
		}
		(*m)[name] = value.String()
	}
	_, err := d.ReadToken()
	return err
}

// duplicateKey names a descriptor key given twice as a key of descriptors (the name is the
// caller's, not a field of ours); other errors are left as they are.
func duplicateKey(err error) error {
	var synErr *jsontext.SyntacticError
	if errors.As(err, &synErr) && errors.Is(err, jsontext.ErrDuplicateName) {
		return &policy.FieldError{Field: "descriptors", Msg: fmt.Sprintf("duplicate key %q", synErr.JSONPointer.LastToken())}
	}
	return err
}

// optionalInt tells an absent cost (1) from an explicit 0 (look) without allocating a pointer.
type optionalInt struct {
	v   int64
	set bool
}

// UnmarshalJSONFrom reads a JSON integer: digits only, so 1.0, 1e3 and "1" are refused rather
// than rounded or converted.
func (o *optionalInt) UnmarshalJSONFrom(d *jsontext.Decoder) error {
	v, err := d.ReadValue()
	if err != nil {
		return err
	}
	if k := v.Kind(); k != '0' {
		return &policy.FieldError{Field: "cost", Msg: "must be an integer, not " + strictjson.KindName(k)}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return &policy.FieldError{Field: "cost", Msg: fmt.Sprintf("%s is out of range", v)}
	}
	if err != nil {
		return &policy.FieldError{Field: "cost", Msg: fmt.Sprintf("%s is not an integer", v)}
	}
	o.v, o.set = n, true
	return nil
}

func (b *checkBody) request() sluice.Request {
	return sluice.Request{
		Tenant: string(b.Tenant), User: string(b.User), APIKey: string(b.APIKey), IP: string(b.IP),
		Endpoint: string(b.Endpoint), Method: string(b.Method), Tier: string(b.Tier),
		Descriptors: b.Descriptors, Cost: b.Cost.v, IdempotencyKey: string(b.IdempotencyKey),
	}
}

// decode reads and validates the body into sc.req. Invalid UTF-8 is refused before decoding
// with a message of its own (the decoder refuses it too), because a reader that replaced it
// would let two callers share a bucket.
//
// The reader is JSON v2 (github.com/go-json-experiment/json, encoding/json/v2 from Go 1.27)
// rather than a scanner of our own: it is strict by default and, reading into a struct from a
// pooled decoder, about four times faster than encoding/json here (BenchmarkCheckHandler).
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
	// The decoder reads sc.body in place (a *bytes.Buffer is not copied).
	sc.dec.Reset(&sc.body, strictjson.Options)
	// A top-level null would leave the struct as it is and pass as {}.
	if k := sc.dec.PeekKind(); k != '{' && k != 0 {
		return &policy.FieldError{Field: "body", Msg: "must be an object, not " + strictjson.KindName(k)}
	}
	if err := jsonv2.UnmarshalDecode(&sc.dec, &sc.req); err != nil {
		return strictjson.Error(err)
	}
	if _, err := sc.dec.ReadToken(); err != io.EOF {
		return &policy.FieldError{Field: "body", Msg: "more than one JSON value"}
	}
	return nil
}

func (s *Server) check(w http.ResponseWriter, r *http.Request, quota bool) {
	start := time.Now()
	ctx := r.Context()
	var sp *tracing.Span
	if s.opts.Tracer != nil {
		name := tracing.CheckSpan
		if quota {
			name = tracing.QuotaSpan
		}
		ctx, sp = s.opts.Tracer.StartHTTP(ctx, r.Header, "http", name)
	}
	sc := s.buffers.Get().(*scratch)
	defer s.buffers.Put(sc)
	if err := s.decode(w, r, sc); err != nil {
		sp.EndCheck(nil, nil, err)
		s.fail(w, err)
		return
	}
	if sc.req.TTL != "" {
		err := &policy.FieldError{Field: "ttl", Msg: "taken only by /v1/reserve"}
		sp.EndCheck(nil, nil, err)
		s.fail(w, err)
		return
	}
	req := sc.req.request()
	var err error
	look := quota || (sc.req.Cost.set && sc.req.Cost.v == 0)
	if look {
		sp.Look()
		err = s.lim.Quota(ctx, &req, &sc.d)
	} else {
		err = s.lim.Check(ctx, &req, &sc.d)
	}
	sp.EndCheck(&req, &sc.d, err)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.m.ObserveCheck("http", &sc.d, time.Since(start))
	if !look {
		s.opts.Events.Check(&req, &sc.d)
	}
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
	if err := requireJSON(r.Header); err != nil {
		s.m.Rejected("http", "invalid")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Accept-Post", "application/json")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	sc := s.buffers.Get().(*scratch)
	defer s.buffers.Put(sc)
	if err := s.decode(w, r, sc); err != nil {
		s.fail(w, err)
		return
	}
	req := sc.req.request()
	n, err := s.lim.Reset(r.Context(), &req, string(sc.req.Rule))
	if err != nil {
		s.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"keys_reset":%d}`, n)
}

// requireJSON refuses a body not declared as application/json (strictjson.ContentType says
// why). Resets change state, so they must not be open to a cross-site form.
func requireJSON(h http.Header) error {
	return strictjson.ContentType(h.Get("Content-Type"), "application/json")
}

// ready answers GET /readyz: 200 {"status":"ready","store":"up",...} when every required check
// passes within ReadyTimeout, else 503 {"status":"not ready","store":"down","error":"store: ..."}.
// Each check runs in its own goroutine and is waited for only until the deadline, so a store
// that hangs (whatever its client does) cannot hold the probe.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.ReadyTimeout)
	defer cancel()
	answers := make([]<-chan singleflight.Result, len(s.opts.Ready))
	for i, c := range s.opts.Ready {
		answers[i] = s.probes.DoChan(c.Name, func() (any, error) {
			// Not the probe's context: the check is shared with the probes that join it.
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.ReadyTimeout)
			defer cancel()
			return nil, c.Check(ctx)
		})
	}
	body := map[string]string{"status": "ready", "policy_version": s.lim.Policy().Version}
	status := http.StatusOK
	var errs []string
	for i, c := range s.opts.Ready {
		var err error
		select {
		case res := <-answers[i]:
			err = res.Err
		case <-ctx.Done():
			select {
			case res := <-answers[i]:
				err = res.Err
			default:
				err = fmt.Errorf("no answer within %v", s.opts.ReadyTimeout)
			}
		}
		if err == nil {
			body[c.Name] = "up"
			continue
		}
		body[c.Name] = "down"
		errs = append(errs, c.Name+": "+err.Error())
		if !c.Optional {
			status = http.StatusServiceUnavailable
			body["status"] = "not ready"
		}
	}
	if len(errs) > 0 {
		body["error"] = strings.Join(errs, "; ")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
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
	case errors.Is(err, sluice.ErrUnknownLease):
		status = http.StatusNotFound
		body["field"] = "lease"
		s.m.Rejected("http", "unknown_lease")
	case errors.Is(err, sluice.ErrLeaseSettled):
		status = http.StatusConflict
		body["field"] = "lease"
		s.m.Rejected("http", "lease_settled")
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
