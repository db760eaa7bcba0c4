// Package adminapi serves the control plane's admin API under /admin/v1 (docs/architecture.md, Admin API):
// rules, overrides, exemptions, identity assignments, usage, violations, audit, nodes, resets
// and tokens, with bearer-token auth, ETag / If-Match, and an OpenAPI 3 document of it all.
//
// The API writes to a control.Store only; it never touches the enforced policy. The runtime
// compiles what the store holds into its snapshot, and the answers say which version includes a
// change (the Sluice-Policy-Version header and the policy_version field), so an operator can
// compare it with what GET /admin/v1/nodes reports each node enforces.
package adminapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Prefix is the path every admin call starts with; mount the Server there.
const Prefix = "/admin/v1/"

// DefaultMaxBody caps request bodies: a rule is at most control.MaxRuleBodyLen, and a merge
// patch or an answer read back with its metadata is a little larger.
const DefaultMaxBody = 2 * control.MaxRuleBodyLen

// DefaultNodeWindow is how recent a heartbeat must be for GET /admin/v1/nodes to list the node.
const DefaultNodeWindow = 10 * time.Second

// PolicyVersionHeader names the header every change answers with: the policy version that
// includes the change.
const PolicyVersionHeader = "Sluice-Policy-Version"

// Limiter is what usage and reset need of the engine; *sluice.Limiter implements it.
type Limiter interface {
	// Quota fills d with what r could spend now, without consuming.
	Quota(ctx context.Context, r *sluice.Request, d *sluice.Decision) error
	// Reset restores the buckets r addresses (only those of rule when set) and says how many.
	Reset(ctx context.Context, r *sluice.Request, rule string) (int, error)
}

// FilePolicy is what the policy files (--config) hold. The API shows it with "source": "file"
// and refuses to change or delete it (409): files are changed by editing them.
type FilePolicy struct {
	Rules      []policy.Rule
	Overrides  []policy.Override
	Exemptions []policy.Exemption
	// Envoy is the files' Envoy-format configuration, whose limits an override's rule may
	// name (by rate_limit name or stat key); nil for none.
	Envoy *envoyconf.Config
	// Domains are the Envoy-format domains, each to the contents of the file defining it.
	Domains map[string][]byte
}

// FilesFromConfigs gathers the entries of parsed native policy files, in order.
func FilesFromConfigs(cfgs ...*policy.Config) FilePolicy {
	var f FilePolicy
	for _, c := range cfgs {
		if c == nil {
			continue
		}
		f.Rules = append(f.Rules, c.Rules...)
		f.Overrides = append(f.Overrides, c.Overrides...)
		f.Exemptions = append(f.Exemptions, c.Exemptions...)
	}
	return f
}

// Options configure the API. Control is required; the rest have defaults.
type Options struct {
	// Control is the control store every resource lives in.
	Control control.Store
	// Limiter answers GET /admin/v1/usage and POST /admin/v1/reset; without it they answer 503.
	Limiter Limiter
	// Files returns the policy files' entries as they are now (after reloads); nil for none.
	Files func() FilePolicy
	// ValidateRule checks an API rule as the compile step will see it; the default compiles
	// it alone with policy.Compile, so API rules obey exactly the file rules' validation.
	// Errors that are a *policy.FieldError answer 400 naming the field.
	ValidateRule func(policy.Rule) error
	// PolicyVersion renders the policy version that includes a control version, for the
	// Sluice-Policy-Version header, policy_version fields and GET /admin/v1/nodes. The
	// default is the control version in decimal.
	PolicyVersion func(controlVersion int64) string
	// Applied, when set, is called after each change with its control version and returns
	// once this node enforces it (the runtime's Sync), before the change is answered.
	Applied func(ctx context.Context, controlVersion int64) error
	// Fleet answers GET /admin/v1/stats and /top from the live nodes' heartbeats; nil
	// answers 404 (this node collects no statistics).
	Fleet FleetStats
	// Now is the clock for ttl and the nodes window; time.Now when nil.
	Now func() time.Time
	// Logger receives server-side failures (never a secret); slog.Default() when nil.
	Logger *slog.Logger
	// NodeWindow is how recent a heartbeat must be to list its node (DefaultNodeWindow).
	NodeWindow time.Duration
	// WaitTimeout bounds how long a change with ?wait=fleet (or the Sluice-Wait header) waits
	// for every live node to report it before answering 504 (DefaultWaitTimeout).
	WaitTimeout time.Duration
	// MaxFleetWaiters bounds the changes that wait for the fleet at once
	// (DefaultMaxFleetWaiters); one more is refused with 503 before it changes anything.
	MaxFleetWaiters int64
	// MaxBodyBytes caps request bodies (DefaultMaxBody).
	MaxBodyBytes int64
	// AuthFailures bounds the failed authentications of one client IP (DefaultAuthFailures).
	AuthFailures AuthFailureLimit
	// TrustedProxies are the load balancers and proxies whose X-Forwarded-For names the
	// client that failed authentications are counted under; none: the peer address, and no
	// forwarded header is read.
	TrustedProxies []netip.Prefix
	// Registerer receives sluice_admin_auth_failures_total; nil counts nothing.
	Registerer prometheus.Registerer
}

