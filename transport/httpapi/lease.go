package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/strictjson"
	"github.com/sluicehq/sluice/policy"
)

// reserve answers POST /v1/reserve: the check's body plus ttl; 200 with {lease, reserved,
// expires_at, tenant, ...the decision} when allowed, the check's 429 when denied (nothing consumed).
func (s *Server) reserve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sc := s.buffers.Get().(*scratch)
	defer s.buffers.Put(sc)
	if err := s.decode(w, r, sc); err != nil {
		s.fail(w, err)
		return
	}
	var ttl time.Duration
	if sc.req.TTL != "" {
		d, err := time.ParseDuration(string(sc.req.TTL))
		if err != nil {
			s.fail(w, &policy.FieldError{Field: "ttl", Msg: fmt.Sprintf("%q is not a duration such as 90s or 5m", string(sc.req.TTL))})
			return
		}
		if d <= 0 {
			s.fail(w, &policy.FieldError{Field: "ttl", Msg: "must be positive"})
			return
		}
		ttl = d
	}
	if sc.req.Cost.set && sc.req.Cost.v == 0 {
		s.fail(w, &policy.FieldError{Field: "cost", Msg: "must be >= 1 for a reservation (the estimate); use /v1/quota to look"})
		return
	}
	req := sc.req.request()
	lease, err := s.lim.Reserve(r.Context(), &req, ttl, &sc.d)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.m.ObserveCheck("http", &sc.d, time.Since(start))
	s.m.ObserveSlots(&sc.d)
	s.opts.Events.Check(&req, &sc.d)
	h := w.Header()
	h["Content-Type"] = jsonContentType
	if lease == nil {
		w.WriteHeader(http.StatusTooManyRequests)
		sc.out = sc.d.AppendJSON(sc.out[:0])
		w.Write(sc.out)
		return
	}
	s.m.LeaseReserved()
	out := append(sc.out[:0], `{"lease":`...)
	out = strconv.AppendQuote(out, lease.ID)
	out = append(out, `,"reserved":`...)
	out = strconv.AppendInt(out, lease.Reserved, 10)
	out = append(out, `,"expires_at":"`...)
	out = lease.ExpiresAt.UTC().AppendFormat(out, time.RFC3339Nano)
	// The tenant a commit must name: the control plane may have assigned another than the
	// body's (by api_key).
	out = append(out, `","tenant":`...)
	out = strconv.AppendQuote(out, lease.Tenant)
	out = append(out, ',')
	decision := sc.d.AppendJSON(out[len(out):])
	out = append(out, decision[1:]...) // the decision's fields, after its '{'
	sc.out = out
	w.Write(out)
}

// settleBody is the body of POST /v1/commit and /v1/release.
type settleBody struct {
	Tenant text        `json:"tenant"`
	Lease  text        `json:"lease"`
	Used   optionalInt `json:"used"`
}

// settle answers POST /v1/commit ({tenant, lease, used}) and /v1/release ({tenant, lease}):
// 200 {lease, reserved, used, repeated}; 404 for an unknown, expired or other tenant's lease.
func (s *Server) settle(w http.ResponseWriter, r *http.Request, release bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		s.fail(w, &policy.FieldError{Field: "body", Msg: "unreadable or too large: " + err.Error()})
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		s.fail(w, &policy.FieldError{Field: "body", Msg: "empty; send a JSON object with lease"})
		return
	}
	var b settleBody
	if err := strictjson.Unmarshal(body, &b); err != nil {
		// optionalInt names its field cost: here it is used.
		var fe *policy.FieldError
		if errors.As(err, &fe) && fe.Field == "cost" {
			fe.Field = "used"
		}
		s.fail(w, err)
		return
	}
	if b.Lease == "" {
		s.fail(w, &policy.FieldError{Field: "lease", Msg: "required"})
		return
	}
	switch {
	case release && b.Used.set:
		s.fail(w, &policy.FieldError{Field: "used", Msg: "not taken by /v1/release, which settles with 0; use /v1/commit"})
		return
	case !release && !b.Used.set:
		s.fail(w, &policy.FieldError{Field: "used", Msg: "required: what the work used (0 releases it all)"})
		return
	}
	st, err := s.lim.Commit(r.Context(), string(b.Tenant), string(b.Lease), b.Used.v)
	if err != nil {
		s.fail(w, err)
		return
	}
	if !st.Repeated {
		s.m.LeaseSettled(st.Reserved, st.Used, st.Slots)
	}
	w.Header()["Content-Type"] = jsonContentType
	out := []byte(`{"lease":`)
	out = strconv.AppendQuote(out, st.Lease)
	out = append(out, `,"reserved":`...)
	out = strconv.AppendInt(out, st.Reserved, 10)
	out = append(out, `,"used":`...)
	out = strconv.AppendInt(out, st.Used, 10)
	out = append(out, `,"repeated":`...)
	out = strconv.AppendBool(out, st.Repeated)
	w.Write(append(out, "}\n"...))
}

// renewBody is the body of POST /v1/renew.
type renewBody struct {
	Tenant text `json:"tenant"`
	Lease  text `json:"lease"`
	TTL    text `json:"ttl"`
}

// renew answers POST /v1/renew {tenant, lease, ttl}: 200 {lease, expires_at} for an unsettled
// lease, 404 for one the caller does not hold, 409 for a settled one.
func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		s.fail(w, &policy.FieldError{Field: "body", Msg: "unreadable or too large: " + err.Error()})
		return
	}
	var b renewBody
	if err := strictjson.Unmarshal(body, &b); err != nil {
		s.fail(w, err)
		return
	}
	if b.Lease == "" {
		s.fail(w, &policy.FieldError{Field: "lease", Msg: "required"})
		return
	}
	ttl := sluice.DefaultLeaseTTL
	if b.TTL != "" {
		if ttl, err = time.ParseDuration(string(b.TTL)); err != nil {
			s.fail(w, &policy.FieldError{Field: "ttl", Msg: fmt.Sprintf("%q is not a duration such as 90s or 5m", string(b.TTL))})
			return
		}
	}
	if err := s.lim.Renew(r.Context(), string(b.Tenant), string(b.Lease), ttl); err != nil {
		s.fail(w, err)
		return
	}
	w.Header()["Content-Type"] = jsonContentType
	out := []byte(`{"lease":`)
	out = strconv.AppendQuote(out, string(b.Lease))
	out = append(out, `,"expires_at":"`...)
	out = time.Now().Add(ttl).UTC().AppendFormat(out, time.RFC3339Nano)
	w.Write(append(out, "\"}\n"...))
}
