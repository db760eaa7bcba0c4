package adminapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
)

// usage answers the /v1/quota decision for the query's attributes: every limit that applies,
// with what remains and when it resets. It consumes nothing.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "tenant", "user", "api_key", "ip", "endpoint", "method", "tier")
	if err != nil {
		return err
	}
	if s.opts.Limiter == nil {
		return errNoLimiter
	}
	req := sluice.Request{
		Tenant: q.Get("tenant"), User: q.Get("user"), APIKey: q.Get("api_key"), IP: q.Get("ip"),
		Endpoint: q.Get("endpoint"), Method: q.Get("method"), Tier: q.Get("tier"),
	}
	var d sluice.Decision
	if err := s.opts.Limiter.Quota(r.Context(), &req, &d); err != nil {
		return err
	}
	return answerRaw(w, http.StatusOK, "", d.AppendJSON(nil))
}

// historySteps are the widths GET /admin/v1/usage/history sums per point, with the span it
// shows when from is not given.
var historySteps = map[string]struct{ step, span time.Duration }{
	"1m": {time.Minute, time.Hour},
	"1h": {time.Hour, 24 * time.Hour},
	"1d": {24 * time.Hour, 30 * 24 * time.Hour},
}

// maxHistoryPoints bounds one answer: a week of minutes.
const maxHistoryPoints = 7 * 24 * 60

type usagePoint struct {
	At      time.Time `json:"at"`
	Allowed int64     `json:"allowed"`
	Denied  int64     `json:"denied"`
	Soft    int64     `json:"soft"`
}

func (s *Server) usageHistory(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "rule", "tenant", "from", "to", "step")
	if err != nil {
		return err
	}
	stepName := q.Get("step")
	if stepName == "" {
		stepName = "1m"
	}
	st, ok := historySteps[stepName]
	if !ok {
		return &policy.FieldError{Field: "step", Msg: fmt.Sprintf("%q is not 1m, 1h or 1d", stepName)}
	}
	to := s.now().UTC()
	if v := q.Get("to"); v != "" {
		if to, err = parseTime("to", v); err != nil {
			return err
		}
	}
	from := to.Add(-st.span)
	if v := q.Get("from"); v != "" {
		if from, err = parseTime("from", v); err != nil {
			return err
		}
	}
	if !from.Before(to) {
		return &policy.FieldError{Field: "from", Msg: "must be before to"}
	}
	if to.Sub(from)/st.step > maxHistoryPoints {
		return &policy.FieldError{Field: "from", Msg: fmt.Sprintf("more than %d points of %s; narrow the range or widen the step", maxHistoryPoints, stepName)}
	}
	pts, err := s.store.UsageHistory(r.Context(), control.UsageFilter{Rule: q.Get("rule"), Tenant: q.Get("tenant"), From: from, To: to, Step: st.step})
	if err != nil {
		return err
	}
	out := make([]usagePoint, len(pts))
	for i, p := range pts {
		out[i] = usagePoint{At: p.At.UTC(), Allowed: p.Allowed, Denied: p.Denied, Soft: p.Soft}
	}
	return answer(w, http.StatusOK, "", map[string]any{"points": out})
}

// violation is one entry of GET /admin/v1/violations: the denied ("hard") or soft decisions
// of one minute, rule and identity. api_key is what the counters keep of a key, its hashed
// prefix, never the key.
type violation struct {
	At       time.Time `json:"at"`
	Rule     string    `json:"rule"`
	Tenant   string    `json:"tenant"`
	User     string    `json:"user"`
	APIKey   string    `json:"api_key"`
	IP       string    `json:"ip"`
	Endpoint string    `json:"endpoint"`
	State    string    `json:"state"`
	Count    int64     `json:"count"`
	Limit    int64     `json:"limit"`
}

// limitParam reads ?limit= (1 to control.MaxAuditLimit); 0 when absent.
func limitParam(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > control.MaxAuditLimit {
		return 0, &policy.FieldError{Field: "limit", Msg: fmt.Sprintf("must be an integer from 1 to %d", control.MaxAuditLimit)}
	}
	return n, nil
}

// timeParams reads the optional RFC 3339 parameters since and until.
func timeParams(q url.Values) (since, until time.Time, err error) {
	if v := q.Get("since"); v != "" {
		if since, err = parseTime("since", v); err != nil {
			return
		}
	}
	if v := q.Get("until"); v != "" {
		if until, err = parseTime("until", v); err != nil {
			return
		}
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		err = &policy.FieldError{Field: "since", Msg: "must be before until"}
	}
	return
}