// Server is the admin API; it is an http.Handler for the paths under Prefix.
type Server struct {
	store  control.Store
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	mux    *http.ServeMux
	guards *guard
	// authFails counts and logs failed authentications.
	authFails *authFailures
	// used records when tokens were last used, off the request path.
	used *tokenUse
	// heartbeats shares one read of the nodes' heartbeats among the changes waiting for the
	// fleet; waiting counts them (see MaxFleetWaiters).
	heartbeats singleflight.Group
	waiting    atomic.Int64
	lastBeats  atomic.Pointer[heartbeatRead]
}

// New returns the admin API over o.Control.
func New(o Options) (*Server, error) {
	if o.Control == nil {
		return nil, errors.New("adminapi: Options.Control is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ValidateRule == nil {
		o.ValidateRule = CompileRule
	}
	if o.PolicyVersion == nil {
		o.PolicyVersion = func(v int64) string { return strconv.FormatInt(v, 10) }
	}
	if o.MaxFleetWaiters <= 0 {
		o.MaxFleetWaiters = DefaultMaxFleetWaiters
	}
	if o.NodeWindow <= 0 {
		o.NodeWindow = DefaultNodeWindow
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = DefaultWaitTimeout
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBody
	}
	g, err := newGuard(o.AuthFailures, o.Now)
	if err != nil {
		return nil, err
	}
	fails, err := newAuthFailures(o.Registerer)
	if err != nil {
		g.close()
		return nil, fmt.Errorf("adminapi: %w", err)
	}
	s := &Server{store: o.Control, opts: o, log: o.Logger, now: o.Now, mux: http.NewServeMux(), guards: g, authFails: fails,
		used: newTokenUse(o.Control, o.Logger)}
	s.routes()
	return s, nil
}

// Close releases the failed-authentication limiter and writes the last token uses; the Control
// store is the caller's.
func (s *Server) Close() error {
	s.used.close()
	return s.guards.close()
}

// route is one endpoint: its pattern and the role it needs.
type route struct {
	pattern string
	role    control.Role
	h       func(w http.ResponseWriter, r *http.Request) error
}

func (s *Server) routes() {
	read, write, admin := control.RoleRead, control.RoleWrite, control.RoleAdmin
	for _, rt := range []route{
		{"GET /admin/v1/rules", read, s.listRules},
		{"POST /admin/v1/rules", write, s.createRule},
		{"GET /admin/v1/rules/{name}", read, s.getRule},
		{"PUT /admin/v1/rules/{name}", write, s.putRule},
		{"PATCH /admin/v1/rules/{name}", write, s.patchRule},
		{"DELETE /admin/v1/rules/{name}", write, s.deleteRule},
		{"GET /admin/v1/overrides", read, s.listOverrides},
		{"POST /admin/v1/overrides", write, s.createOverride},
		{"GET /admin/v1/overrides/{id}", read, s.getOverride},
		{"PATCH /admin/v1/overrides/{id}", write, s.patchOverride},
		{"DELETE /admin/v1/overrides/{id}", write, s.deleteOverride},
		{"GET /admin/v1/exemptions", read, s.listExemptions},
		{"POST /admin/v1/exemptions", write, s.createExemption},
		{"GET /admin/v1/exemptions/{id}", read, s.getExemption},
		{"PATCH /admin/v1/exemptions/{id}", write, s.patchExemption},
		{"DELETE /admin/v1/exemptions/{id}", write, s.deleteExemption},
		{"GET /admin/v1/identities", read, s.listIdentities},
		{"GET /admin/v1/identities/{kind}/{value}", read, s.getIdentity},
		{"PUT /admin/v1/identities/{kind}/{value}", write, s.putIdentity},
		{"DELETE /admin/v1/identities/{kind}/{value}", write, s.deleteIdentity},
		{"GET /admin/v1/domains", read, s.listDomains},
		{"GET /admin/v1/domains/{domain}", read, s.getDomain},
		{"PUT /admin/v1/domains/{domain}", write, s.putDomain},
		{"DELETE /admin/v1/domains/{domain}", write, s.deleteDomain},
		{"GET /admin/v1/usage", read, s.usage},
		{"GET /admin/v1/usage/history", read, s.usageHistory},
		{"GET /admin/v1/violations", read, s.violations},
		{"GET /admin/v1/audit", read, s.audit},
		{"GET /admin/v1/nodes", read, s.nodes},
		{"GET /admin/v1/stats", read, s.stats},
		{"GET /admin/v1/top", read, s.top},
		{"POST /admin/v1/reset", write, s.reset},
		{"GET /admin/v1/tokens", admin, s.listTokens},
		{"POST /admin/v1/tokens", admin, s.createToken},
		{"DELETE /admin/v1/tokens/{name}", admin, s.deleteToken},
		{"GET /admin/v1/export", read, s.export},
		{"POST /admin/v1/import", write, s.importBundle},
	} {
		s.mux.Handle(rt.pattern, s.endpoint(rt))
	}
	s.mux.HandleFunc("GET /admin/v1/openapi.json", serveOpenAPI)
	s.mux.HandleFunc("/", s.unrouted)
}

// tokenKey carries the caller's token in a request's context.
type tokenKey struct{}

// ServeHTTP authenticates every call but GET /admin/v1/openapi.json before routing it, so a
// caller without a valid token learns nothing, not even which paths exist: 401 everywhere.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/admin/v1/openapi.json" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		s.mux.ServeHTTP(w, r)
		return
	}
	tok, err := s.authenticate(r.Context(), s.clientIP(r), r.Header.Get("Authorization"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenKey{}, tok)))
}

