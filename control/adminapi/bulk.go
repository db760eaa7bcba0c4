package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/strictjson"
	"github.com/sluicehq/sluice/policy"
)

// MaxImportBody bounds the body of POST /admin/v1/import: 100,000 overrides and as many
// identity assignments take about 30 MB as JSON.
const MaxImportBody = 256 << 20

// bundleDoc is the document of GET /admin/v1/export and POST /admin/v1/import: each entry the
// API's body for that resource (docs/architecture.md, Bulk export and import).
type bundleDoc struct {
	Rules      []json.RawMessage `json:"rules"`
	Overrides  []json.RawMessage `json:"overrides"`
	Exemptions []json.RawMessage `json:"exemptions"`
	Identities []json.RawMessage `json:"identities"`
	Domains    []json.RawMessage `json:"domains"`
}

// overrideDoc is an override as the export writes it: the body that creates it.
type overrideDoc struct {
	Tenant     string    `json:"tenant,omitempty"`
	User       string    `json:"user,omitempty"`
	APIKey     string    `json:"api_key,omitempty"`
	APIKeyHash string    `json:"api_key_hash,omitempty"`
	IP         string    `json:"ip,omitempty"`
	Endpoint   string    `json:"endpoint,omitempty"`
	Rule       string    `json:"rule,omitempty"`
	Type       string    `json:"type"`
	Value      float64   `json:"value,omitempty"`
	Limit      int64     `json:"limit,omitempty"`
	Burst      int64     `json:"burst,omitempty"`
	ExpiresAt  time.Time `json:"expires_at"`
	Reason     string    `json:"reason"`
}

