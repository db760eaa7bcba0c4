// Package ui serves the dashboard (docs/architecture.md, Dashboard): a single-page app built
// from ../../ui (Preact, htm and uPlot, bundled by esbuild) into dist, which is committed and
// embedded, so that `go build` alone makes a binary that serves it and the machines that run
// it need no internet. `go generate ./control/ui` rebuilds dist; TestAssetsAreBuilt fails when
// the committed dist is not what the sources build.
//
// The app signs in with an admin API token, kept in the browser's session storage, and talks
// to the admin API only; this package serves files and nothing else.
package ui

//go:generate sh -c "cd ../../ui && npm ci --no-audit --no-fund && node build.mjs"

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed dist
var dist embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of every answer: scripts, styles and connections from
// this origin only, nothing inline, no frames, no forms posted elsewhere. Styles that the
// scripts set through the CSSOM (uPlot's sizes, the quota bars' widths) are not inline styles
// to CSP, so 'unsafe-inline' is not needed.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the dashboard under Prefix: the app's files, and index.html for any other
// path under it (the app routes by the URL's fragment, so that is only the bare /ui/).
func Handler() http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // dist is embedded at build time: a missing one fails the tests
	}
	files := http.FileServerFS(sub)
	return http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := strings.TrimPrefix(r.URL.Path, "/")
		if p == "" || p == "index.html" {
			// The page must not be cached across deploys: it names the current assets.
			h.Set("Cache-Control", "no-cache")
			serveIndex(w, r, sub)
			return
		}
		if _, err := fs.Stat(sub, p); err != nil {
			http.NotFound(w, r)
			return
		}
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
}

func serveIndex(w http.ResponseWriter, r *http.Request, sub fs.FS) {
	b, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		http.Error(w, "dashboard not built", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	w.Write(b)
}