// endpoint checks the caller's role, then runs the handler and answers its error.
func (s *Server) endpoint(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := r.Context().Value(tokenKey{}).(control.Token)
		if !tok.Role.Allows(rt.role) {
			s.fail(w, r, fmt.Errorf("%w: this call needs a %s token; %q is %s", ErrForbidden, rt.role, tok.Name, tok.Role))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			fleet, err := wantsFleet(r)
			if err != nil {
				s.fail(w, r, err)
				return
			}
			if fleet {
				if s.waiting.Add(1) > s.opts.MaxFleetWaiters {
					s.waiting.Add(-1)
					s.fail(w, r, errTooManyWaiting)
					return
				}
				s.serveWaiting(w, r, rt.h)
				s.waiting.Add(-1)
				return
			}
		}
		if err := rt.h(w, r); err != nil {
			s.fail(w, r, err)
		}
	})
}

// unrouted answers a path under Prefix that no route takes: 405 with Allow when the path
// exists for other methods, else 404.
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		if allow[0] == http.MethodGet {
			allow = append(allow, http.MethodHead)
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed here; use %s", r.Method, strings.Join(allow, ", ")), "")
		return
	}
	writeError(w, http.StatusNotFound, "no such path in the admin API (see GET /admin/v1/openapi.json)", "")
}

// actor returns the name of the caller's token, the actor of its changes in the audit log.
func actor(r *http.Request) string {
	tok, _ := r.Context().Value(tokenKey{}).(control.Token)
	return tok.Name
}

// change builds the control.Change of a request: its token, its optional reason (the
// X-Sluice-Reason header, for changes whose body has none) and its If-Match.
func change(r *http.Request, reason string) (control.Change, error) {
	ch := control.Change{Actor: actor(r), Reason: reason}
	if reason == "" {
		ch.Reason = r.Header.Get("X-Sluice-Reason")
	}
	m, err := ifMatch(r.Header)
	if err != nil {
		return ch, err
	}
	ch.IfMatch = m
	if err := ch.Validate(); err != nil {
		return ch, err
	}
	return ch, nil
}

// ifMatch reads the If-Match header into the form control.Change takes: one entity tag without
// quotes, or "*". A weak tag never matches (RFC 9110 compares If-Match strongly), so it is
// passed on as a value no resource has. Lists of tags are refused: no client of this API needs
// them, and guessing which to check would be wrong.
func ifMatch(h http.Header) (string, error) {
	v := strings.TrimSpace(h.Get("If-Match"))
	switch {
	case v == "" || v == "*":
		return v, nil
	case strings.HasPrefix(v, "W/"):
		return "W/", nil
	case strings.Contains(v, ","):
		return "", &policy.FieldError{Field: "If-Match", Msg: "give one entity tag or *"}
	case len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"':
		return "", &policy.FieldError{Field: "If-Match", Msg: `an entity tag is quoted, as ETag gives it: "12"`}
	}
	return v[1 : len(v)-1], nil
}

// etag quotes a control version for the ETag header.
func etag(version int64) string { return `"` + control.ETag(version) + `"` }

// contentETag is the ETag of an answer that is not one stored resource (a list, a file
// resource, usage): a hash of its body, so equal answers have equal tags.
func contentETag(body []byte) string {
	sum := sha256.Sum256(body)
	return `"h` + hex.EncodeToString(sum[:8]) + `"`
}

// answer writes a JSON answer with its ETag: tag when set, else the body's hash.
func answer(w http.ResponseWriter, status int, tag string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode answer: %w", err)
	}
	return answerRaw(w, status, tag, body)
}

