// Package strictjson reads JSON request bodies as strictly as the strictest reader in front
// of Sluice (a WAF, a gateway) and names the field of any error: the JSON API (transport/httpapi)
// and the admin API (control/adminapi) read and answer alike.
//
// The reader is JSON v2 (github.com/go-json-experiment/json, encoding/json/v2 from Go 1.27)
// rather than one of our own: it is strict by default and fast from a pooled decoder.
package strictjson

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"reflect"
	"slices"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/policy"
)

// Options refuse names given twice, names in another letter case, and unknown names: readers
// disagree on which of two equal names wins and on whether "USER" is "user", so both are
// refused rather than guessed. JSON v2 defaults to all three; they are spelled out so that a
// change of defaults cannot loosen them.
var Options = jsonv2.JoinOptions(
	jsontext.AllowDuplicateNames(false),
	jsonv2.MatchCaseInsensitiveNames(false),
	jsonv2.RejectUnknownMembers(true),
)

// ErrNull is what a field's own reader (an UnmarshalJSONFrom method) returns for a JSON null
// it refuses; Error names the field and its type ("must be a string, not null").
var ErrNull = errors.New("null")

// ContentType refuses a body whose Content-Type header, ct, is not one of the accepted media
// types (parameters allowed, but a charset can only be UTF-8); the error names Content-Type.
// A browser sends a cross-site form, multipart or text/plain body without asking the server
// first (no CORS preflight); it cannot send application/json so, and a write that requires it
// is not open to a page a user of the network visits.
func ContentType(ct string, accepted ...string) error {
	if ct == "" {
		return &policy.FieldError{Field: "Content-Type", Msg: "missing; send the body as " + accepted[0]}
	}
	media, params, err := mime.ParseMediaType(ct)
	if err != nil || !slices.Contains(accepted, media) {
		return &policy.FieldError{Field: "Content-Type", Msg: fmt.Sprintf("must be %s, not %q", strings.Join(accepted, " or "), ct)}
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return &policy.FieldError{Field: "Content-Type", Msg: fmt.Sprintf("charset must be utf-8, not %q", cs)}
	}
	return nil
}

// Unmarshal reads the JSON value b into v with Options; an error is a *policy.FieldError, as
// Error makes it.
func Unmarshal(b []byte, v any) error {
	if err := jsonv2.Unmarshal(b, v, Options); err != nil {
		return Error(err)
	}
	return nil
}

// Error turns the decoder's errors into *policy.FieldError naming the field by its dotted
// path (such as "match.endpoint" or "tiers.free.limit"; "body" for the whole value). A
// *policy.FieldError that a field's own reader returned is kept as it is.
func Error(err error) error {
	var fe *policy.FieldError
	var semErr *jsonv2.SemanticError
	var synErr *jsontext.SyntacticError
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &policy.FieldError{Field: "body", Msg: "truncated JSON"}
	case errors.As(err, &synErr) && errors.Is(err, jsontext.ErrDuplicateName):
		return &policy.FieldError{Field: Path(synErr.JSONPointer), Msg: "duplicate field"}
	case errors.As(err, &semErr) && errors.Is(err, jsonv2.ErrUnknownName):
		return &policy.FieldError{Field: Path(semErr.JSONPointer), Msg: "unknown field"}
	case errors.As(err, &semErr) && semErr.GoType != nil:
		got := KindName(semErr.JSONKind)
		switch {
		case errors.Is(err, ErrNull):
			got = "null"
		case semErr.Err != nil && semErr.JSONKind == '"':
			// A string of the right kind that does not parse (a duration, a time) says why.
			return &policy.FieldError{Field: Path(semErr.JSONPointer), Msg: semErr.Err.Error()}
		}
		return &policy.FieldError{Field: Path(semErr.JSONPointer), Msg: fmt.Sprintf("must be %s, not %s", goKind(semErr.GoType), got)}
	case errors.As(err, &synErr):
		return &policy.FieldError{Field: "body", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", synErr.ByteOffset, synErr.Err)}
	}
	return &policy.FieldError{Field: "body", Msg: "invalid JSON: " + err.Error()}
}

// Path renders a JSON pointer as a dotted field path; "body" for the whole value.
func Path(p jsontext.Pointer) string {
	var b strings.Builder
	n := 0
	for name := range p.Tokens() {
		if n > 0 {
			b.WriteByte('.')
		}
		b.WriteString(name)
		n++
	}
	if n == 0 {
		return "body"
	}
	return b.String()
}

// KindName names a JSON kind in a message, as a JSON reader sees it: "string", "object".
func KindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "boolean"
	case '"':
		return "string"
	case '0':
		return "number"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "invalid JSON"
}

// goKind names what a Go type reads from JSON, as a caller should send it: "a string".
func goKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Int64, reflect.Int, reflect.Int32:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	}
	return t.Kind().String()
}
