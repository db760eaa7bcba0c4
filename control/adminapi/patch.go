package adminapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// PATCH of overrides and exemptions (docs/architecture.md, Admin API): a JSON merge patch of
// the fields that may change in place. The target and the type name what the resource is;
// changing them is a different resource (delete it and create another), so a patch that
// changes them is refused, while one that repeats them (a GET's body sent back) is accepted.

// readOnlyMembers are members of an answer a patch may carry back; they are ignored.
var readOnlyMembers = []string{"id", "source", "created_by", "created_at", "policy_version"}

// splitPatch reads a merge patch: its members set to null, by name, and the rest as one
// object for decodeStrict, without the read-only members.
func splitPatch(body []byte) (set []byte, nulls map[string]bool, _ error) {
	ms, err := readObject(body)
	if err != nil {
		return nil, nil, err
	}
	ms = without(ms, readOnlyMembers...)
	nulls = map[string]bool{}
	kept := ms[:0:0]
	for _, m := range ms {
		if m.value.Kind() == 'n' {
			nulls[m.name] = true
			continue
		}
		kept = append(kept, m)
	}
	return writeObject(kept), nulls, nil
}

// fixed checks a member a patch may only repeat: its new value (nil and null: "") must be cur.
func fixed(field string, got *string, null bool, cur, what string) error {
	if got == nil && !null {
		return nil
	}
	v := ""
	if got != nil {
		v = *got
	}
	if v != cur {
		return &policy.FieldError{Field: field, Msg: "cannot be changed; delete the " + what + " and create another"}
	}
	return nil
}

// overridePatch is the merge patch of PATCH /admin/v1/overrides/{id}.
type overridePatch struct {
	ExpiresAt *string  `json:"expires_at"`
	TTL       *string  `json:"ttl"`
	Value     *float64 `json:"value"`
	Limit     *int64   `json:"limit"`
	Burst     *int64   `json:"burst"`
	Reason    *string  `json:"reason"`
	// The target and the type may only be repeated.
	Tenant     *string `json:"tenant"`
	User       *string `json:"user"`
	APIKey     *string `json:"api_key"`
	APIKeyHash *string `json:"api_key_hash"`
	IP         *string `json:"ip"`
	Endpoint   *string `json:"endpoint"`
	Rule       *string `json:"rule"`
	Type       *string `json:"type"`
}

// applyOverridePatch returns cur with p applied; nulls are the members p set to null.
func (s *Server) applyOverridePatch(cur control.Override, p overridePatch, nulls map[string]bool) (control.Override, error) {
	o := cur
	for _, f := range []struct {
		name string
		got  *string
		cur  string
	}{
		{"tenant", p.Tenant, cur.Tenant}, {"user", p.User, cur.User}, {"api_key", p.APIKey, cur.APIKey},
		{"api_key_hash", p.APIKeyHash, cur.APIKeyHash}, {"ip", p.IP, cur.IP},
		{"endpoint", p.Endpoint, cur.Endpoint}, {"rule", p.Rule, cur.Rule}, {"type", p.Type, string(cur.Type)},
	} {
		if err := fixed(f.name, f.got, nulls[f.name], f.cur, "override"); err != nil {
			return o, err
		}
	}
	for _, name := range []string{"expires_at", "ttl", "reason"} {
		if nulls[name] {
			msg := "cannot be removed: an override always expires; give an RFC 3339 time or a ttl such as 1h"
			if name == "reason" {
				msg = "cannot be removed; give a reason"
			}
			return o, &policy.FieldError{Field: name, Msg: msg}
		}
	}
	if p.ExpiresAt != nil || p.TTL != nil {
		t, err := s.expiry(p.ExpiresAt, p.TTL)
		if err != nil {
			return o, err
		}
		o.ExpiresAt = t
	}
	switch {
	case p.Value != nil:
		o.Value = *p.Value
	case nulls["value"]:
		o.Value = 0
	}
	switch {
	case p.Limit != nil:
		o.Limit = *p.Limit
	case nulls["limit"]:
		o.Limit = 0
	}
	switch {
	case p.Burst != nil:
		o.Burst = *p.Burst
	case nulls["burst"]:
		o.Burst = 0
	}
	if p.Reason != nil {
		o.Reason = *p.Reason
		if err := control.CheckText("reason", o.Reason, 1, control.MaxReasonLen); err != nil {
			return o, err
		}
	}
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, checkOverride(o)
}

// patchOverride applies a merge patch to a stored override in one transaction. Without
// If-Match the read and the write are still one step: the write is conditional on the version
// read, and retried a few times if another writer came between.
func (s *Server) patchOverride(w http.ResponseWriter, r *http.Request) error {
	id, p, nulls, ch, err := openPatch[overridePatch](s, w, r, "override", len(s.files().Overrides),
		"expires_at", "ttl", "value", "limit", "burst", "reason", "tenant", "user", "api_key", "endpoint", "rule", "type")
	if err != nil {
		return err
	}
	o, err := patchInPlace(r.Context(), ch,
		func(ctx context.Context) (control.Override, error) { return s.store.GetOverride(ctx, id) },
		func(cur control.Override) (control.Override, error) { return s.applyOverridePatch(cur, p, nulls) },
		s.store.UpdateOverride)
	if err != nil {
		return err
	}
	return answer(w, http.StatusOK, etag(o.Version), overrideOut{Override: o, PolicyVersion: s.changed(r.Context(), w, o.Version)})
}

// knownMember refuses a member name that is none of names.
func knownMember(name string, names ...string) error {
	for _, n := range names {
		if n == name {
			return nil
		}
	}
	return &policy.FieldError{Field: name, Msg: "unknown field"}
}

