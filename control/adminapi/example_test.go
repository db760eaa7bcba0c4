package adminapi_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/transport/grpcapi"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// A node bootstraps its admin token, mounts the admin API, and makes resets need a write
// token; an admin then creates a token for CI.
func Example() {
	dir, _ := os.MkdirTemp("", "adminapi-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlite.Open(ctx, sqlite.Path(dir), control.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// SLUICE_ADMIN_TOKEN, or a random token written to <data-dir>/admin.token.
	const secret = "example-secret-0123456789abcdef"
	if _, err := adminapi.Bootstrap(ctx, store, adminapi.BootstrapOptions{Secret: secret, DataDir: dir}); err != nil {
		log.Fatal(err)
	}
	admin, err := adminapi.New(adminapi.Options{Control: store}) // with Limiter, Files, PolicyVersion in serve
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	mux := http.NewServeMux()
	mux.Handle(adminapi.Prefix, admin)
	_ = httpapi.Options{ResetAuth: func(h http.Handler) http.Handler { return admin.RequireRole(control.RoleWrite, h) }}
	_ = grpcapi.WithResetAuth(admin.GRPCAuth(control.RoleWrite))

	req := httptest.NewRequest("POST", "/admin/v1/tokens", strings.NewReader(`{"name":"ci","role":"read"}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get(adminapi.PolicyVersionHeader))
	// Output: 201 2
}
