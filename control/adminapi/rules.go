package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// CompileRule is the default Options.ValidateRule: it compiles r alone with policy.Compile,
// so that an API rule passes exactly the checks a rule of a policy file passes.
func CompileRule(r policy.Rule) error {
	_, err := policy.Compile(&policy.Config{Rules: []policy.Rule{r}})
	return err
}

// ruleIn is a rule body: the native rule fields, strictly decoded, plus the read-only members
// of a rule answer, accepted so that a rule read with GET can be sent back as it is. Their
// values are ignored.
type ruleIn struct {
	policy.Rule
	Source        string    `json:"source"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
	UpdatedBy     string    `json:"updated_by"`
	PolicyVersion string    `json:"policy_version"`
}

// readOnlyRule are ruleIn's read-only members, never stored.
var readOnlyRule = []string{"source", "created_at", "updated_at", "updated_by", "policy_version"}

// parseRule validates a rule body for the rule called pathName ("" when the body names it)
// and returns the name and the JSON to store: the caller's members in the caller's order,
// name first, without read-only members or nulls (null is absent).
func (s *Server) parseRule(body []byte, pathName string) (string, []byte, error) {
	members, err := readObject(body)
	if err != nil {
		return "", nil, err
	}
	var in ruleIn
	if err := decodeStrict(body, &in); err != nil {
		return "", nil, err
	}
	name := in.Name
	if pathName != "" {
		if name != "" && name != pathName {
			return "", nil, &policy.FieldError{Field: "name", Msg: "differs from the name in the path; a rule cannot be renamed (create the new one, delete the old)"}
		}
		name = pathName
	}
	if err := control.CheckName("name", name); err != nil {
		return "", nil, err
	}
	in.Rule.Name = name
	if err := s.opts.ValidateRule(in.Rule); err != nil {
		var fe *policy.FieldError
		if errors.As(err, &fe) {
			field := fe.Field
			if i := strings.Index(field, "]."); strings.HasPrefix(field, "rules[") && i > 0 {
				field = field[i+2:]
			}
			return "", nil, &policy.FieldError{Field: field, Msg: fe.Msg}
		}
		return "", nil, &policy.FieldError{Field: "body", Msg: err.Error()}
	}
	kept := []member{{name: "name", value: quote(name)}}
	for _, m := range without(members, append(readOnlyRule, "name")...) {
		if m.value.Kind() != 'n' {
			kept = append(kept, m)
		}
	}
	stored := writeObject(kept)
	if err := control.ValidateRule(name, stored); err != nil {
		return "", nil, err
	}
	return name, stored, nil
}

func quote(s string) jsontext.Value {
	b, _ := jsontext.AppendQuote(nil, s)
	return b
}

func rawJSON(v any) jsontext.Value {
	b, _ := json.Marshal(v)
	return b
}

// apiRuleJSON renders a stored rule: its body, then where it comes from and who changed it
// last, and policy_version when the answer is to a change.
func apiRuleJSON(r control.Rule, policyVersion string) ([]byte, error) {
	ms, err := readObject(r.Body)
	if err != nil {
		return nil, fmt.Errorf("rule %q: stored body: %w", r.Name, err)
	}
	ms = without(ms, readOnlyRule...)
	ms = append(ms,
		member{"source", quote("api")},
		member{"created_at", rawJSON(r.CreatedAt.UTC())},
		member{"updated_at", rawJSON(r.UpdatedAt.UTC())},
		member{"updated_by", quote(r.UpdatedBy)})
	if policyVersion != "" {
		ms = append(ms, member{"policy_version", quote(policyVersion)})
	}
	return writeObject(ms), nil
}

// fileRuleJSON renders a rule of a policy file.
func fileRuleJSON(r policy.Rule) []byte {
	b, _ := json.Marshal(r)
	ms, _ := readObject(b)
	kept := ms[:0]
	for _, m := range ms {
		if m.value.Kind() != 'n' && m.name != "source" {
			kept = append(kept, m)
		}
	}
	return writeObject(append(kept, member{"source", quote("file")}))
}

func (s *Server) files() FilePolicy {
	if s.opts.Files == nil {
		return FilePolicy{}
	}
	return s.opts.Files()
}

// fileRule returns the policy files' rule called name.
func (s *Server) fileRule(name string) (policy.Rule, bool) {
	for _, r := range s.files().Rules {
		if r.Name == name {
			return r, true
		}
	}
	return policy.Rule{}, false
}

func (s *Server) listRules(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "limit", "after")
	if err != nil {
		return err
	}
	pg, err := newPager(q, partFile, partName)
	if err != nil {
		return err
	}
	// The policy files' rules first, by index, then the store's, by name.
	if pg.reads(partName) {
		files := s.files().Rules
		start := 0
		if pg.after.part == partFile {
			start = int(min(pg.after.key, int64(len(files)))) + 1
		}
		for i := start; i < len(files) && !pg.full(); i++ {
			pg.add(json.RawMessage(fileRuleJSON(files[i])), cursor{part: partFile, key: int64(i)})
		}
	}
	if pg.reads() {
		stored, err := s.store.PageRules(r.Context(), control.Page{AfterName: pg.after.name, Limit: pg.room()})
		if err != nil {
			return err
		}
		for _, sr := range stored {
			b, err := apiRuleJSON(sr, "")
			if err != nil {
				return err
			}
			pg.add(json.RawMessage(b), cursor{part: partName, name: sr.Name})
		}
	}
	return pg.answer(w, "rules")
}

func (s *Server) getRule(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if fr, ok := s.fileRule(name); ok {
		return answerRaw(w, http.StatusOK, "", fileRuleJSON(fr))
	}
	rule, err := s.store.GetRule(r.Context(), name)
	if err != nil {
		return err
	}
	b, err := apiRuleJSON(rule, "")
	if err != nil {
		return err
	}
	return answerRaw(w, http.StatusOK, etag(rule.Version), b)
}

func (s *Server) createRule(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	name, stored, err := s.parseRule(body, "")
	if err != nil {
		return err
	}
	if _, ok := s.fileRule(name); ok {
		return &statusError{status: http.StatusConflict, field: "name", msg: "a policy file defines a rule with that name; API rules cannot take it"}
	}
	rule, err := s.store.CreateRule(r.Context(), ch, name, stored)
	if err != nil {
		return err
	}
	return s.ruleChanged(r.Context(), w, http.StatusCreated, rule)
}

func (s *Server) ruleChanged(ctx context.Context, w http.ResponseWriter, status int, rule control.Rule) error {
	b, err := apiRuleJSON(rule, s.changed(ctx, w, rule.Version))
	if err != nil {
		return err
	}
	if status == http.StatusCreated {
		w.Header().Set("Location", "/admin/v1/rules/"+pathEscape(rule.Name))
	}
	return answerRaw(w, status, etag(rule.Version), b)
}

func (s *Server) putRule(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, ok := s.fileRule(name); ok {
		return fmt.Errorf("rule: %w", errFileResource)
	}
	body, err := s.readBody(w, r, false)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	_, stored, err := s.parseRule(body, name)
	if err != nil {
		return err
	}
	rule, err := s.store.UpdateRule(r.Context(), ch, name, stored)
	if err != nil {
		return err
	}
	return s.ruleChanged(r.Context(), w, http.StatusOK, rule)
}

// patchRule applies a JSON merge patch to a stored rule. Without If-Match the read and the
// write are still one step: the write is conditional on the version read, and retried a few
// times if another writer came between.
func (s *Server) patchRule(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, ok := s.fileRule(name); ok {
		return fmt.Errorf("rule: %w", errFileResource)
	}
	body, err := s.readBody(w, r, true)
	if err != nil {
		return err
	}
	patch, err := readObject(body)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cur, err := s.store.GetRule(r.Context(), name)
		if errors.Is(err, control.ErrNotFound) && ch.IfMatch != "" {
			return control.ErrPreconditionFailed
		}
		if err != nil {
			return err
		}
		ms, err := readObject(cur.Body)
		if err != nil {
			return fmt.Errorf("rule %q: stored body: %w", name, err)
		}
		merged, err := mergePatch(ms, patch)
		if err != nil {
			return err
		}
		_, stored, err := s.parseRule(writeObject(merged), name)
		if err != nil {
			return err
		}
		cond := ch
		if cond.IfMatch == "" {
			cond.IfMatch = cur.ETag()
		}
		rule, err := s.store.UpdateRule(r.Context(), cond, name, stored)
		if errors.Is(err, control.ErrPreconditionFailed) && ch.IfMatch == "" && attempt < 3 {
			continue
		}
		if err != nil {
			return err
		}
		return s.ruleChanged(r.Context(), w, http.StatusOK, rule)
	}
}

func (s *Server) deleteRule(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, ok := s.fileRule(name); ok {
		return fmt.Errorf("rule: %w", errFileResource)
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteRule(r.Context(), ch, name)
	if err != nil {
		return err
	}
	return s.deleted(r.Context(), w, v)
}
