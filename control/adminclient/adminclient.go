// Package adminclient is a Go client of Sluice's admin API (/admin/v1): one call per method,
// the token sent and never echoed (scrubbed from every error and trace), and the server's
// errors returned as *Error with their status and the field they name. The CLI's `sluice
// admin` commands are built on it.
package adminclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control/adminapi"
)

// MaxAnswer caps what the client reads of one answer: a thousand audit events, each with a
// rule before and after, fit; a broken server streaming forever does not exhaust memory.
const MaxAnswer = 64 << 20

// Client speaks the admin API over net/http.
type Client struct {
	// Base is scheme://host:port[/prefix], without a trailing slash.
	Base  string
	Token string
	// TokenFrom says where the token came from ("--token-file PATH", "SLUICE_TOKEN"), for
	// the hint of a 401; "" for none.
	TokenFrom string
	// Timeout bounds each call: connecting, the headers and reading the body.
	Timeout time.Duration
	// Verbose, when set, receives each request and answer's status and headers, the
	// Authorization header redacted.
	Verbose io.Writer
	// UserAgent is sent with each call.
	UserAgent string
	// WaitFleet asks every change to answer only once every live node enforces it (the
	// header Sluice-Wait: fleet); the server answers 504 naming the nodes that lag past its
	// --wait-timeout.
	WaitFleet bool
}

// Request is one call: the path under Base (starting with /admin/v1/), and what a change adds.
type Request struct {
	Method, Path string
	Query        url.Values
	Body         []byte
	ContentType  string // default application/json when there is a body
	IfMatch      string // an ETag as an answer gave it, quoted or not; "*"
	Reason       string // X-Sluice-Reason: the audit reason of a change whose body has none
}

// Answer is a successful answer.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// PolicyVersion is the version a change answered with.
func (a *Answer) PolicyVersion() string { return a.Header.Get(adminapi.PolicyVersionHeader) }

// ETag is the answer's entity tag without its quotes, for If-Match.
func (a *Answer) ETag() string { return strings.Trim(a.Header.Get("ETag"), `"`) }

// Error is an error answer of the server: "field: message (HTTP 400)".
type Error struct {
	// Status is the answer's HTTP status.
	Status int
	// Msg is the rendered message, the token scrubbed.
	Msg string
}

// Error returns the rendered message.
func (e *Error) Error() string { return e.Msg }

// Change is what a change may add: If-Match and an audit reason.
type Change struct {
	IfMatch string
	Reason  string
}

