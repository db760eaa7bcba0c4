package adminapi

import (
	_ "embed"
	"net/http"
	"net/url"
)

// openAPI is the OpenAPI 3 document of the admin API, written by hand next to the handlers it
// describes; the tests check that every operation in it answers and every answer matches it.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3 document of the admin API (a copy).
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// serveOpenAPI answers GET /admin/v1/openapi.json, the one call that needs no token: the
// document describes the API, not its data.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", contentETag(openAPI))
	w.Write(openAPI)
}

func pathEscape(s string) string { return url.PathEscape(s) }
