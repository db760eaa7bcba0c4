package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/strictjson"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Envoy-format domains (DESIGN.md, Envoy requests get the whole product): the configuration of
// one domain in the reference service's format, as JSON or as YAML, validated exactly as a
// file of --config is, and stored as JSON. A domain of the policy files is read-only here.

// yamlTypes are the media types a YAML body may be sent as; the first is the one documented.
var yamlTypes = []string{"application/yaml", "application/x-yaml", "text/yaml"}

// readOnlyDomain are the members of a domain answer that are not configuration: a JSON body
// may carry them (so that an answer can be sent back) and they are dropped.
var readOnlyDomain = []string{"source", "created_at", "updated_at", "updated_by", "policy_version"}

// readDomainBody reads a domain's body: JSON, or YAML when declared so; 415 for another type,
// 413 past control.MaxDomainBodyLen, 400 when empty or not UTF-8. It reports whether the body
// is YAML.
func readDomainBody(w http.ResponseWriter, r *http.Request) ([]byte, bool, error) {
	ct := r.Header.Get("Content-Type")
	accepted := append([]string{"application/json"}, yamlTypes...)
	if err := strictjson.ContentType(ct, accepted...); err != nil {
		return nil, false, &statusError{status: http.StatusUnsupportedMediaType, field: "Content-Type", msg: err.Error()}
	}
	media, _, _ := mime.ParseMediaType(ct)
	isYAML := media != "application/json"
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, control.MaxDomainBodyLen))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, false, &statusError{status: http.StatusRequestEntityTooLarge, field: "body",
				msg: fmt.Sprintf("body: larger than %d bytes", control.MaxDomainBodyLen)}
		}
		return nil, false, &policy.FieldError{Field: "body", Msg: "unreadable: " + err.Error()}
	}
	body = bytes.TrimSpace(body)
	switch {
	case len(body) == 0:
		return nil, false, &policy.FieldError{Field: "body", Msg: "empty; send the domain's configuration"}
	case !utf8.Valid(body):
		return nil, false, &policy.FieldError{Field: "body", Msg: "not valid UTF-8"}
	}
	return body, isYAML, nil
}

// parseDomain validates a domain body for the domain called pathName and returns the JSON to
// store. A JSON body without "domain" takes the path's; YAML is read as a file is, so it
// names its domain.
func parseDomain(body []byte, isYAML bool, pathName string) ([]byte, error) {
	doc := body
	if !isYAML {
		members, err := readObject(body)
		if err != nil {
			return nil, err
		}
		members = without(members, readOnlyDomain...)
		if find(members, "domain") < 0 {
			members = append([]member{{name: "domain", value: quote(pathName)}}, members...)
		}
		doc = writeObject(members)
	}
	name, stored, err := envoyconf.ParseDomain("body", doc)
	if err != nil {
		return nil, domainError(err, isYAML)
	}
	if name != pathName {
		return nil, &policy.FieldError{Field: "domain", Msg: fmt.Sprintf("%q differs from the domain in the path, %q; a domain cannot be renamed (put the new one, delete the old)", name, pathName)}
	}
	if err := control.ValidateDomain(name, stored); err != nil {
		return nil, err
	}
	return stored, nil
}

// domainError turns envoyconf's errors into one *policy.FieldError naming the first field and
// listing every error, with its line for YAML (JSON bodies are usually one line).
func domainError(err error, isYAML bool) error {
	var errs []*envoyconf.LoadError
	for _, e := range unjoin(err) {
		var le *envoyconf.LoadError
		if errors.As(e, &le) {
			errs = append(errs, le)
		}
	}
	if len(errs) == 0 {
		return &policy.FieldError{Field: "body", Msg: err.Error()}
	}
	msgs := make([]string, len(errs))
	for i, le := range errs {
		m := le.Msg
		if isYAML {
			m = fmt.Sprintf("%s (line %d)", m, le.Line)
		}
		if i > 0 {
			m = le.Field + ": " + m
		}
		msgs[i] = m
	}
	return &policy.FieldError{Field: errs[0].Field, Msg: strings.Join(msgs, "; ")}
}