// exemptionPatch is the merge patch of PATCH /admin/v1/exemptions/{id}.
type exemptionPatch struct {
	ExpiresAt *string `json:"expires_at"`
	TTL       *string `json:"ttl"`
	Reason    *string `json:"reason"`
	// The caller may only be repeated.
	APIKey *string `json:"api_key"`
	User   *string `json:"user"`
	Tenant *string `json:"tenant"`
	IP     *string `json:"ip"`
	// An exemption has no value, limit or burst; these are here to name them in the refusal.
	Value *float64 `json:"value"`
	Limit *int64   `json:"limit"`
	Burst *int64   `json:"burst"`
}

func (s *Server) applyExemptionPatch(cur control.Exemption, p exemptionPatch, nulls map[string]bool) (control.Exemption, error) {
	e := cur
	for _, f := range []struct {
		name string
		got  *string
		cur  string
	}{
		{"api_key", p.APIKey, cur.APIKey}, {"user", p.User, cur.User}, {"tenant", p.Tenant, cur.Tenant}, {"ip", p.IP, cur.IP},
	} {
		if err := fixed(f.name, f.got, nulls[f.name], f.cur, "exemption"); err != nil {
			return e, err
		}
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"value", p.Value != nil}, {"limit", p.Limit != nil}, {"burst", p.Burst != nil}} {
		if f.set || nulls[f.name] {
			return e, &policy.FieldError{Field: f.name, Msg: "an exemption has no " + f.name + "; it allows its caller without counting"}
		}
	}
	if nulls["reason"] {
		return e, &policy.FieldError{Field: "reason", Msg: "cannot be removed; give a reason"}
	}
	if nulls["ttl"] {
		return e, &policy.FieldError{Field: "ttl", Msg: "give a duration such as 1h, or expires_at: null for no expiry"}
	}
	switch {
	case nulls["expires_at"] && p.TTL != nil:
		return e, &policy.FieldError{Field: "ttl", Msg: "give expires_at or ttl, not both"}
	case nulls["expires_at"]:
		e.ExpiresAt = nil
	case p.ExpiresAt != nil || p.TTL != nil:
		t, err := s.expiry(p.ExpiresAt, p.TTL)
		if err != nil {
			return e, err
		}
		e.ExpiresAt = &t
	}
	if p.Reason != nil {
		e.Reason = *p.Reason
		if err := control.CheckText("reason", e.Reason, 1, control.MaxReasonLen); err != nil {
			return e, err
		}
	}
	return e, e.Validate()
}

// patchExemption applies a merge patch to a stored exemption, as patchOverride does.
func (s *Server) patchExemption(w http.ResponseWriter, r *http.Request) error {
	id, p, nulls, ch, err := openPatch[exemptionPatch](s, w, r, "exemption", len(s.files().Exemptions),
		"expires_at", "ttl", "reason", "api_key", "user", "tenant", "ip", "value", "limit", "burst")
	if err != nil {
		return err
	}
	e, err := patchInPlace(r.Context(), ch,
		func(ctx context.Context) (control.Exemption, error) { return s.store.GetExemption(ctx, id) },
		func(cur control.Exemption) (control.Exemption, error) { return s.applyExemptionPatch(cur, p, nulls) },
		s.store.UpdateExemption)
	if err != nil {
		return err
	}
	return answer(w, http.StatusOK, etag(e.Version), exemptionOut{Exemption: e, Source: "api", PolicyVersion: s.changed(r.Context(), w, e.Version)})
}

// reason is the patch's "reason", nil when absent.
func (p overridePatch) reason() *string { return p.Reason }

// reason is the patch's "reason", nil when absent.
func (p exemptionPatch) reason() *string { return p.Reason }

// openPatch is how a PATCH of an override or exemption starts: the stored resource's id (a
// policy file's is refused), the merge patch decoded strictly into P with the members set to
// null (each must be one of members), and the change, whose reason is the patch's "reason".
func openPatch[P interface{ reason() *string }](s *Server, w http.ResponseWriter, r *http.Request, kind string, files int,
	members ...string) (id int64, p P, nulls map[string]bool, ch control.Change, err error) {
	if id, err = s.apiID(r, kind, files); err != nil {
		return
	}
	body, err := s.readBody(w, r, true)
	if err != nil {
		return
	}
	set, nulls, err := splitPatch(body)
	if err != nil {
		return
	}
	if err = decodeStrict(set, &p); err != nil {
		return
	}
	for name := range nulls {
		if err = knownMember(name, members...); err != nil {
			return
		}
	}
	reason := ""
	if rp := p.reason(); rp != nil {
		reason = *rp
	}
	ch, err = change(r, reason)
	return
}

// patchInPlace reads a resource, patches it and writes it back under the ETag it was read at,
// in one change. Without the caller's If-Match, a write that a concurrent change beat is
// tried again from a fresh read (three times at most); with it, the caller's ETag decides, and
// a resource gone since is a failed precondition, not a 404.
func patchInPlace[T interface{ ETag() string }](ctx context.Context, ch control.Change,
	get func(context.Context) (T, error), patch func(T) (T, error),
	update func(context.Context, control.Change, T) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		cur, err := get(ctx)
		if errors.Is(err, control.ErrNotFound) && ch.IfMatch != "" {
			return cur, control.ErrPreconditionFailed
		}
		if err != nil {
			return cur, err
		}
		next, err := patch(cur)
		if err != nil {
			return next, err
		}
		cond := ch
		if cond.IfMatch == "" {
			cond.IfMatch = cur.ETag()
		}
		next, err = update(ctx, cond, next)
		if errors.Is(err, control.ErrPreconditionFailed) && ch.IfMatch == "" && attempt < 3 {
			continue
		}
		return next, err
	}
}
