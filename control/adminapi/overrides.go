package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Policy-file overrides and exemptions have no stored id; the API numbers them -1, -2, ... in
// the files' order, so they can be read (and refused deletion) like stored ones, whose ids are
// positive. The numbers change when the files do.
func fileID(i int) int64 { return -int64(i) - 1 }

// fileIndex is the position in the files of a negative id, or -1.
func fileIndex(id int64, n int) int {
	if id >= 0 || -id > int64(n) {
		return -1
	}
	return int(-id - 1)
}

// pathID reads the {id} of a path; an id that is not an integer names nothing (404).
func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id == 0 {
		return 0, control.ErrNotFound
	}
	return id, nil
}

// query returns r's query parameters after refusing any not in allowed, and any given twice:
// a misspelled filter must not silently widen a listing.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, &policy.FieldError{Field: "query", Msg: "malformed: " + err.Error()}
	}
	for k, v := range q {
		known := false
		for _, a := range allowed {
			known = known || k == a
		}
		if !known {
			return nil, &policy.FieldError{Field: k, Msg: fmt.Sprintf("unknown query parameter; this call takes %s", strings.Join(allowed, ", "))}
		}
		if len(v) > 1 {
			return nil, &policy.FieldError{Field: k, Msg: "given more than once"}
		}
	}
	return q, nil
}

// parseTime reads an RFC 3339 time parameter or field.
func parseTime(field, s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, &policy.FieldError{Field: field, Msg: fmt.Sprintf("%q is not an RFC 3339 time such as 2026-12-01T00:00:00Z", s)}
	}
	return t.UTC(), nil
}

// ---- overrides

// overrideIn is the body of POST /admin/v1/overrides.
type overrideIn struct {
	Tenant string `json:"tenant"`
	User   string `json:"user"`
	APIKey string `json:"api_key"`
	// APIKeyHash and IP are the targets the abuse detector names callers by (an API key by
	// its hash, as violations show it; an address or CIDR, alone).
	APIKeyHash string  `json:"api_key_hash"`
	IP         string  `json:"ip"`
	Endpoint   string  `json:"endpoint"`
	Rule       string  `json:"rule"`
	Type       string  `json:"type"`
	Value      float64 `json:"value"`
	Limit      int64   `json:"limit"`
	Burst      int64   `json:"burst"`
	ExpiresAt  *string `json:"expires_at"`
	TTL        *string `json:"ttl"`
	Reason     string  `json:"reason"`
}

// overrideOut is an override answer.
type overrideOut struct {
	control.Override
	PolicyVersion string `json:"policy_version,omitempty"`
}

// fileOverrideOut is an override of a policy file; Source shadows the file's own field
// ("operator" or "automatic"), since for the API its source is the file.
type fileOverrideOut struct {
	ID int64 `json:"id"`
	policy.Override
	Source string `json:"source"`
}

func fileOverride(i int, o policy.Override) fileOverrideOut {
	o.ExpiresAt = o.ExpiresAt.UTC()
	return fileOverrideOut{ID: fileID(i), Override: o, Source: "file"}
}

// expiry reads exactly one of expires_at (RFC 3339) and ttl (a duration from now).
func (s *Server) expiry(expiresAt, ttl *string) (time.Time, error) {
	switch {
	case expiresAt != nil && ttl != nil:
		return time.Time{}, &policy.FieldError{Field: "ttl", Msg: "give expires_at or ttl, not both"}
	case ttl != nil:
		d, err := policy.ParseDuration(*ttl)
		if err != nil {
			return time.Time{}, &policy.FieldError{Field: "ttl", Msg: err.Error()}
		}
		if d <= 0 {
			return time.Time{}, &policy.FieldError{Field: "ttl", Msg: "must be > 0"}
		}
		return s.now().Add(d).UTC(), nil
	case expiresAt != nil:
		t, err := parseTime("expires_at", *expiresAt)
		if err != nil {
			return t, err
		}
		if !t.After(s.now()) {
			return t, &policy.FieldError{Field: "expires_at", Msg: "must be in the future"}
		}
		return t, nil
	}
	return time.Time{}, &policy.FieldError{Field: "expires_at", Msg: "required: give expires_at (RFC 3339) or ttl (such as 5m)"}
}

// checkOverride asks policy what it asks of a file's override, so API overrides compile the
// same way (a multiplier's bounds, a custom override's limit, an endpoint without wildcards).
func checkOverride(o control.Override) error {
	po := policy.Override{
		Tenant: o.Tenant, User: o.User, APIKey: o.APIKey, APIKeyHash: o.APIKeyHash, IP: o.IP, Endpoint: o.Endpoint, Type: string(o.Type),
		Value: o.Value, Limit: o.Limit, Burst: o.Burst, ExpiresAt: o.ExpiresAt, Reason: o.Reason,
	}
	_, err := policy.Compile(&policy.Config{Overrides: []policy.Override{po}})
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		return &policy.FieldError{Field: strings.TrimPrefix(fe.Field, "overrides[0]."), Msg: fe.Msg}
	}
	return err
}