func (s *Server) violations(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "tenant", "user", "api_key", "ip", "rule", "since", "until", "limit", "after")
	if err != nil {
		return err
	}
	since, until, err := timeParams(q)
	if err != nil {
		return err
	}
	limit, err := limitParam(q)
	if err != nil {
		return err
	}
	if limit == 0 {
		limit = control.DefaultAuditLimit
	}
	_, after, err := pageParams(q, partMinute) // the limit is limitParam's, checked above
	if err != nil {
		return err
	}
	var from *control.ViolationKey
	if after.part == partMinute {
		k, _ := after.violation()
		from = &k
	}
	// One count more than the page tells whether a next page exists.
	vs, err := s.store.PageViolations(r.Context(), control.ViolationFilter{
		Tenant: q.Get("tenant"), User: q.Get("user"), APIKey: key.APIKeyFilter(q.Get("api_key")), IP: q.Get("ip"), Rule: q.Get("rule"),
		Since: since, Until: until,
	}, from, limit+1)
	if err != nil {
		return err
	}
	body := map[string]any{}
	if len(vs) > limit {
		vs = vs[:limit]
		body["next"] = violationCursor(vs[limit-1].Key).String()
	}
	out := []violation{}
	for _, v := range vs {
		base := violation{At: v.Minute.UTC(), Rule: v.Rule, Tenant: v.Tenant, User: v.User, APIKey: v.APIKey, IP: v.IP, Endpoint: v.Endpoint, Limit: v.Limit}
		if v.Denied > 0 {
			e := base
			e.State, e.Count = "hard", v.Denied
			out = append(out, e)
		}
		if v.Soft > 0 {
			e := base
			e.State, e.Count = "soft", v.Soft
			out = append(out, e)
		}
	}
	body["violations"] = out
	return answer(w, http.StatusOK, "", body)
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "since", "until", "actor", "action", "kind", "target", "limit", "before_id")
	if err != nil {
		return err
	}
	since, until, err := timeParams(q)
	if err != nil {
		return err
	}
	limit, err := limitParam(q)
	if err != nil {
		return err
	}
	f := control.AuditFilter{Since: since, Until: until, Actor: q.Get("actor"), Action: control.Action(q.Get("action")),
		Kind: control.Kind(q.Get("kind")), Target: q.Get("target"), Limit: limit}
	if f.Action != "" && !f.Action.Valid() {
		return &policy.FieldError{Field: "action", Msg: fmt.Sprintf("%q is not create, update, delete, expire, burst_detected_warning or burst_detected_blocked", f.Action)}
	}
	switch f.Kind {
	case "", control.KindRule, control.KindOverride, control.KindExemption, control.KindIdentity, control.KindToken,
		control.KindPolicyFiles, control.KindPenalty, control.KindDomain:
	default:
		return &policy.FieldError{Field: "kind", Msg: fmt.Sprintf("%q is not rule, override, exemption, identity, token, policy_files, penalty or domain", f.Kind)}
	}
	if v := q.Get("before_id"); v != "" {
		if f.BeforeID, err = strconv.ParseInt(v, 10, 64); err != nil || f.BeforeID < 1 {
			return &policy.FieldError{Field: "before_id", Msg: "must be a positive integer (an event id)"}
		}
	}
	events, err := s.store.Audit(r.Context(), f)
	if err != nil {
		return err
	}
	if events == nil {
		events = []control.AuditEvent{}
	}
	for i := range events {
		events[i].At = events[i].At.UTC()
	}
	return answer(w, http.StatusOK, "", map[string]any{"events": events})
}

// nodeOut is one live node: policy_version renders its control version as change answers do,
// so an operator compares the two; control_version is the number itself.
type nodeOut struct {
	ID             string    `json:"id"`
	Addr           string    `json:"addr"`
	PolicyVersion  string    `json:"policy_version"`
	ControlVersion int64     `json:"control_version"`
	SeenAt         time.Time `json:"seen_at"`
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	ns, err := s.store.Nodes(r.Context(), s.now().Add(-s.opts.NodeWindow))
	if err != nil {
		return err
	}
	out := make([]nodeOut, len(ns))
	for i, n := range ns {
		out[i] = nodeOut{ID: n.ID, Addr: n.Addr, PolicyVersion: s.opts.PolicyVersion(n.PolicyVersion), ControlVersion: n.PolicyVersion, SeenAt: n.SeenAt.UTC()}
	}
	return answer(w, http.StatusOK, "", map[string]any{"nodes": out})
}

// resetIn is the /v1/reset body.
type resetIn struct {
	Tenant      string            `json:"tenant"`
	User        string            `json:"user"`
	APIKey      string            `json:"api_key"`
	IP          string            `json:"ip"`
	Endpoint    string            `json:"endpoint"`
	Method      string            `json:"method"`
	Tier        string            `json:"tier"`
	Descriptors map[string]string `json:"descriptors"`
	Rule        string            `json:"rule"`
}

func (s *Server) reset(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	var in resetIn
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	if s.opts.Limiter == nil {
		return errNoLimiter
	}
	req := sluice.Request{Tenant: in.Tenant, User: in.User, APIKey: in.APIKey, IP: in.IP, Endpoint: in.Endpoint,
		Method: in.Method, Tier: in.Tier, Descriptors: in.Descriptors}
	n, err := s.opts.Limiter.Reset(r.Context(), &req, in.Rule)
	if err != nil {
		return err
	}
	// A reset changes counters, not the policy: the header says which policy it ran under.
	if v, err := s.store.Version(r.Context()); err == nil {
		s.changed(r.Context(), w, v)
	}
	return answer(w, http.StatusOK, "", map[string]int{"keys_reset": n})
}
