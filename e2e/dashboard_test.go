package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// dashboardPolicy has one rule every check of the test matches, far from its limit, so that
// the caller's remaining quota is the limit minus the checks sent.
const dashboardPolicy = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: sliding_window_log, limit: 1000, period: 1h}
`

// chromiumPath finds Debian's chromium (or SLUICE_CHROMIUM). Without one the browser tests
// skip, unless SLUICE_REQUIRE_CHROMIUM=1 (scripts/test.sh) makes that a failure.
func chromiumPath(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("SLUICE_CHROMIUM"), "/usr/bin/chromium", "chromium", "chromium-browser"}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv("SLUICE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found and SLUICE_REQUIRE_CHROMIUM=1: run scripts/install-deps.sh")
	}
	t.Skip("chromium not found (apt-get install chromium); SLUICE_REQUIRE_CHROMIUM=1 makes this a failure")
	return ""
}

// artifactDir is where the test leaves its screenshots: SLUICE_ARTIFACTS/<test>, else a
// temporary folder, logged.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if base := os.Getenv("SLUICE_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// browser is one headless chromium tab, with what its pages reported: console errors and
// Content-Security-Policy violations.
type browser struct {
	t          *testing.T
	ctx        context.Context
	shots      string
	mu         sync.Mutex
	console    []string // errors and warnings
	exceptions []string
	consoleWG  sync.WaitGroup
}

// cspProbe runs before any script of every page (injected by the DevTools protocol, so the
// page's CSP does not apply to it) and keeps each violation the page reports.
const cspProbe = `window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));`

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests may run as root, where chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	b := &browser{t: t, ctx: ctx, shots: artifactDir(t)}
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
		b.consoleWG.Wait()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium %s: %v", path, err)
	}
	messages := chromedp.Console(ctx)
	b.consoleWG.Add(1)
	go func() {
		defer b.consoleWG.Done()
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() {
				b.mu.Lock()
				b.exceptions = append(b.exceptions, m.String())
				b.mu.Unlock()
			}
			if m.Type == "error" || m.Type == "warning" {
				b.mu.Lock()
				b.console = append(b.console, m.String())
				b.mu.Unlock()
			}
		}
	}()
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspProbe}); err != nil {
		t.Fatalf("install the CSP probe: %v", err)
	}
	return b
}

// do runs steps, failing the test with what.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func evalIn[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitText polls the text of the first element sel matches until ok accepts it.
func (b *browser) waitText(what, sel string, limit time.Duration, ok func(string) bool) string {
	b.t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for {
		last = evalIn[string](b, fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel))
		if ok(last) {
			return last
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: %s shows %q, not within %v", what, sel, last, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shot saves a screenshot of the page as name.png in the artifact folder, and in
// docs/screenshots when SLUICE_UPDATE_SCREENSHOTS=1 (how the README's are refreshed).
func (b *browser) shot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	dirs := []string{b.shots}
	if os.Getenv("SLUICE_UPDATE_SCREENSHOTS") == "1" {
		dirs = append(dirs, filepath.Join("..", "docs", "screenshots"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
}

// unlabelled lists the page's form controls that have no label a screen reader announces.
const unlabelled = `Array.from(document.querySelectorAll("input, select, textarea"))
  .filter((e) => e.type !== "hidden" && e.labels.length === 0 && !e.getAttribute("aria-label") && !e.getAttribute("aria-labelledby"))
  .map((e) => e.outerHTML)`

// checkLabels fails the test when a form control of the page has no label.
func (b *browser) checkLabels(page string) {
	b.t.Helper()
	if bad := evalIn[[]string](b, unlabelled); len(bad) > 0 {
		b.t.Errorf("%s: form controls without a label: %v", page, bad)
	}
}

// focused describes the element that has the keyboard focus.
func (b *browser) focused() string {
	return evalIn[string](b, `(() => { const e = document.activeElement; return e ? e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.getAttribute("href") ? "[" + e.getAttribute("href") + "]" : "") : ""; })()`)
}

// goTo shows a page of the dashboard by its fragment and waits for its heading.
func (b *browser) goTo(id string) {
	b.t.Helper()
	b.do("open page "+id,
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = "#/%s"`, id)),
		chromedp.WaitVisible(chromedp.ID("h-"+id)),
	)
	b.checkLabels(id)
}