func answerRaw(w http.ResponseWriter, status int, tag string, body []byte) error {
	if tag == "" {
		tag = contentETag(body)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("ETag", tag)
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
	return nil
}

// changed sets the Sluice-Policy-Version header of a change at control version v and returns
// the version's rendering for the body's policy_version.
func (s *Server) changed(ctx context.Context, w http.ResponseWriter, v int64) string {
	if s.opts.Applied != nil {
		// The answering node enforces the change before it answers, so a client that checks
		// right after its change (on this node) sees it. Other nodes follow within a second.
		if err := s.opts.Applied(ctx, v); err != nil {
			s.log.Warn("admin change stored but not yet enforced on this node", "control_version", v, "err", err)
		}
	}
	noteVersion(ctx, v)
	pv := s.opts.PolicyVersion(v)
	w.Header().Set(PolicyVersionHeader, pv)
	return pv
}

// deleted answers a deletion that made control version v.
func (s *Server) deleted(ctx context.Context, w http.ResponseWriter, v int64) error {
	s.changed(ctx, w, v)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// errorBody is every error answer.
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func writeError(w http.ResponseWriter, status int, msg, field string) {
	body, _ := json.Marshal(errorBody{Error: msg, Field: field})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// Errors the handlers return besides the control store's and the authenticator's.
var (
	errFileResource = errors.New("defined in a policy file, which is read-only through the API; edit the file")
	errNoLimiter    = errors.New("this node has no limiter to answer with")
)

// statusError is an error answered with a status of its own.
type statusError struct {
	status int
	msg    string
	field  string
}

func (e *statusError) Error() string { return e.msg }

// fail answers err. Messages of store failures are logged, not returned: they tell an
// attacker about the database. Handlers redact what must not be logged either (an API key,
// see redact) before returning such an error.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var (
		fe  *policy.FieldError
		ie  *control.InvalidError
		se  *statusError
		lim *limitedError
	)
	var ft *fleetTimeout
	switch {
	case errors.As(err, &ft):
		writeFleetTimeout(w, ft)
	case errors.As(err, &se):
		writeError(w, se.status, se.msg, se.field)
	case errors.As(err, &lim):
		w.Header().Set("Retry-After", strconv.Itoa(int(lim.retry.Round(time.Second)/time.Second)))
		writeError(w, http.StatusTooManyRequests, lim.Error(), "")
	case errors.Is(err, ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
		writeError(w, http.StatusUnauthorized, ErrUnauthenticated.Error(), "")
	case errors.Is(err, ErrForbidden):
		writeError(w, http.StatusForbidden, err.Error(), "")
	case errors.As(err, &fe):
		writeError(w, http.StatusBadRequest, fe.Field+": "+fe.Msg, fe.Field)
	case errors.As(err, &ie):
		writeError(w, http.StatusBadRequest, ie.Field+": "+ie.Msg, ie.Field)
	case errors.Is(err, errFileResource):
		writeError(w, http.StatusConflict, err.Error(), "")
	case errors.Is(err, control.ErrPreconditionFailed):
		writeError(w, http.StatusPreconditionFailed, "If-Match does not match the resource's current ETag; read it again", "If-Match")
	case errors.Is(err, control.ErrNotFound):
		writeError(w, http.StatusNotFound, notFoundMessage(r), "")
	case errors.Is(err, control.ErrConflict):
		writeError(w, http.StatusConflict, conflictMessage(r), "")
	case errors.Is(err, errTooManyWaiting):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("wait: %d changes already wait for the fleet on this node; nothing was changed, retry shortly or without wait=fleet", s.opts.MaxFleetWaiters), "wait")
	case errors.Is(err, errNoLimiter):
		writeError(w, http.StatusServiceUnavailable, err.Error(), "")
	case errors.Is(err, policy.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error(), "")
	default:
		msg := err.Error()
		s.log.Error("admin API call failed", "method", r.Method, "pattern", r.Pattern, "error", msg)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "the control store failed; retry shortly (details are in the server log)", "")
	}
}

func notFoundMessage(r *http.Request) string {
	switch {
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/rules/"):
		return "no rule with that name"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/overrides/"):
		return "no override with that id"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/exemptions/"):
		return "no exemption with that id"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/identities/"):
		return "no assignment for that identity"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/domains/"):
		return "no domain with that name"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/tokens/"):
		return "no token with that name"
	}
	return "not found"
}

func conflictMessage(r *http.Request) string {
	switch {
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/rules"):
		return "a rule with that name exists already"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/overrides"):
		return "an active override has the same target (tenant, user, api_key, endpoint, rule); delete it first"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/exemptions"):
		return "an active exemption names the same caller"
	case strings.HasPrefix(r.Pattern, r.Method+" /admin/v1/tokens"):
		return "a token with that name exists already"
	}
	return "conflict"
}
