package strictjson

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/policy"
)

// nonNull is a string field that refuses null, as the JSON API's fields do.
type nonNull string

func (n *nonNull) UnmarshalJSONFrom(d *jsontext.Decoder) error {
	if d.PeekKind() == 'n' {
		return ErrNull
	}
	return errors.ErrUnsupported
}

// rule is shaped like an admin API body: nested objects, a map of objects, a list, a time.
type rule struct {
	Name  string                `json:"name"`
	Limit int64                 `json:"limit"`
	Until time.Time             `json:"until"`
	Key   []string              `json:"key"`
	Match struct{ Path string } `json:"match"`
	Tiers map[string]struct {
		Limit int64 `json:"limit"`
	} `json:"tiers"`
	Owner nonNull `json:"owner"`
	Off   bool    `json:"off"`
}

// TestUnmarshal: what a lenient reader would take is refused, and every error is a
// *policy.FieldError naming the field by its dotted path.
func TestUnmarshal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body, field, msg string
	}{
		{"valid", `{"name":"r","limit":5,"key":["user"],"match":{"Path":"/x"},"tiers":{"free":{"limit":1}},"owner":"o","off":true}`, "", ""},
		{"unknown field", `{"name":"r","nmae":"s"}`, "nmae", "unknown field"},
		{"unknown nested field", `{"match":{"Path":"/x","host":"h"}}`, "match.host", "unknown field"},
		{"name in another case", `{"Name":"r"}`, "Name", "unknown field"},
		{"duplicate field", `{"limit":1,"limit":2}`, "limit", "duplicate field"},
		{"duplicate map key", `{"tiers":{"free":{},"free":{}}}`, "tiers.free", "duplicate field"},
		{"wrong type", `{"limit":"5"}`, "limit", "must be an integer, not string"},
		{"wrong type in a map", `{"tiers":{"free":{"limit":true}}}`, "tiers.free.limit", "must be an integer, not boolean"},
		{"wrong type for a list", `{"key":"user"}`, "key", "must be an array, not string"},
		{"wrong type for a boolean", `{"off":1}`, "off", "must be true or false, not number"},
		{"refused null", `{"owner":null}`, "owner", "must be a string, not null"},
		{"string that does not parse", `{"until":"soon"}`, "until", "soon"},
		{"truncated", `{"name":"r"`, "body", "truncated JSON"},
		{"syntax", `{"name" "r"}`, "body", "invalid JSON at byte"},
		{"not an object", `[1]`, "body", "must be an object, not array"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var r rule
			err := Unmarshal([]byte(tc.body), &r)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Unmarshal: %v", err)
				}
				return
			}
			var fe *policy.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T), want a *policy.FieldError", err, err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
				t.Errorf("error %q, want field %q and a message with %q", err, tc.field, tc.msg)
			}
		})
	}
}

// TestErrorKeepsFieldErrors: a field's own reader names itself; Error does not rename it.
func TestErrorKeepsFieldErrors(t *testing.T) {
	t.Parallel()
	own := &policy.FieldError{Field: "cost", Msg: "must be >= 0"}
	if got := Error(own); got != own {
		t.Errorf("Error(%v) = %v, want it unchanged", own, got)
	}
}

// TestContentType: only the accepted media types pass, with parameters but no charset other
// than UTF-8; a form, multipart or text body, which a cross-site page can send, does not.
func TestContentType(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, ct string
		accepted []string
		msg      string // in the error; "" when accepted
	}{
		{"json", "application/json", []string{"application/json"}, ""},
		{"json with charset", "application/json; charset=utf-8", []string{"application/json"}, ""},
		{"json in capitals", "Application/JSON; Charset=UTF-8", []string{"application/json"}, ""},
		{"merge patch", "application/merge-patch+json", []string{"application/merge-patch+json", "application/json"}, ""},
		{"none", "", []string{"application/json"}, "missing; send the body as application/json"},
		{"form", "application/x-www-form-urlencoded", []string{"application/json"}, `must be application/json, not "application/x-www-form-urlencoded"`},
		{"multipart", "multipart/form-data; boundary=x", []string{"application/json"}, "must be application/json"},
		{"text claiming JSON", "text/plain; charset=utf-8; x=application/json", []string{"application/json"}, "must be application/json"},
		{"json suffix", "application/problem+json", []string{"application/json"}, "must be application/json"},
		{"malformed", "application/json; charset", []string{"application/json"}, "must be application/json"},
		{"other charset", "application/json; charset=latin1", []string{"application/json"}, `charset must be utf-8, not "latin1"`},
		{"merge patch not accepted", "application/merge-patch+json", []string{"application/json"}, "must be application/json"},
		{"two accepted", "text/plain", []string{"application/merge-patch+json", "application/json"}, "must be application/merge-patch+json or application/json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ContentType(tc.ct, tc.accepted...)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("ContentType(%q): %v", tc.ct, err)
				}
				return
			}
			var fe *policy.FieldError
			if !errors.As(err, &fe) || fe.Field != "Content-Type" || !strings.Contains(fe.Msg, tc.msg) {
				t.Errorf("ContentType(%q) = %v, want Content-Type: ...%s", tc.ct, err, tc.msg)
			}
		})
	}
}