// TestDashboard drives the dashboard in headless chromium against the real binary: sign in
// with the keyboard, see the live counters move after traffic, look up a caller's quota,
// ban a caller from the page and see the next check denied, find the ban in the audit page;
// every form control labelled, the navigation reachable by Tab, no CSP violation, and a
// screenshot of every page.
func TestDashboard(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "policy.yaml")
	writeFile(t, config, dashboardPolicy)
	// Counts written every second, not five: the history page, which reads them every 10 s,
	// then shows the traffic by its second read even on a loaded machine.
	s := start(t, config, t.TempDir(), "SLUICE_ADMIN_TOKEN="+e2eAdminToken, "SLUICE_EVENTS_FLUSH=1s")
	base := "http://" + s.http

	// The root sends the browser to the dashboard, which asks for a token.
	b.do("open the dashboard", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	if loc := evalIn[string](b, `location.pathname`); loc != "/ui/" {
		t.Errorf("/ led to %s, want /ui/", loc)
	}
	if evalIn[bool](b, `document.body.textContent.includes("Loading the dashboard")`) {
		t.Error("the placeholder shown without JavaScript is still on the page")
	}
	b.checkLabels("sign-in")
	b.shot("signin")

	// Keyboard only: Tab reaches the token field, typing fills it, Enter submits the form.
	b.do("tab to the token field", chromedp.KeyEvent(kb.Tab))
	if f := b.focused(); f != "input#token" {
		t.Fatalf("first Tab focused %q, want the token field", f)
	}
	b.do("a wrong token", chromedp.KeyEvent("not-the-token"+kb.Enter), chromedp.WaitVisible(chromedp.CSS(`[role="alert"]`)))
	b.do("the right token",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("token").value = ""`),
		chromedp.Focus(chromedp.ID("token")),
		chromedp.KeyEvent(e2eAdminToken+kb.Enter),
		chromedp.WaitVisible(chromedp.ID("h-overview")),
	)

	// Tab from the top of the page reaches every page's link in the navigation, and Enter on
	// one opens its page.
	var reached []string
	b.do("reload: still signed in, focus at the top", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("h-overview")))
	for range 12 {
		b.do("tab", chromedp.KeyEvent(kb.Tab))
		reached = append(reached, b.focused())
	}
	pages := []string{"overview", "top", "caller", "history", "violations", "overrides", "domains", "audit", "nodes"}
	for _, p := range pages {
		if !strings.Contains(strings.Join(reached, " "), "a[#/"+p+"]") {
			t.Errorf("Tab did not reach the %s link; focus went %v", p, reached)
		}
	}
	b.do("enter on the Caller quota link",
		chromedp.Focus(chromedp.CSS(`nav a[href="#/caller"]`)),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.ID("h-caller")),
	)

	// Live counters: nothing yet, then the traffic's decisions within a few polls.
	b.goTo("overview")
	b.waitText("no decisions before the traffic", "main table tbody", 5*time.Second, func(txt string) bool { return strings.Contains(txt, "No decisions yet.") })
	const sent = 25
	for i := range sent {
		user := "ann"
		if i%5 == 0 {
			user = "bob"
		}
		if code := s.checkStatus(fmt.Sprintf(`{"tenant":"acme","user":%q}`, user)); code != 200 {
			t.Fatalf("check %d: %d", i, code)
		}
	}
	b.waitText("the overview counts the traffic", `tr[data-rule="per-user"] .total-allowed`, 20*time.Second, func(txt string) bool { return txt == strconv.Itoa(sent) })
	b.waitText("the rate moves", "#rate-allowed", 5*time.Second, func(txt string) bool { return txt != "0" && txt != "–" })
	b.shot("overview")

	b.goTo("top")
	b.waitText("ann is the top consumer", `table[data-rule="per-user"] tbody tr td:nth-child(2)`, 10*time.Second, func(txt string) bool { return txt == "user:ann" })
	b.shot("top")

	// A caller's quota: the limit minus what ann used.
	b.goTo("caller")
	b.do("look up ann",
		chromedp.SendKeys(chromedp.ID("caller-tenant"), "acme"),
		chromedp.SendKeys(chromedp.ID("caller-user"), "ann"+kb.Enter),
		chromedp.WaitVisible(chromedp.ID("caller-result")),
	)
	b.waitText("ann's remaining quota", `#caller-result tr[data-rule="per-user"] .remaining`, 5*time.Second, func(txt string) bool { return txt == "980" })
	b.shot("caller")

	b.goTo("history")
	b.do("ann's tenant's history",
		chromedp.SendKeys(chromedp.ID("history-tenant"), "acme"+kb.Enter),
		chromedp.WaitVisible(chromedp.ID("history-summary")),
	)
	b.waitText("the history counts the traffic", "#history-summary", 25*time.Second, func(txt string) bool { return strings.Contains(txt, fmt.Sprintf("%d allowed", sent)) })
	b.do("the chart is drawn", chromedp.WaitVisible(chromedp.CSS(".chart canvas")))
	b.shot("history")

	// A ban made from the page denies the next check of that caller, and only that caller.
	b.goTo("overrides")
	b.do("ban bob",
		chromedp.SendKeys(chromedp.ID("ov-tenant"), "acme"),
		chromedp.SendKeys(chromedp.ID("ov-user"), "bob"),
		chromedp.SendKeys(chromedp.ID("ov-reason"), "e2e dashboard ban"),
		chromedp.Click(chromedp.CSS(`form[aria-labelledby="h-new-override"] button[type="submit"]`)),
	)
	b.waitText("the ban is listed", "#overrides tbody", 10*time.Second, func(txt string) bool { return strings.Contains(txt, "user=bob") && strings.Contains(txt, "ban") })
	if msg := evalIn[string](b, `document.querySelector('[role="status"]').textContent`); msg != "Override created." {
		t.Errorf("status after creating the ban: %q", msg)
	}
	waitFor(t, 2*time.Second, "the ban made on the page is enforced", func() bool {
		return s.checkStatus(`{"tenant":"acme","user":"bob"}`) == 429
	})
	if code := s.checkStatus(`{"tenant":"acme","user":"ann"}`); code != 200 {
		t.Errorf("ann is not banned but got %d", code)
	}
	// Extend changes the ban in place (PATCH): same id, an hour later, audited as an update.
	_, before := s.admin("GET", "/admin/v1/overrides?user=bob", "")
	bans, _ := before["overrides"].([]any)
	if len(bans) != 1 {
		t.Fatalf("bob's overrides: %v", before)
	}
	ban := bans[0].(map[string]any)
	b.do("extend bob's ban", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#overrides tr[data-id="%v"] button:not(.danger)`, ban["id"]))))
	b.waitText("the extension is confirmed", `[role="status"]`, 10*time.Second, func(txt string) bool { return txt == "Override extended by an hour." })
	_, after := s.admin("GET", "/admin/v1/overrides?user=bob", "")
	bans, _ = after["overrides"].([]any)
	was, _ := time.Parse(time.RFC3339, ban["expires_at"].(string))
	if len(bans) != 1 || bans[0].(map[string]any)["id"] != ban["id"] {
		t.Errorf("after Extend: %v, want the same override %v", after, ban["id"])
	} else if now, _ := time.Parse(time.RFC3339, bans[0].(map[string]any)["expires_at"].(string)); now.Sub(was) < 59*time.Minute || now.Sub(was) > 61*time.Minute {
		t.Errorf("Extend moved expires_at from %v to %v, want an hour later", was, now)
	}
	if code := s.checkStatus(`{"tenant":"acme","user":"bob"}`); code != 429 {
		t.Errorf("bob after his ban was extended: %d, want 429", code)
	}
	b.shot("overrides")
	b.goTo("violations")
	b.waitText("bob's denied check is a violation", "table tbody", 15*time.Second, func(txt string) bool { return strings.Contains(txt, "bob") && strings.Contains(txt, "hard") })
	b.shot("violations")

	// An Envoy domain written on the page as YAML is enforced; a bad one is refused naming
	// its field, and the domain can be edited and deleted from its row.
	b.goTo("domains")
	b.do("put a domain as YAML",
		chromedp.SendKeys(chromedp.ID("dom-name"), "edge"),
		chromedp.SendKeys(chromedp.ID("dom-config"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
		chromedp.Click(chromedp.CSS(`form[aria-labelledby="h-put-domain"] button[type="submit"]`)),
	)
	b.waitText("the domain is listed", `#domains tr[data-domain="edge"]`, 10*time.Second, func(txt string) bool { return strings.Contains(txt, "api") && strings.Contains(txt, "bootstrap") })
	const rls = `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.9"}]}]}`
	if code, out := s.rlsJSON(rls); code != 200 || !strings.Contains(out, `"requestsPerUnit":1`) {
		t.Errorf("the domain put on the page: first request %d %s, want OK under a limit of 1", code, out)
	}
	if code, _ := s.rlsJSON(rls); code != 429 {
		t.Errorf("the domain put on the page: second request %d, want 429", code)
	}
	b.shot("domains")
	b.do("edit it into a bad unit",
		chromedp.Click(chromedp.CSS(`#domains tr[data-domain="edge"] button:not(.danger)`)),
		chromedp.Evaluate[chromedp.Void](`(() => { const t = document.getElementById("dom-config"); t.value = t.value.replace('"hour"', '"fortnight"'); t.dispatchEvent(new Event("input", { bubbles: true })); })()`),
		chromedp.Click(chromedp.CSS(`form[aria-labelledby="h-put-domain"] button[type="submit"]`)),
	)
	b.waitText("the bad unit is refused, its field named", `[role="alert"]`, 10*time.Second, func(txt string) bool {
		return strings.Contains(txt, "fortnight") && strings.Contains(txt, "descriptors[0].rate_limit.unit")
	})
	b.do("delete it", chromedp.Click(chromedp.CSS(`#domains tr[data-domain="edge"] button.danger`)))
	b.waitText("the domain is gone", "#domains tbody", 10*time.Second, func(txt string) bool { return strings.Contains(txt, "No domains.") })

	b.goTo("audit")
	b.waitText("the ban is audited", `#audit tr[data-kind="override"][data-action="create"]`, 10*time.Second, func(txt string) bool {
		return strings.Contains(txt, "e2e dashboard ban")
	})
	b.shot("audit")
	// Names that reorder text are shown escaped, as the CLI shows them, never raw.
	if code, body := s.admin("POST", "/admin/v1/overrides", `{"tenant":"evil\u202etxt.exe","type":"ban","ttl":"1h","reason":"looks \u2067fine\u2069"}`); code != 201 {
		t.Fatalf("override with a bidi name: %d %v", code, body)
	}
	b.goTo("audit")
	b.goTo("overrides")
	b.waitText("the bidi name is escaped", "#overrides tbody", 10*time.Second, func(txt string) bool {
		return strings.Contains(txt, `tenant=evil\u{202e}txt.exe`) && strings.Contains(txt, `looks \u{2067}fine\u{2069}`) &&
			!strings.ContainsAny(txt, "\u202e\u2067\u2069")
	})
	// The API answers lists in pages of 1,000; the page follows next and shows every override.
	var bulk strings.Builder
	bulk.WriteString(`{"overrides":[`)
	for i := range 1000 {
		if i > 0 {
			bulk.WriteByte(',')
		}
		fmt.Fprintf(&bulk, `{"tenant":"bulk-%04d","type":"multiplier","value":2,"ttl":"1h","reason":"paging"}`, i)
	}
	bulk.WriteString(`]}`)
	if code, body := s.admin("POST", "/admin/v1/import?apply=true", bulk.String()); code != 200 {
		t.Fatalf("import of 1,000 overrides: %d %v", code, body)
	}
	b.goTo("audit")
	b.goTo("overrides")
	b.waitText("the overrides past the first page are listed", "#overrides tbody", 30*time.Second, func(txt string) bool {
		return strings.Contains(txt, "tenant=bulk-0999") && strings.Contains(txt, "tenant=bulk-0000")
	})

	b.goTo("nodes")
	b.waitText("the node is listed", "#nodes tbody", 10*time.Second, func(txt string) bool { return strings.Contains(txt, s.http) && strings.Contains(txt, "memory up") })
	b.shot("nodes")

	// The page never broke its Content-Security-Policy, nor logged an error.
	if !evalIn[bool](b, `Array.isArray(window.__csp)`) {
		t.Fatal("the CSP probe is not in the page: violations would go unseen")
	}
	if v := evalIn[[]string](b, `window.__csp`); len(v) > 0 {
		t.Errorf("CSP violations: %v", v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.exceptions {
		t.Errorf("uncaught in the page: %s", m)
	}
	// Other errors are expected: the wrong token's 401 is logged as a failed load.
	for _, m := range b.console {
		if strings.Contains(m, "Content Security Policy") || strings.Contains(m, "Content-Security-Policy") {
			t.Errorf("console: %s", m)
		} else {
			t.Logf("console: %s", m)
		}
	}
}
