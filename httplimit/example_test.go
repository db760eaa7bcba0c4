package httplimit_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

func Example() {
	cfg, err := policy.ParseConfig("inline", []byte(`
rules:
  - {name: per-caller, key: [identity], algorithm: gcra, limit: 100, period: 1m, burst: 2}
`))
	if err != nil {
		log.Fatal(err)
	}
	snap, err := policy.Compile(cfg)
	if err != nil {
		log.Fatal(err)
	}
	lim, err := sluice.New(memory.New(), snap)
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	// The application's own record of API keys and whose they are.
	keys := map[string]string{"k-7f3a": "acme"}

	// Callers are limited by API key once the key is verified, and anonymous callers by their
	// address (the default). A header is never trusted as it comes.
	identify := func(r *http.Request, req *sluice.Request) error {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return nil // anonymous: req.IP, the peer address, identifies the caller
		}
		tenant, ok := keys[token]
		if !ok {
			return errors.New("unknown API key") // 401
		}
		req.APIKey, req.Tenant = token, tenant
		return nil
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) })
	h := httplimit.New(lim, httplimit.WithIdentity(identify)).Handler(api)
	// http.Handle("/", h); http.ListenAndServe(":8080", nil)

	for _, auth := range []string{"Bearer k-7f3a", "Bearer k-7f3a", "Bearer k-7f3a", "Bearer forged", ""} {
		r := httptest.NewRequest("GET", "/api/hello", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%-15q %d\n", auth, w.Code)
	}
	// Output:
	// "Bearer k-7f3a" 200
	// "Bearer k-7f3a" 200
	// "Bearer k-7f3a" 429
	// "Bearer forged" 401
	// ""              200
}