// Do sends rq and returns the answer, or an *Error carrying the server's error.
func (c *Client) Do(ctx context.Context, rq Request) (*Answer, error) {
	u := c.Base + rq.Path
	if len(rq.Query) > 0 {
		u += "?" + rq.Query.Encode()
	}
	var body io.Reader
	if rq.Body != nil {
		body = bytes.NewReader(rq.Body)
	}
	req, err := http.NewRequestWithContext(ctx, rq.Method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", rq.Method, rq.Path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/json")
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	if rq.Body != nil {
		ct := rq.ContentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if rq.IfMatch != "" {
		req.Header.Set("If-Match", quoteETag(rq.IfMatch))
	}
	if rq.Reason != "" {
		req.Header.Set("X-Sluice-Reason", rq.Reason)
	}
	if c.WaitFleet && rq.Method != http.MethodGet && rq.Method != http.MethodHead {
		req.Header.Set(adminapi.WaitHeader, "fleet")
	}
	c.traceRequest(req)
	start := time.Now()
	// A client per call: the CLI makes one or two calls per run, and the Timeout covers
	// connecting, the headers and reading the body.
	resp, err := (&http.Client{Timeout: c.Timeout}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %s", c.Base, c.scrub(err.Error()))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("read the answer of %s %s: %s", rq.Method, rq.Path, c.scrub(err.Error()))
	}
	if len(raw) > MaxAnswer {
		return nil, fmt.Errorf("the answer of %s %s is larger than %d bytes; narrow the query", rq.Method, rq.Path, MaxAnswer)
	}
	c.traceAnswer(resp, time.Since(start))
	if resp.StatusCode >= 400 {
		return nil, c.apiError(resp, raw)
	}
	return &Answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// Get is a GET with a query.
func (c *Client) Get(ctx context.Context, path string, q url.Values) (*Answer, error) {
	return c.Do(ctx, Request{Method: http.MethodGet, Path: path, Query: q})
}

// Send is a change with a JSON body (nil for none).
func (c *Client) Send(ctx context.Context, method, path string, body []byte, ch Change) (*Answer, error) {
	return c.Do(ctx, Request{Method: method, Path: path, Body: body, IfMatch: ch.IfMatch, Reason: ch.Reason})
}

// BaseURL checks a server's base URL and returns it without a trailing slash: http or https,
// a host, no query or fragment; a bare host:port means http. Its errors never show a
// password the URL holds.
func BaseURL(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q: want http://host:port or https://host:port", redactURL(s))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: a base URL has no query or fragment", redactURL(s))
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// redactURL hides a password in a URL, also one that fails to parse as one.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	if at := strings.LastIndex(s, "@"); at >= 0 {
		return "[redacted]" + s[at:]
	}
	return s
}

// Path joins escaped path segments under /admin/v1/.
func Path(segments ...string) string {
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(adminapi.Prefix, "/"))
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// quoteETag turns an ETag as a table shows it (12) into the header's form ("12"); quoted
// tags, weak ones and * pass as they are.
func quoteETag(v string) string {
	if v == "*" || strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "W/") {
		return v
	}
	return `"` + v + `"`
}

// apiError renders an error answer as "field: message (HTTP 400)".
func (c *Client) apiError(resp *http.Response, raw []byte) error {
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	msg := ""
	if json.Unmarshal(raw, &e) == nil && e.Error != "" {
		msg = e.Error
		// The server's messages of field errors start with the field already.
		if e.Field != "" && !strings.HasPrefix(msg, e.Field+": ") && !strings.HasPrefix(msg, e.Field+" ") {
			msg = e.Field + ": " + msg
		}
	} else {
		excerpt := strings.TrimSpace(string(raw))
		if len(excerpt) > 200 {
			excerpt = excerpt[:200] + "..."
		}
		msg = "the server answered " + resp.Status
		if excerpt != "" {
			msg += ": " + excerpt
		}
	}
	if resp.StatusCode == http.StatusUnauthorized && c.TokenFrom != "" {
		msg += "; the token from " + c.TokenFrom + " was refused"
	}
	msg = fmt.Sprintf("%s (HTTP %d)", msg, resp.StatusCode)
	if ra := resp.Header.Get("Retry-After"); ra != "" && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		msg += "; retry after " + ra + "s"
	}
	return &Error{Status: resp.StatusCode, Msg: c.scrub(msg)}
}

// scrub removes the token from a message, whatever echoed it.
func (c *Client) scrub(s string) string {
	if c.Token == "" {
		return s
	}
	return strings.ReplaceAll(s, c.Token, "[token]")
}

// traceRequest prints a request to Verbose, with the Authorization header redacted.
func (c *Client) traceRequest(req *http.Request) {
	if c.Verbose == nil {
		return
	}
	fmt.Fprintf(c.Verbose, "> %s %s\n", req.Method, req.URL.Redacted())
	c.traceHeaders(">", req.Header)
}

// traceAnswer prints an answer's status and headers to Verbose.
func (c *Client) traceAnswer(resp *http.Response, took time.Duration) {
	if c.Verbose == nil {
		return
	}
	fmt.Fprintf(c.Verbose, "< %s (%s)\n", resp.Status, took.Round(time.Millisecond))
	c.traceHeaders("<", resp.Header)
}

func (c *Client) traceHeaders(dir string, h http.Header) {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range h[k] {
			if strings.EqualFold(k, "Authorization") {
				v = "Bearer [redacted]"
			}
			fmt.Fprintf(c.Verbose, "%s %s: %s\n", dir, k, c.scrub(v))
		}
	}
}
