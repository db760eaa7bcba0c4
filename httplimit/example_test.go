package httplimit_test

import (
	"log"
	"net/http"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

func Example() {
	cfg, err := policy.ParseConfig("inline", []byte(`
rules:
  - {name: per-key, key: [identity], algorithm: gcra, limit: 100, period: 1m, burst: 20}
`))
	if err != nil {
		log.Fatal(err)
	}
	snap, err := policy.Compile(cfg)
	if err != nil {
		log.Fatal(err)
	}
	lim := sluice.New(memory.New(), snap)
	defer lim.Close()

	api := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) })
	http.Handle("/", httplimit.New(lim, httplimit.WithAPIKeyHeader("Authorization")).Handler(api))
	// http.ListenAndServe(":8080", nil)
}
