package adminapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/internal/strictjson"
	"github.com/sluicehq/sluice/policy"
)

const mergePatchType = "application/merge-patch+json"

// readBody reads a write's JSON body: 415 unless it is declared application/json (or, when
// patch, application/merge-patch+json), 413 past MaxBodyBytes, 400 when it is empty, not
// UTF-8, or not one JSON object.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, patch bool) ([]byte, error) {
	accepted := []string{"application/json"}
	if patch {
		accepted = []string{mergePatchType, "application/json"}
	}
	if err := strictjson.ContentType(r.Header.Get("Content-Type"), accepted...); err != nil {
		if patch {
			w.Header().Set("Accept-Patch", mergePatchType+", application/json")
		}
		return nil, &statusError{status: http.StatusUnsupportedMediaType, field: "Content-Type", msg: err.Error()}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &statusError{status: http.StatusRequestEntityTooLarge, field: "body",
				msg: fmt.Sprintf("body: larger than %d bytes", s.opts.MaxBodyBytes)}
		}
		return nil, &policy.FieldError{Field: "body", Msg: "unreadable: " + err.Error()}
	}
	body = bytes.TrimSpace(body)
	switch {
	case len(body) == 0:
		return nil, &policy.FieldError{Field: "body", Msg: "empty; send a JSON object"}
	case !utf8.Valid(body):
		return nil, &policy.FieldError{Field: "body", Msg: "not valid UTF-8"}
	case body[0] != '{':
		return nil, &policy.FieldError{Field: "body", Msg: "must be a JSON object"}
	}
	return body, nil
}

// decodeStrict reads the JSON object body into v: unknown, duplicate and wrongly typed fields
// are errors naming the field by its path (such as "match.endpoint" or "tiers.free.limit").
func decodeStrict(body []byte, v any) error { return strictjson.Unmarshal(body, v) }

// member is one name and raw value of a JSON object. Objects are kept as ordered members
// rather than decoded into maps so that what a caller wrote comes back in its order, and
// numbers are never rounded through float64.
type member struct {
	name  string
	value jsontext.Value
}

// readObject splits a JSON object into its members; duplicate names are refused.
func readObject(b []byte) ([]member, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(b), strictjson.Options)
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, strictjson.Error(err)
	}
	if tok.Kind() != '{' {
		return nil, &policy.FieldError{Field: "body", Msg: "must be a JSON object"}
	}
	var out []member
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return nil, strictjson.Error(err)
		}
		n := name.String()
		v, err := dec.ReadValue()
		if err != nil {
			return nil, strictjson.Error(err)
		}
		out = append(out, member{name: n, value: v.Clone()})
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, strictjson.Error(err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return nil, &policy.FieldError{Field: "body", Msg: "more than one JSON value"}
	}
	return out, nil
}

// writeObject renders members as a compact JSON object.
func writeObject(ms []member) []byte {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			buf.WriteByte(',')
		}
		name, _ := jsontext.AppendQuote(nil, m.name)
		buf.Write(name)
		buf.WriteByte(':')
		v := m.value.Clone()
		_ = v.Compact()
		buf.Write(v)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// find returns the index of the member called name, or -1.
func find(ms []member, name string) int {
	for i := range ms {
		if ms[i].name == name {
			return i
		}
	}
	return -1
}

// set replaces or appends the member called name.
func set(ms []member, name string, v jsontext.Value) []member {
	if i := find(ms, name); i >= 0 {
		ms[i].value = v
		return ms
	}
	return append(ms, member{name, v})
}

// without drops the members called any of names.
func without(ms []member, names ...string) []member {
	out := ms[:0:0]
	for _, m := range ms {
		drop := false
		for _, n := range names {
			drop = drop || m.name == n
		}
		if !drop {
			out = append(out, m)
		}
	}
	return out
}

// mergePatch applies an RFC 7396 JSON merge patch to target. Written here rather than taken
// from a library because it is twenty lines on ordered members: values are spliced verbatim
// (no float64 rounding of large integers, the caller's member order kept) and the strict
// reader has already refused duplicate names in the patch.
func mergePatch(target, patch []member) ([]member, error) {
	out := append([]member(nil), target...)
	for _, p := range patch {
		switch p.value.Kind() {
		case 'n': // null removes the member
			out = without(out, p.name)
		case '{': // an object merges into the member, which becomes an object if it is not one
			var sub []member
			if i := find(out, p.name); i >= 0 && out[i].value.Kind() == '{' {
				var err error
				if sub, err = readObject(out[i].value); err != nil {
					return nil, err
				}
			}
			ps, err := readObject(p.value)
			if err != nil {
				return nil, err
			}
			if sub, err = mergePatch(sub, ps); err != nil {
				return nil, err
			}
			out = set(out, p.name, writeObject(sub))
		default: // anything else replaces it
			out = set(out, p.name, p.value)
		}
	}
	return out, nil
}
