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
)

// identityIn is the body of PUT /admin/v1/identities/{kind}/{value}. kind and value, and the
// other read-only members of an answer, are accepted so that an answer can be sent back; kind
// and value must then equal the path's.
type identityIn struct {
	Tier          string    `json:"tier"`
	Tenant        string    `json:"tenant"`
	User          string    `json:"user"`
	Trust         *float64  `json:"trust"`
	Kind          string    `json:"kind"`
	Value         string    `json:"value"`
	UpdatedBy     string    `json:"updated_by"`
	UpdatedAt     time.Time `json:"updated_at"`
	PolicyVersion string    `json:"policy_version"`
}

// identityOut is an assignment answer. An API key's assignment shows the key: the operator
// chose it and addressed it in the path, so the answer tells nothing new; logs never show it.
type identityOut struct {
	control.Identity
	PolicyVersion string `json:"policy_version,omitempty"`
}

// redactedError hides a value (an API key) from the message of a store failure, which is
// logged, and keeps what errors.Is needs.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact returns err with every spelling of value in its message replaced, for kind api_key.
func redact(err error, kind control.IdentityKind, value string) error {
	if err == nil || kind != control.IdentityAPIKey || value == "" {
		return err
	}
	msg := err.Error()
	for _, v := range []string{value, strings.Trim(strconv.Quote(value), `"`), url.PathEscape(value)} {
		msg = strings.ReplaceAll(msg, v, "[api_key]")
	}
	return &redactedError{msg: msg, err: err}
}

// pathIdentity reads {kind} and {value}. An unknown kind names nothing: 404, except for a
// PUT, which would create it: 400 naming kind.
func pathIdentity(r *http.Request) (control.IdentityKind, string, error) {
	kind := control.IdentityKind(r.PathValue("kind"))
	switch kind {
	case control.IdentityAPIKey, control.IdentityUser, control.IdentityTenant:
		return kind, r.PathValue("value"), nil
	}
	if r.Method == http.MethodPut {
		return "", "", &policy.FieldError{Field: "kind", Msg: fmt.Sprintf("%q is not api_key, user or tenant", kind)}
	}
	return "", "", control.ErrNotFound
}

func (s *Server) listIdentities(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "kind", "limit", "after")
	if err != nil {
		return err
	}
	kind := control.IdentityKind(q.Get("kind"))
	if kind != "" && !validKind(kind) {
		return &policy.FieldError{Field: "kind", Msg: fmt.Sprintf("%q is not api_key, user or tenant", kind)}
	}
	pg, err := newPager(q, partIdentity)
	if err != nil {
		return err
	}
	p := control.Page{Limit: pg.room()}
	p.AfterKind, p.AfterName = pg.after.identity()
	ids, err := s.store.PageIdentities(r.Context(), kind, p)
	if err != nil {
		return err
	}
	for _, id := range ids {
		pg.add(id, cursor{part: partIdentity, name: string(id.Kind) + ":" + id.Value})
	}
	return pg.answer(w, "identities")
}

func (s *Server) getIdentity(w http.ResponseWriter, r *http.Request) error {
	kind, value, err := pathIdentity(r)
	if err != nil {
		return err
	}
	id, err := s.store.GetIdentity(r.Context(), kind, value)
	if err != nil {
		return redact(err, kind, value)
	}
	return answer(w, http.StatusOK, etag(id.Version), identityOut{Identity: id})
}

func (s *Server) putIdentity(w http.ResponseWriter, r *http.Request) error {
	kind, value, err := pathIdentity(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	var in identityIn
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	if in.Kind != "" && in.Kind != string(kind) {
		return &policy.FieldError{Field: "kind", Msg: "differs from the kind in the path"}
	}
	if in.Value != "" && in.Value != value {
		return &policy.FieldError{Field: "value", Msg: "differs from the value in the path"}
	}
	id := control.Identity{Kind: kind, Value: value, Tier: in.Tier, Tenant: in.Tenant, User: in.User, Trust: in.Trust}
	if err := id.Validate(); err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	id, _, err = s.store.PutIdentity(r.Context(), ch, id)
	if err != nil {
		return redact(err, kind, value)
	}
	return answer(w, http.StatusOK, etag(id.Version), identityOut{Identity: id, PolicyVersion: s.changed(r.Context(), w, id.Version)})
}

func (s *Server) deleteIdentity(w http.ResponseWriter, r *http.Request) error {
	kind, value, err := pathIdentity(r)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteIdentity(r.Context(), ch, kind, value)
	if err != nil {
		return redact(err, kind, value)
	}
	return s.deleted(r.Context(), w, v)
}

// ---- tokens

// tokenIn is the body of POST /admin/v1/tokens.
type tokenIn struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// TTL, when given, makes the token expire that long after its creation ("90d").
	TTL *string `json:"ttl"`
}

// tokenCreated is the one answer that shows a token's secret.
type tokenCreated struct {
	Name          string       `json:"name"`
	Role          control.Role `json:"role"`
	Token         string       `json:"token"`
	CreatedBy     string       `json:"created_by"`
	CreatedAt     time.Time    `json:"created_at"`
	ExpiresAt     *time.Time   `json:"expires_at,omitempty"`
	PolicyVersion string       `json:"policy_version"`
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "limit", "after")
	if err != nil {
		return err
	}
	pg, err := newPager(q, partName)
	if err != nil {
		return err
	}
	toks, err := s.store.PageTokens(r.Context(), control.Page{AfterName: pg.after.name, Limit: pg.room()})
	if err != nil {
		return err
	}
	for _, t := range toks {
		pg.add(t, cursor{part: partName, name: t.Name}) // Token's JSON has no hash
	}
	return pg.answer(w, "tokens")
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	var in tokenIn
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	secret, err := NewSecret()
	if err != nil {
		return err
	}
	tok := control.Token{Name: in.Name, Role: control.Role(in.Role), Hash: control.HashToken(secret)}
	if err := tok.Validate(); err != nil {
		return err
	}
	if in.TTL != nil {
		d, err := policy.ParseDuration(*in.TTL)
		if err != nil {
			return &policy.FieldError{Field: "ttl", Msg: err.Error()}
		}
		if d <= 0 {
			return &policy.FieldError{Field: "ttl", Msg: "must be > 0; leave it out for a token that never expires"}
		}
		at := s.now().Add(d).UTC()
		tok.ExpiresAt = &at
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	tok, err = s.store.CreateToken(r.Context(), ch, tok)
	if err != nil {
		return err
	}
	return answer(w, http.StatusCreated, etag(tok.Version), tokenCreated{
		Name: tok.Name, Role: tok.Role, Token: secret, CreatedBy: tok.CreatedBy, CreatedAt: tok.CreatedAt,
		ExpiresAt: tok.ExpiresAt, PolicyVersion: s.changed(r.Context(), w, tok.Version),
	})
}

// errLastAdmin answers a deletion of the last admin token (control.ErrLastAdmin), which the
// store refuses inside the deletion's transaction.
var errLastAdmin = &statusError{status: http.StatusConflict, msg: "this is the last admin token; create another admin token first"}

func (s *Server) deleteToken(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteToken(r.Context(), ch, name)
	if errors.Is(err, control.ErrLastAdmin) {
		return errLastAdmin
	}
	if err != nil {
		return err
	}
	return s.deleted(r.Context(), w, v)
}
