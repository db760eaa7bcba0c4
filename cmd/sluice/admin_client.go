package main

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

// maxAnswer caps what the CLI reads of one answer: a thousand audit events, each with a rule
// before and after, fit; a broken server streaming forever does not exhaust memory.
const maxAnswer = 64 << 20

// adminClient speaks the admin API over net/http. It is what every sluice admin command uses,
// so that the token handling (never printed) and the error mapping (exit codes) live once.
type adminClient struct {
	base      string // scheme://host:port[/prefix], no trailing slash
	token     string
	tokenFrom string // where the token came from, for the hint of a 401: "--token-file PATH", "SLUICE_TOKEN"
	timeout   time.Duration
	verbose   io.Writer // nil unless --verbose
}

// request is one call: the path under base (starting with /admin/v1/), and what a change adds.
type request struct {
	method, path string
	query        url.Values
	body         []byte
	contentType  string // default application/json when there is a body
	ifMatch      string // an ETag as an answer gave it, quoted or not; "*"
	reason       string // X-Sluice-Reason: the audit reason of a change whose body has none
}

// answer is a successful answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// policyVersion is the version a change answered with.
func (a *answer) policyVersion() string { return a.header.Get(adminapi.PolicyVersionHeader) }

// etag is the answer's entity tag without its quotes, for --if-match.
func (a *answer) etag() string { return strings.Trim(a.header.Get("ETag"), `"`) }

// do sends rq and returns the answer, or an exitError carrying the server's error and the
// exit code its status maps to.
func (c *adminClient) do(ctx context.Context, rq request) (*answer, error) {
	u := c.base + rq.path
	if len(rq.query) > 0 {
		u += "?" + rq.query.Encode()
	}
	var body io.Reader
	if rq.body != nil {
		body = bytes.NewReader(rq.body)
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", rq.method, rq.path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sluice-cli/"+version)
	if rq.body != nil {
		ct := rq.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if rq.ifMatch != "" {
		req.Header.Set("If-Match", quoteETag(rq.ifMatch))
	}
	if rq.reason != "" {
		req.Header.Set("X-Sluice-Reason", rq.reason)
	}
	c.traceRequest(req)
	start := time.Now()
	// A client per call: the CLI makes one or two calls per run, and the Timeout covers
	// connecting, the headers and reading the body.
	resp, err := (&http.Client{Timeout: c.timeout}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %s", c.base, c.scrub(err.Error()))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("read the answer of %s %s: %s", rq.method, rq.path, c.scrub(err.Error()))
	}
	if len(raw) > maxAnswer {
		return nil, fmt.Errorf("the answer of %s %s is larger than %d bytes; narrow the query", rq.method, rq.path, maxAnswer)
	}
	c.traceAnswer(resp, time.Since(start))
	if resp.StatusCode >= 400 {
		return nil, c.apiError(resp, raw)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

// quoteETag turns an ETag as a table shows it (12) into the header's form ("12"); quoted
// tags, weak ones and * pass as they are.
func quoteETag(v string) string {
	if v == "*" || strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "W/") {
		return v
	}
	return `"` + v + `"`
}

// apiError renders an error answer as "field: message (HTTP 400)" with the exit code of its
// status.
func (c *adminClient) apiError(resp *http.Response, raw []byte) error {
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
	code := exitGeneral
	switch resp.StatusCode {
	case http.StatusNotFound:
		code = exitNotFound
	case http.StatusConflict, http.StatusPreconditionFailed:
		code = exitConflict
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		// The admin API answers 429 only to an address with too many failed authentications.
		code = exitAuth
	}
	if resp.StatusCode == http.StatusUnauthorized && c.tokenFrom != "" {
		msg += "; the token from " + c.tokenFrom + " was refused"
	}
	msg = fmt.Sprintf("%s (HTTP %d)", msg, resp.StatusCode)
	if ra := resp.Header.Get("Retry-After"); ra != "" && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		msg += "; retry after " + ra + "s"
	}
	return exitError{code: code, msg: c.scrub(msg)}
}

// scrub removes the token from a message, whatever echoed it.
func (c *adminClient) scrub(s string) string {
	if c.token == "" {
		return s
	}
	return strings.ReplaceAll(s, c.token, "[token]")
}

// traceRequest prints a request under --verbose, with the Authorization header redacted.
func (c *adminClient) traceRequest(req *http.Request) {
	if c.verbose == nil {
		return
	}
	fmt.Fprintf(c.verbose, "> %s %s\n", req.Method, req.URL.Redacted())
	c.traceHeaders(">", req.Header)
}

// traceAnswer prints an answer's status and headers under --verbose.
func (c *adminClient) traceAnswer(resp *http.Response, took time.Duration) {
	if c.verbose == nil {
		return
	}
	fmt.Fprintf(c.verbose, "< %s (%s)\n", resp.Status, took.Round(time.Millisecond))
	c.traceHeaders("<", resp.Header)
}

func (c *adminClient) traceHeaders(dir string, h http.Header) {
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
			fmt.Fprintf(c.verbose, "%s %s: %s\n", dir, k, c.scrub(v))
		}
	}
}

// get is a GET with a query.
func (c *adminClient) get(ctx context.Context, path string, q url.Values) (*answer, error) {
	return c.do(ctx, request{method: http.MethodGet, path: path, query: q})
}

// send is a change with a JSON body (nil for none).
func (c *adminClient) send(ctx context.Context, method, path string, body []byte, ch changeFlags) (*answer, error) {
	return c.do(ctx, request{method: method, path: path, body: body, ifMatch: ch.ifMatch, reason: ch.reason})
}

// changeFlags are the flags of a change: --if-match and --reason.
type changeFlags struct {
	ifMatch string
	reason  string
}

// adminPath joins escaped path segments under /admin/v1/.
func adminPath(segments ...string) string {
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(adminapi.Prefix, "/"))
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}