type exemptionDoc struct {
	APIKey    string     `json:"api_key,omitempty"`
	User      string     `json:"user,omitempty"`
	Tenant    string     `json:"tenant,omitempty"`
	IP        string     `json:"ip,omitempty"`
	Reason    string     `json:"reason"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type identityDoc struct {
	Kind   string   `json:"kind"`
	Value  string   `json:"value"`
	Tier   string   `json:"tier,omitempty"`
	Tenant string   `json:"tenant,omitempty"`
	User   string   `json:"user,omitempty"`
	Trust  *float64 `json:"trust,omitempty"`
}

// importOut answers POST /admin/v1/import.
type importOut struct {
	Applied       bool                   `json:"applied"`
	Created       int                    `json:"created"`
	Updated       int                    `json:"updated"`
	Unchanged     int                    `json:"unchanged"`
	Changes       []control.ImportChange `json:"changes"`
	PolicyVersion string                 `json:"policy_version,omitempty"`
}

func marshalAll[T any](in []T, doc func(*T) any) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, 0, len(in))
	for i := range in {
		b, err := json.Marshal(doc(&in[i]))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// export answers GET /admin/v1/export: every resource created through the API (not the
// files' nor the abuse detector's), each as the body that creates it.
func (s *Server) export(w http.ResponseWriter, r *http.Request) error {
	longCall(w)
	if _, err := query(r); err != nil {
		return err
	}
	ctx := r.Context()
	v, err := s.store.Version(ctx)
	if err != nil {
		return err
	}
	var doc bundleDoc
	rules, err := s.store.ListRules(ctx)
	if err != nil {
		return err
	}
	for _, rl := range rules {
		doc.Rules = append(doc.Rules, rl.Body)
	}
	overrides, err := s.store.ListOverrides(ctx, control.OverrideFilter{Source: control.SourceAPI})
	if err != nil {
		return err
	}
	if doc.Overrides, err = marshalAll(overrides, func(o *control.Override) any {
		return overrideDoc{Tenant: o.Tenant, User: o.User, APIKey: o.APIKey, APIKeyHash: o.APIKeyHash, IP: o.IP, Endpoint: o.Endpoint, Rule: o.Rule,
			Type: string(o.Type), Value: o.Value, Limit: o.Limit, Burst: o.Burst, ExpiresAt: o.ExpiresAt.UTC(), Reason: o.Reason}
	}); err != nil {
		return err
	}
	exemptions, err := s.store.ListExemptions(ctx)
	if err != nil {
		return err
	}
	if doc.Exemptions, err = marshalAll(exemptions, func(e *control.Exemption) any {
		return exemptionDoc{APIKey: e.APIKey, User: e.User, Tenant: e.Tenant, IP: e.IP, Reason: e.Reason, ExpiresAt: e.ExpiresAt}
	}); err != nil {
		return err
	}
	ids, err := s.store.ListIdentities(ctx, "")
	if err != nil {
		return err
	}
	if doc.Identities, err = marshalAll(ids, func(id *control.Identity) any {
		return identityDoc{Kind: string(id.Kind), Value: id.Value, Tier: id.Tier, Tenant: id.Tenant, User: id.User, Trust: id.Trust}
	}); err != nil {
		return err
	}
	domains, err := s.store.ListDomains(ctx)
	if err != nil {
		return err
	}
	for _, d := range domains {
		doc.Domains = append(doc.Domains, d.Body)
	}
	for _, l := range []*[]json.RawMessage{&doc.Rules, &doc.Overrides, &doc.Exemptions, &doc.Identities, &doc.Domains} {
		if *l == nil {
			*l = []json.RawMessage{}
		}
	}
	return answer(w, http.StatusOK, etag(v), doc)
}

// entryError names the entry i of list in err's field: "overrides[3].type".
func entryError(list string, i int, err error) error {
	var fe *policy.FieldError
	var ie *control.InvalidError
	switch {
	case errors.As(err, &fe):
		return &policy.FieldError{Field: fmt.Sprintf("%s[%d].%s", list, i, fe.Field), Msg: fe.Msg}
	case errors.As(err, &ie):
		return &policy.FieldError{Field: fmt.Sprintf("%s[%d].%s", list, i, ie.Field), Msg: ie.Msg}
	case errors.Is(err, policy.ErrInvalid), errors.Is(err, control.ErrInvalid):
		return &policy.FieldError{Field: fmt.Sprintf("%s[%d]", list, i), Msg: err.Error()}
	}
	return err
}

// importBundle answers POST /admin/v1/import: the document of export, checked entry by
// entry as the API checks each resource; with ?apply=true it is loaded in one transaction
// (one event per resource in the audit log), else the answer is what would change.
func (s *Server) importBundle(w http.ResponseWriter, r *http.Request) error {
	longCall(w)
	q, err := query(r, "apply")
	if err != nil {
		return err
	}
	apply := false
	switch q.Get("apply") {
	case "", "false":
	case "true":
		apply = true
	default:
		return &policy.FieldError{Field: "apply", Msg: "true or false"}
	}
	if err := strictjson.ContentType(r.Header.Get("Content-Type"), "application/json"); err != nil {
		return &statusError{status: http.StatusUnsupportedMediaType, field: "Content-Type", msg: err.Error()}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxImportBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &statusError{status: http.StatusRequestEntityTooLarge, field: "body", msg: fmt.Sprintf("body: larger than %d bytes", MaxImportBody)}
		}
		return &policy.FieldError{Field: "body", Msg: "unreadable: " + err.Error()}
	}
	if body = bytes.TrimSpace(body); len(body) == 0 || body[0] != '{' {
		return &policy.FieldError{Field: "body", Msg: "must be a JSON object with rules, overrides, exemptions, identities and domains"}
	}
	var doc bundleDoc
	if err := decodeStrict(body, &doc); err != nil {
		return err
	}
	b, err := s.bundle(r, &doc)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	im, ok := s.store.(control.Importer)
	if !ok {
		return &statusError{status: http.StatusNotImplemented, msg: "this control store cannot import"}
	}
	res, err := im.Import(r.Context(), ch, b, apply)
	if err != nil {
		return err
	}
	out := importOut{Applied: apply, Created: res.Created, Updated: res.Updated, Unchanged: res.Unchanged, Changes: res.Changes}
	if out.Changes == nil {
		out.Changes = []control.ImportChange{}
	}
	v := res.Version
	if v > 0 {
		out.PolicyVersion = s.changed(r.Context(), w, v)
	} else {
		// A dry run or an import of nothing new: the version the store is at, which it
		// left as it was.
		if v, err = s.store.Version(r.Context()); err != nil {
			return err
		}
		w.Header().Set(PolicyVersionHeader, s.opts.PolicyVersion(v))
	}
	return answer(w, http.StatusOK, etag(v), out)
}

// bundle checks each entry of doc as its own endpoint checks it.
func (s *Server) bundle(r *http.Request, doc *bundleDoc) (*control.Bundle, error) {
	b := &control.Bundle{}
	names := map[string]bool{}
	for i, raw := range doc.Rules {
		name, stored, err := s.parseRule(raw, "")
		if err != nil {
			return nil, entryError("rules", i, err)
		}
		if _, ok := s.fileRule(name); ok {
			return nil, entryError("rules", i, &policy.FieldError{Field: "name", Msg: "a policy file defines a rule with that name; API rules cannot take it"})
		}
		names[name] = true
		b.Rules = append(b.Rules, control.Rule{Name: name, Body: stored})
	}
	for i, raw := range doc.Overrides {
		o, err := s.importOverride(r, raw, names)
		if err != nil {
			return nil, entryError("overrides", i, err)
		}
		b.Overrides = append(b.Overrides, o)
	}
	for i, raw := range doc.Exemptions {
		e, err := s.importExemption(raw)
		if err != nil {
			return nil, entryError("exemptions", i, err)
		}
		b.Exemptions = append(b.Exemptions, e)
	}
	for i, raw := range doc.Identities {
		var in identityDoc
		if err := decodeStrict(raw, &in); err != nil {
			return nil, entryError("identities", i, err)
		}
		id := control.Identity{Kind: control.IdentityKind(in.Kind), Value: in.Value, Tier: in.Tier, Tenant: in.Tenant, User: in.User, Trust: in.Trust}
		if err := id.Validate(); err != nil {
			return nil, entryError("identities", i, err)
		}
		b.Identities = append(b.Identities, id)
	}
	for i, raw := range doc.Domains {
		var head struct {
			Domain string `json:"domain"`
		}
		if err := json.Unmarshal(raw, &head); err != nil || head.Domain == "" {
			return nil, entryError("domains", i, &policy.FieldError{Field: "domain", Msg: "required: the domain's name"})
		}
		if _, ok := s.files().Domains[head.Domain]; ok {
			return nil, entryError("domains", i, &policy.FieldError{Field: "domain", Msg: "a policy file defines this domain"})
		}
		stored, err := parseDomain(raw, false, head.Domain)
		if err != nil {
			return nil, entryError("domains", i, err)
		}
		b.Domains = append(b.Domains, control.Domain{Name: head.Domain, Body: stored})
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return b, nil
}

// importOverride checks an override as createOverride does; a rule may be one of the bundle.
func (s *Server) importOverride(r *http.Request, raw []byte, rules map[string]bool) (control.Override, error) {
	var in overrideIn
	if err := decodeStrict(raw, &in); err != nil {
		return control.Override{}, err
	}
	expires, err := s.expiry(in.ExpiresAt, in.TTL)
	if err != nil {
		return control.Override{}, err
	}
	o := control.Override{
		Tenant: in.Tenant, User: in.User, APIKey: in.APIKey, APIKeyHash: in.APIKeyHash, IP: in.IP,
		Endpoint: in.Endpoint, Rule: in.Rule,
		Type: control.OverrideType(in.Type), Value: in.Value, Limit: in.Limit, Burst: in.Burst,
		ExpiresAt: expires, Reason: in.Reason, Source: control.SourceAPI,
	}
	if err := o.Validate(); err != nil {
		return o, err
	}
	if err := control.CheckText("reason", in.Reason, 1, control.MaxReasonLen); err != nil {
		return o, err
	}
	if err := checkOverride(o); err != nil {
		return o, err
	}
	if o.Rule != "" && !rules[o.Rule] {
		if err := s.ruleExists(r, o.Rule); err != nil {
			return o, err
		}
	}
	return o, nil
}

// importExemption checks an exemption as createExemption does.
func (s *Server) importExemption(raw []byte) (control.Exemption, error) {
	var in exemptionIn
	if err := decodeStrict(raw, &in); err != nil {
		return control.Exemption{}, err
	}
	e := control.Exemption{APIKey: in.APIKey, User: in.User, Tenant: in.Tenant, IP: in.IP, Reason: in.Reason}
	if in.ExpiresAt != nil {
		t, err := parseTime("expires_at", *in.ExpiresAt)
		if err != nil {
			return e, err
		}
		if !t.After(s.now()) {
			return e, &policy.FieldError{Field: "expires_at", Msg: "must be in the future"}
		}
		e.ExpiresAt = &t
	}
	if err := e.Validate(); err != nil {
		return e, err
	}
	if err := control.CheckText("reason", in.Reason, 1, control.MaxReasonLen); err != nil {
		return e, err
	}
	_, err := policy.Compile(&policy.Config{Exemptions: []policy.Exemption{{APIKey: e.APIKey, User: e.User, Tenant: e.Tenant, IP: e.IP}}})
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		return e, &policy.FieldError{Field: strings.TrimPrefix(fe.Field, "exemptions[0]."), Msg: fe.Msg}
	}
	return e, err
}

// bulkCallTimeout bounds an import or export: 100,000 entries take about a minute on a
// loaded machine, far past the listener's 10-s read and write timeouts, which would cut the
// connection under a call still working (the client saw EOF, the change went in).
const bulkCallTimeout = 10 * time.Minute

// longCall gives the call bulkCallTimeout to read its body and write its answer.
func longCall(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(bulkCallTimeout)
	_ = rc.SetReadDeadline(deadline) // a writer that cannot (a test recorder) keeps its own
	_ = rc.SetWriteDeadline(deadline)
}
