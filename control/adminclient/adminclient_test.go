package adminclient

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestErrorsNameTheFieldAndHideTheToken: an error answer becomes *Error with its status and
// "field: message (HTTP n)", and the token never shows, in the error nor in the trace.
func TestErrorsNameTheFieldAndHideTheToken(t *testing.T) {
	const token = "s3cret-token-value"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token || r.Header.Get("If-Match") != `"7"` {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":"must be positive, not ` + token + `","field":"limit"}`))
	}))
	defer srv.Close()
	var trace bytes.Buffer
	c := &Client{Base: srv.URL, Token: token, TokenFrom: "SLUICE_TOKEN", Timeout: 5 * time.Second, Verbose: &trace}
	_, err := c.Send(t.Context(), http.MethodPost, Path("rules"), []byte(`{}`), Change{IfMatch: "7"})
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Fatalf("err %v, want an *Error of status 400", err)
	}
	if want := "limit: must be positive, not [token] (HTTP 400)"; e.Msg != want {
		t.Errorf("message %q, want %q", e.Msg, want)
	}
	if strings.Contains(trace.String(), token) || !strings.Contains(trace.String(), "Bearer [redacted]") {
		t.Errorf("the trace shows the token or no redaction:\n%s", trace.String())
	}
}

func TestBaseURL(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{"https://h:1/prefix/", "https://h:1/prefix", ""},
		{"ftp://h:1", "", "want http"},
		{"http://h:1/?a=b", "", "no query"},
		{"http://user:pw@h:1/?a", "", "user:xxxxx@"},
	} {
		got, err := BaseURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "pw@") {
				t.Errorf("BaseURL(%q) = %q, %v; want an error with %q and no password", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("BaseURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