// ruleExists checks an override's rule against the files' rules and the stored ones.
func (s *Server) ruleExists(r *http.Request, name string) error {
	if _, ok := s.fileRule(name); ok {
		return nil
	}
	if s.files().Envoy.NamesLimit(name) {
		return nil
	}
	_, err := s.store.GetRule(r.Context(), name)
	if errors.Is(err, control.ErrNotFound) {
		if ok, derr := s.domainLimitNamed(r, name); derr != nil || ok {
			return derr
		}
		return &policy.FieldError{Field: "rule", Msg: "no rule with that name, nor an Envoy limit of that name or stat key"}
	}
	return err
}

// domainLimitNamed reports whether an Envoy domain of the control store has a limit name
// names (its rate_limit name or stat key). Only an override naming no rule of the files or
// the store asks, so the domains are loaded here rather than kept.
func (s *Server) domainLimitNamed(r *http.Request, name string) (bool, error) {
	domains, err := s.store.ListDomains(r.Context())
	if err != nil {
		return false, err
	}
	for _, d := range domains {
		cfg, err := envoyconf.Load(map[string][]byte{d.Name: d.Body}, false)
		if err == nil && cfg.NamesLimit(name) {
			return true, nil
		}
	}
	return false, nil
}

func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "tenant", "user", "api_key", "source", "limit", "after")
	if err != nil {
		return err
	}
	f := control.OverrideFilter{Tenant: q.Get("tenant"), User: q.Get("user"), APIKey: q.Get("api_key"), Source: control.Source(q.Get("source"))}
	switch f.Source {
	case "", "file", control.SourceAPI, control.SourceAutomatic:
	default:
		return &policy.FieldError{Field: "source", Msg: fmt.Sprintf("%q is not file, api or automatic", f.Source)}
	}
	pg, err := newPager(q, partFile, partID)
	if err != nil {
		return err
	}
	// The policy files' overrides first, by index, then the store's, by id.
	if (f.Source == "" || f.Source == "file") && pg.reads(partID) {
		now := s.now()
		files := s.files().Overrides
		start := 0
		if pg.after.part == partFile {
			start = int(min(pg.after.key, int64(len(files)))) + 1
		}
		for i := start; i < len(files) && !pg.full(); i++ {
			o := files[i]
			if !o.ExpiresAt.After(now) || (f.Tenant != "" && o.Tenant != f.Tenant) ||
				(f.User != "" && o.User != f.User) || (f.APIKey != "" && o.APIKey != f.APIKey) {
				continue
			}
			pg.add(fileOverride(i, o), cursor{part: partFile, key: int64(i)})
		}
	}
	if f.Source != "file" && pg.reads() {
		if pg.after.part == partID {
			f.AfterID = pg.after.key
		}
		f.Limit = pg.room()
		stored, err := s.store.ListOverrides(r.Context(), f)
		if err != nil {
			return err
		}
		for _, o := range stored {
			pg.add(overrideOut{Override: o}, cursor{part: partID, key: o.ID})
		}
	}
	return pg.answer(w, "overrides")
}

func (s *Server) getOverride(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	if id < 0 {
		files := s.files().Overrides
		i := fileIndex(id, len(files))
		if i < 0 {
			return control.ErrNotFound
		}
		return answer(w, http.StatusOK, "", fileOverride(i, files[i]))
	}
	o, err := s.store.GetOverride(r.Context(), id)
	if err != nil {
		return err
	}
	return answer(w, http.StatusOK, etag(o.Version), overrideOut{Override: o})
}

func (s *Server) createOverride(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	var in overrideIn
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	expires, err := s.expiry(in.ExpiresAt, in.TTL)
	if err != nil {
		return err
	}
	o := control.Override{
		Tenant: in.Tenant, User: in.User, APIKey: in.APIKey, APIKeyHash: in.APIKeyHash, IP: in.IP,
		Endpoint: in.Endpoint, Rule: in.Rule,
		Type: control.OverrideType(in.Type), Value: in.Value, Limit: in.Limit, Burst: in.Burst,
		ExpiresAt: expires, Reason: in.Reason, Source: control.SourceAPI,
	}
	if err := o.Validate(); err != nil {
		return err
	}
	if err := control.CheckText("reason", in.Reason, 1, control.MaxReasonLen); err != nil {
		return err
	}
	if err := checkOverride(o); err != nil {
		return err
	}
	if o.Rule != "" {
		if err := s.ruleExists(r, o.Rule); err != nil {
			return err
		}
	}
	ch, err := change(r, in.Reason)
	if err != nil {
		return err
	}
	o, err = s.store.CreateOverride(r.Context(), ch, o)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/admin/v1/overrides/"+strconv.FormatInt(o.ID, 10))
	return answer(w, http.StatusCreated, etag(o.Version), overrideOut{Override: o, PolicyVersion: s.changed(r.Context(), w, o.Version)})
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request) error {
	id, err := s.apiID(r, "override", len(s.files().Overrides))
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteOverride(r.Context(), ch, id)
	if err != nil {
		return err
	}
	return s.deleted(r.Context(), w, v)
}

