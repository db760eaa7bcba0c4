package ui_test

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control/ui"
)

// RequireNodeEnv makes a missing node or npm a failure rather than a skip (scripts/test.sh
// sets it, after install-deps installed them).
const RequireNodeEnv = "SLUICE_REQUIRE_NODE"

// TestAssetsAreBuilt builds the dashboard from ../../ui into a temporary folder, as
// `go generate ./control/ui` does (npm ci from the lock file, then esbuild), and fails when the
// committed dist differs: the embedded assets are always what the sources build.
func TestAssetsAreBuilt(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv(RequireNodeEnv) == "1" {
				t.Fatalf("%s not installed and %s=1", tool, RequireNodeEnv)
			}
			t.Skipf("%s not installed; set %s=1 to make this a failure", tool, RequireNodeEnv)
		}
	}
	src := filepath.Join("..", "..", "ui")
	work := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "build.mjs"} {
		copyFile(t, filepath.Join(src, f), filepath.Join(work, f))
	}
	if err := os.CopyFS(filepath.Join(work, "src"), os.DirFS(filepath.Join(src, "src"))); err != nil {
		t.Fatal(err)
	}
	run := func(env []string, name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), name, args...)
		cmd.Dir, cmd.Env = work, append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run(nil, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	out := filepath.Join(work, "dist")
	run([]string{"SLUICE_UI_OUT=" + out}, "node", "build.mjs")

	built, committed := files(t, out), files(t, "dist")
	for name, b := range built {
		c, ok := committed[name]
		switch {
		case !ok:
			t.Errorf("dist/%s is built but not committed: run go generate ./control/ui", name)
		case !bytes.Equal(b, c):
			t.Errorf("dist/%s differs from a fresh build: run go generate ./control/ui and commit it", name)
		}
	}
	for name := range committed {
		if _, ok := built[name]; !ok {
			t.Errorf("dist/%s is committed but no longer built: run go generate ./control/ui", name)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func files(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHandler(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle(ui.Prefix, ui.Handler())
	for _, tc := range []struct {
		name, method, path string
		status             int
		contains, ctype    string
	}{
		{"index", "GET", "/ui/", 200, `<script type="module" src="app.js">`, "text/html"},
		{"index by name", "GET", "/ui/index.html", 200, "Sluice dashboard", "text/html"},
		{"script", "GET", "/ui/app.js", 200, "", "javascript"},
		{"styles", "GET", "/ui/app.css", 200, ".uplot", "text/css"},
		{"missing", "GET", "/ui/nope.js", 404, "", ""},
		{"outside", "GET", "/ui/%2e%2e/go.mod", 404, "", ""},
		{"post", "POST", "/ui/", 405, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			if tc.status != 200 {
				return
			}
			if got := rec.Header().Get("Content-Security-Policy"); got != ui.CSP {
				t.Errorf("CSP %q", got)
			}
			if !strings.Contains(rec.Header().Get("Content-Type"), tc.ctype) {
				t.Errorf("Content-Type %q, want %s", rec.Header().Get("Content-Type"), tc.ctype)
			}
			if !strings.Contains(rec.Body.String(), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
		})
	}
}

// TestNoExternalResources: the machines that run Sluice may have no internet, and the CSP
// would refuse them anyway: the built assets load nothing from another origin.
func TestNoExternalResources(t *testing.T) {
	t.Parallel()
	for name, b := range files(t, "dist") {
		for _, bad := range []string{"https://fonts.", "//cdn.", "unpkg.com", "jsdelivr", "@import url(http"} {
			if bytes.Contains(b, []byte(bad)) {
				t.Errorf("dist/%s references %q", name, bad)
			}
		}
	}
}
