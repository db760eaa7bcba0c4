package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// rlsJSON posts an Envoy request to /json and returns its status code and answer.
func (s *server) rlsJSON(body string) (int, string) {
	s.t.Helper()
	resp, err := http.Post("http://"+s.http+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestDomainPutOnOneNodeEnforcedOnTheOther (DESIGN.md, Envoy requests get the whole product):
// two nodes on PostgreSQL; a domain PUT as YAML through A's admin API is enforced by B within
// 1 s, and its deletion too.
func TestDomainPutOnOneNodeEnforcedOnTheOther(t *testing.T) {
	_, a, b := twoNodes(t)
	const request = `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.7"}]}]}`
	if code, out := b.rlsJSON(request); code != 200 || strings.Contains(out, "currentLimit") {
		t.Fatalf("before the PUT: %d %s; want OK with no limit (an unknown domain)", code, out)
	}

	req, err := http.NewRequest("PUT", "http://"+a.http+"/admin/v1/domains/edge", strings.NewReader(
		"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
	req.Header.Set("Content-Type", "application/yaml")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT on A: %d %s", resp.StatusCode, raw)
	}
	took := waitFor(t, propagationBound, "domain put on A enforced on B", func() bool {
		// A look (the descriptor's hits_addend 0) that spends nothing.
		_, out := b.rlsJSON(`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.7"}],"hitsAddend":0}]}`)
		return strings.Contains(out, `"requestsPerUnit":1`)
	})
	t.Logf("domain A -> B enforced after %v", took)
	if code, out := b.rlsJSON(request); code != 200 {
		t.Fatalf("B's first request in edge: %d %s", code, out)
	}
	if code, out := b.rlsJSON(request); code != 429 {
		t.Fatalf("B's second request in edge (1 per hour): %d %s", code, out)
	}

	if code, m := b.admin("DELETE", "/admin/v1/domains/edge", ""); code != 204 {
		t.Fatalf("DELETE on B: %d %v", code, m)
	}
	took = waitFor(t, propagationBound, "domain deleted on B gone from A", func() bool {
		code, out := a.rlsJSON(request)
		return code == 200 && !strings.Contains(out, "currentLimit")
	})
	t.Logf("deletion B -> A enforced after %v", took)
}