// ---- exemptions

// exemptionIn is the body of POST /admin/v1/exemptions.
type exemptionIn struct {
	APIKey    string  `json:"api_key"`
	User      string  `json:"user"`
	Tenant    string  `json:"tenant"`
	IP        string  `json:"ip"`
	Reason    string  `json:"reason"`
	ExpiresAt *string `json:"expires_at"`
}

// exemptionOut is an exemption answer.
type exemptionOut struct {
	control.Exemption
	Source        string `json:"source"`
	PolicyVersion string `json:"policy_version,omitempty"`
}

type fileExemptionOut struct {
	ID int64 `json:"id"`
	policy.Exemption
	Source string `json:"source"`
}

func (s *Server) listExemptions(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "source", "limit", "after")
	if err != nil {
		return err
	}
	src := q.Get("source")
	switch src {
	case "", "file", "api":
	default:
		return &policy.FieldError{Field: "source", Msg: fmt.Sprintf("%q is not file or api", src)}
	}
	pg, err := newPager(q, partFile, partID)
	if err != nil {
		return err
	}
	// The policy files' exemptions first, by index, then the store's, by id.
	if src != "api" && pg.reads(partID) {
		files := s.files().Exemptions
		start := 0
		if pg.after.part == partFile {
			start = int(min(pg.after.key, int64(len(files)))) + 1
		}
		for i := start; i < len(files) && !pg.full(); i++ {
			pg.add(fileExemptionOut{ID: fileID(i), Exemption: files[i], Source: "file"}, cursor{part: partFile, key: int64(i)})
		}
	}
	if src != "file" && pg.reads() {
		p := control.Page{Limit: pg.room()}
		if pg.after.part == partID {
			p.AfterID = pg.after.key
		}
		stored, err := s.store.PageExemptions(r.Context(), p)
		if err != nil {
			return err
		}
		for _, e := range stored {
			pg.add(exemptionOut{Exemption: e, Source: "api"}, cursor{part: partID, key: e.ID})
		}
	}
	return pg.answer(w, "exemptions")
}

func (s *Server) getExemption(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	if id < 0 {
		files := s.files().Exemptions
		i := fileIndex(id, len(files))
		if i < 0 {
			return control.ErrNotFound
		}
		return answer(w, http.StatusOK, "", fileExemptionOut{ID: id, Exemption: files[i], Source: "file"})
	}
	e, err := s.store.GetExemption(r.Context(), id)
	if err != nil {
		return err
	}
	return answer(w, http.StatusOK, etag(e.Version), exemptionOut{Exemption: e, Source: "api"})
}

func (s *Server) createExemption(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	var in exemptionIn
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	e := control.Exemption{APIKey: in.APIKey, User: in.User, Tenant: in.Tenant, IP: in.IP, Reason: in.Reason}
	if in.ExpiresAt != nil {
		t, err := parseTime("expires_at", *in.ExpiresAt)
		if err != nil {
			return err
		}
		if !t.After(s.now()) {
			return &policy.FieldError{Field: "expires_at", Msg: "must be in the future"}
		}
		e.ExpiresAt = &t
	}
	if err := e.Validate(); err != nil {
		return err
	}
	if err := control.CheckText("reason", in.Reason, 1, control.MaxReasonLen); err != nil {
		return err
	}
	// policy checks the address or CIDR as it checks a file's exemption.
	_, err = policy.Compile(&policy.Config{Exemptions: []policy.Exemption{{APIKey: e.APIKey, User: e.User, Tenant: e.Tenant, IP: e.IP}}})
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		return &policy.FieldError{Field: strings.TrimPrefix(fe.Field, "exemptions[0]."), Msg: fe.Msg}
	} else if err != nil {
		return err
	}
	ch, err := change(r, in.Reason)
	if err != nil {
		return err
	}
	e, err = s.store.CreateExemption(r.Context(), ch, e)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/admin/v1/exemptions/"+strconv.FormatInt(e.ID, 10))
	return answer(w, http.StatusCreated, etag(e.Version), exemptionOut{Exemption: e, Source: "api", PolicyVersion: s.changed(r.Context(), w, e.Version)})
}

func (s *Server) deleteExemption(w http.ResponseWriter, r *http.Request) error {
	id, err := s.apiID(r, "exemption", len(s.files().Exemptions))
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteExemption(r.Context(), ch, id)
	if err != nil {
		return err
	}
	return s.deleted(r.Context(), w, v)
}

// apiID reads the id of an API-made override or exemption (kind) from the path: a file's
// entry (a negative id; files of them) cannot be changed through the API (409), and one
// past the files' is unknown (404).
func (s *Server) apiID(r *http.Request, kind string, files int) (int64, error) {
	id, err := pathID(r)
	if err != nil {
		return 0, err
	}
	if id < 0 {
		if fileIndex(id, files) < 0 {
			return 0, control.ErrNotFound
		}
		return 0, fmt.Errorf("%s: %w", kind, errFileResource)
	}
	return id, nil
}