// unjoin returns the errors errors.Join joined into err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// domainJSON renders a stored domain: its configuration, then where it comes from and who
// changed it last, and policy_version when the answer is to a change.
func domainJSON(d control.Domain, policyVersion string) ([]byte, error) {
	ms, err := readObject(d.Body)
	if err != nil {
		return nil, fmt.Errorf("domain %q: stored body: %w", d.Name, err)
	}
	ms = append(without(ms, readOnlyDomain...),
		member{"source", quote("api")},
		member{"created_at", rawJSON(d.CreatedAt.UTC())},
		member{"updated_at", rawJSON(d.UpdatedAt.UTC())},
		member{"updated_by", quote(d.UpdatedBy)})
	if policyVersion != "" {
		ms = append(ms, member{"policy_version", quote(policyVersion)})
	}
	return writeObject(ms), nil
}

// fileDomainJSON renders a domain of the policy files: its configuration as JSON, or only its
// name when the file does not convert (YAML 1.1 forms), and "source": "file".
func fileDomainJSON(name string, data []byte) []byte {
	ms := []member{{"domain", quote(name)}}
	if _, doc, err := envoyconf.ParseDomain(name, data); err == nil {
		if all, err := readObject(doc); err == nil {
			ms = all
		}
	}
	return writeObject(append(without(ms, "source"), member{"source", quote("file")}))
}

// pathDomain reads {domain}; a name the store could not hold names nothing (404), except for
// a PUT, which would create it: 400 naming the domain.
func pathDomain(r *http.Request) (string, error) {
	name := r.PathValue("domain")
	if err := control.CheckText("domain", name, 1, control.MaxNameLen); err != nil {
		if r.Method == http.MethodPut {
			return "", err
		}
		return "", control.ErrNotFound
	}
	return name, nil
}

func (s *Server) listDomains(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "limit", "after")
	if err != nil {
		return err
	}
	pg, err := newPager(q, partFileName, partName)
	if err != nil {
		return err
	}
	// The policy files' domains first, by name, then the store's, by name.
	if pg.reads(partName) {
		files := s.files().Domains
		names := make([]string, 0, len(files))
		for n := range files {
			if pg.after.part != partFileName || n > pg.after.name {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			if pg.full() {
				break
			}
			pg.add(json.RawMessage(fileDomainJSON(n, files[n])), cursor{part: partFileName, name: n})
		}
	}
	if pg.reads() {
		p := control.Page{Limit: pg.room()}
		if pg.after.part == partName {
			p.AfterName = pg.after.name
		}
		stored, err := s.store.PageDomains(r.Context(), p)
		if err != nil {
			return err
		}
		for _, d := range stored {
			b, err := domainJSON(d, "")
			if err != nil {
				return err
			}
			pg.add(json.RawMessage(b), cursor{part: partName, name: d.Name})
		}
	}
	return pg.answer(w, "domains")
}

func (s *Server) getDomain(w http.ResponseWriter, r *http.Request) error {
	name, err := pathDomain(r)
	if err != nil {
		return err
	}
	if data, ok := s.files().Domains[name]; ok {
		return answerRaw(w, http.StatusOK, "", fileDomainJSON(name, data))
	}
	d, err := s.store.GetDomain(r.Context(), name)
	if err != nil {
		return err
	}
	b, err := domainJSON(d, "")
	if err != nil {
		return err
	}
	return answerRaw(w, http.StatusOK, etag(d.Version), b)
}

func (s *Server) putDomain(w http.ResponseWriter, r *http.Request) error {
	name, err := pathDomain(r)
	if err != nil {
		return err
	}
	if _, ok := s.files().Domains[name]; ok {
		return fmt.Errorf("domain: %w", errFileResource)
	}
	body, isYAML, err := readDomainBody(w, r)
	if err != nil {
		return err
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	stored, err := parseDomain(body, isYAML, name)
	if err != nil {
		return err
	}
	// 200 whether it created the domain or replaced it, as PUT of an identity answers.
	d, _, err := s.store.PutDomain(r.Context(), ch, name, stored)
	if err != nil {
		return err
	}
	b, err := domainJSON(d, s.changed(r.Context(), w, d.Version))
	if err != nil {
		return err
	}
	return answerRaw(w, http.StatusOK, etag(d.Version), b)
}

func (s *Server) deleteDomain(w http.ResponseWriter, r *http.Request) error {
	name, err := pathDomain(r)
	if err != nil {
		return err
	}
	if _, ok := s.files().Domains[name]; ok {
		return fmt.Errorf("domain: %w", errFileResource)
	}
	ch, err := change(r, "")
	if err != nil {
		return err
	}
	v, err := s.store.DeleteDomain(r.Context(), ch, name)
	if err != nil {
		return err
	}
	return s.deleted(r.Context(), w, v)
}
