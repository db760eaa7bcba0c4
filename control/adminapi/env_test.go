package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/internal/testkit/admintest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
)

// secrets are the secrets of the tokens every env starts with, one per role.
var secrets = admintest.Secrets

// env is one admin API over a real SQLite control store and a real limiter on the memory store,
// all on one settable clock.
type env struct {
	t      *testing.T
	store  control.Store
	srv    *adminapi.Server
	clock  *testutil.Clock
	lim    *sluice.Limiter
	logs   *syncBuffer
	ctx    context.Context
	router routers.Router
}

// syncBuffer is a log destination safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var (
	docOnce sync.Once
	doc     *openapi3.T
	docErr  error
)

// openAPIDoc loads and validates the embedded document once.
func openAPIDoc(t *testing.T) *openapi3.T {
	t.Helper()
	docOnce.Do(func() {
		loader := openapi3.NewLoader()
		doc, docErr = loader.LoadFromData(adminapi.OpenAPI())
		if docErr == nil {
			docErr = doc.Validate(context.Background())
		}
	})
	if docErr != nil {
		t.Fatalf("openapi.json: %v", docErr)
	}
	return doc
}

// newEnv stands up the admin API (admintest.New) with its logs kept; opts adjust its options.
func newEnv(t *testing.T, opts ...func(*adminapi.Options)) *env {
	t.Helper()
	logs := &syncBuffer{}
	opts = append([]func(*adminapi.Options){func(o *adminapi.Options) {
		o.PolicyVersion = func(v int64) string { return "pv-" + control.ETag(v) }
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}}, opts...)
	a := admintest.New(t, opts...)
	router, err := legacy.NewRouter(openAPIDoc(t))
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, store: a.Store, srv: a.Server, clock: a.Clock, lim: a.Limiter, logs: logs, ctx: t.Context(), router: router}
}

// call is one request to the API.
type call struct {
	method, path string
	role         control.Role // "" for no Authorization header
	token        string       // a raw secret instead of role's
	body         string
	contentType  string // default application/json when there is a body
	header       map[string]string
	remote       string // client address, default 192.0.2.1:1234
}

// reply is an answer, its body decoded as JSON where it is JSON.
type reply struct {
	status int
	header http.Header
	raw    []byte
	json   map[string]any
}

func (r *reply) str(key string) string {
	s, _ := r.json[key].(string)
	return s
}

// do sends c and validates the answer against the OpenAPI document: its status must be
// documented for the operation and its body and headers must match the schema.
func (e *env) do(c call) *reply {
	e.t.Helper()
	req := e.request(c)
	out := e.send(req)
	e.validate(req, out)
	return out
}

// doPlain is do without checking the answer against the document.
func (e *env) doPlain(c call) *reply {
	e.t.Helper()
	return e.send(e.request(c))
}

// request builds the HTTP request of c.
func (e *env) request(c call) *http.Request {
	req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
	if c.remote != "" {
		req.RemoteAddr = c.remote
	}
	ct := c.contentType
	if ct == "" && c.body != "" {
		ct = "application/json"
	}
	if ct != "" && ct != "-" { // "-": send no Content-Type at all
		req.Header.Set("Content-Type", ct)
	}
	switch {
	case c.token != "":
		req.Header.Set("Authorization", "Bearer "+c.token)
	case c.role != "":
		req.Header.Set("Authorization", "Bearer "+secrets[c.role])
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	return req
}

// send serves req and reads the answer.
func (e *env) send(req *http.Request) *reply {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.srv.ServeHTTP(rec, req)
	res := rec.Result()
	raw, _ := io.ReadAll(res.Body)
	out := &reply{status: res.StatusCode, header: res.Header, raw: raw}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.json); err != nil {
			e.t.Fatalf("%s %s: answer is not a JSON object: %v\n%s", req.Method, req.URL, err, raw)
		}
	}
	if res.StatusCode >= 400 && res.StatusCode != http.StatusMethodNotAllowed && out.str("error") == "" {
		e.t.Errorf("%s %s: %d without an error message: %s", req.Method, req.URL, res.StatusCode, raw)
	}
	return out
}

// validate checks an answer against the document when the request names an operation of it.
func (e *env) validate(req *http.Request, out *reply) {
	e.t.Helper()
	route, params, err := e.router.FindRoute(req)
	if err != nil || strings.HasSuffix(req.URL.Path, "/") { // the router forgives a trailing slash; the API does not
		return // a path or method the document does not have: the tests check 404 and 405
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	err = openapi3filter.ValidateResponse(e.ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: out.status, Header: out.header,
		Body:    io.NopCloser(bytes.NewReader(out.raw)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	})
	if err != nil {
		e.t.Errorf("%s %s: answer %d does not match openapi.json: %v\n%s", req.Method, req.URL, out.status, err, out.raw)
	}
}

// want fails the test unless r has status.
func (r *reply) want(t *testing.T, status int) *reply {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.raw)
	}
	return r
}

// version is the control store's version now.
func (e *env) version() int64 {
	e.t.Helper()
	v, err := e.store.Version(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// auditCount is how many audit events the store holds.
func (e *env) auditCount() int {
	e.t.Helper()
	evs, err := e.store.Audit(e.ctx, control.AuditFilter{Limit: control.MaxAuditLimit})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(evs)
}

// mustCreate makes a change that the test needs in place, as the writer.
func (e *env) mustCreate(method, path, body string) *reply {
	e.t.Helper()
	r := e.do(call{method: method, path: path, role: control.RoleWrite, body: body})
	if r.status != http.StatusCreated && r.status != http.StatusOK {
		e.t.Fatalf("%s %s: %d %s", method, path, r.status, r.raw)
	}
	return r
}

// in returns the clock plus d in RFC 3339.
func (e *env) in(d time.Duration) string { return e.clock.Now().Add(d).UTC().Format(time.RFC3339) }
