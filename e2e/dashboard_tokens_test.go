package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// statusWith is the status of GET path on s with token as the bearer.
func (s *server) statusWith(token, path string) int {
	s.t.Helper()
	req, err := http.NewRequest("GET", "http://"+s.http+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDashboardTokens drives the dashboard's token page (issue 29) in headless chromium: it
// lists each token's role, expiry and last use; a token created with a ttl shows its secret
// once, the secret works, and its use shows as its last use; a bad ttl is refused naming the
// field; Revoke makes the secret a 401 at once. Every control labelled, no CSP violation.
func TestDashboardTokens(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	config := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, config, dashboardPolicy)
	s := start(t, config, t.TempDir(), "SLUICE_ADMIN_TOKEN="+e2eAdminToken)
	base := "http://" + s.http

	b.do("sign in",
		chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Focus(chromedp.ID("token")), chromedp.KeyEvent(e2eAdminToken+kb.Enter),
		chromedp.WaitVisible(chromedp.ID("h-overview")),
	)
	// A token's last use reaches the control store within a flush (5 s); the page shows what
	// the store holds when it loads, so it loads once the use is there.
	deadline := time.Now().Add(30 * time.Second)
	for !bootstrapUsed(s) {
		if time.Now().After(deadline) {
			t.Fatal("the bootstrap token's use is not recorded 30 s after sign-in")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.goTo("tokens")
	b.waitText("the bootstrap token is listed, used", `#tokens tr[data-name="bootstrap"]`, 10*time.Second, func(txt string) bool {
		return strings.Contains(txt, "admin") && strings.Contains(txt, "never") && strings.Count(txt, "never") == 1 // no expiry, but used
	})

	// A bad ttl is refused, its field named; nothing is created.
	b.do("a bad ttl",
		chromedp.SendKeys(chromedp.ID("tok-name"), "ci"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("tok-ttl").select()`),
		chromedp.SendKeys(chromedp.ID("tok-ttl"), "soon"),
		chromedp.Click(chromedp.CSS(`form[aria-labelledby="h-new-token"] button[type="submit"]`)),
	)
	b.waitText("the ttl is refused", `[role="alert"]`, 10*time.Second, func(txt string) bool { return strings.Contains(txt, "ttl") })
	if names := tokenNames(s); strings.Contains(names, " ci ") {
		t.Errorf("after a refused create, tokens are%s", names)
	}

	// Created with a ttl: the secret is shown once and works; the table shows role and expiry.
	b.do("create ci, write, 90 days",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("tok-ttl").select()`),
		chromedp.SendKeys(chromedp.ID("tok-ttl"), "90d"),
		chromedp.Evaluate[chromedp.Void](`(() => { const r = document.getElementById("tok-role"); r.value = "write"; r.dispatchEvent(new Event("change", {bubbles: true})); })()`),
		chromedp.Click(chromedp.CSS(`form[aria-labelledby="h-new-token"] button[type="submit"]`)),
	)
	secret := b.waitText("the secret is shown", "#token-secret-value", 10*time.Second, func(txt string) bool { return len(txt) >= 16 })
	expiry := time.Now().UTC().Add(90 * 24 * time.Hour).Format("2006-01-02")
	b.waitText("ci is listed with its role and expiry", `#tokens tr[data-name="ci"]`, 10*time.Second, func(txt string) bool {
		return strings.Contains(txt, "write") && strings.Contains(txt, expiry) && strings.Contains(txt, "never") // not used yet
	})
	if code := s.statusWith(secret, "/admin/v1/rules"); code != 200 {
		t.Fatalf("the secret shown: GET rules = %d", code)
	}
	// The use shows as its last use on a later read of the list (the page rereads it).
	b.goTo("nodes")
	b.goTo("tokens")
	b.waitText("ci's use is shown", `#tokens tr[data-name="ci"]`, 20*time.Second, func(txt string) bool { return !strings.Contains(txt, "never") })
	b.shot("tokens") // no secret on it: docs/screenshots/tokens.png
	if evalIn[bool](b, `!!document.getElementById("token-secret")`) {
		t.Error("the secret is still shown after leaving the page")
	}
	if strings.Contains(evalIn[string](b, `document.body.textContent`), secret) {
		t.Error("the secret is on the page again")
	}

	b.do("revoke ci", chromedp.Click(chromedp.CSS(`#tokens tr[data-name="ci"] button.danger`)))
	b.waitText("the revocation is confirmed", `[role="status"]`, 10*time.Second, func(txt string) bool { return txt == "Token ci revoked." })
	waitFor(t, 10*time.Second, "ci's row is gone", func() bool { return !evalIn[bool](b, `!!document.querySelector('#tokens tr[data-name="ci"]')`) })
	if names := tokenNames(s); strings.Contains(names, " ci ") {
		t.Errorf("after Revoke, tokens are%s", names)
	}
	if code := s.statusWith(secret, "/admin/v1/rules"); code != http.StatusUnauthorized {
		t.Errorf("a revoked secret: GET rules = %d, want 401", code)
	}

	if v := evalIn[[]string](b, `window.__csp || []`); len(v) > 0 {
		t.Errorf("CSP violations: %v", v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.exceptions {
		t.Errorf("uncaught in the page: %s", m)
	}
}

// listTokens returns s's tokens as the admin API lists them.
func listTokens(s *server) []any {
	s.t.Helper()
	code, body := s.admin("GET", "/admin/v1/tokens", "")
	if code != 200 {
		s.t.Fatalf("GET tokens = %d %v", code, body)
	}
	items, _ := body["tokens"].([]any)
	return items
}

// bootstrapUsed reports whether the control store holds a last use of the bootstrap token.
func bootstrapUsed(s *server) bool {
	s.t.Helper()
	for _, it := range listTokens(s) {
		if m := it.(map[string]any); m["name"] == "bootstrap" && m["last_used_at"] != nil {
			return true
		}
	}
	return false
}

// tokenNames lists the names of s's tokens, each between spaces.
func tokenNames(s *server) string {
	s.t.Helper()
	out := " "
	for _, it := range listTokens(s) {
		out += it.(map[string]any)["name"].(string) + " "
	}
	return out
}
