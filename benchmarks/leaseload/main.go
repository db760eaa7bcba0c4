// Command leaseload drives a running sluice over HTTP with reservations against plain checks
// (scripts/leasebench.sh runs it): for each mode, c workers on keep-alive connections for d,
// printing round trips per second. Mode check is one POST /v1/check; reserve is a POST
// /v1/reserve then a POST /v1/commit of part of the estimate, counted as one round trip pair;
// acquire takes a concurrency slot (POST /v1/reserve on /slots) and releases it (POST
// /v1/release), counted as one pair; hold and hold-slots reserve n leases (of the token
// bucket, or slots) and settle none (for memory per live lease).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "sluice HTTP address")
	mode := flag.String("mode", "check", "check, reserve, acquire, hold or hold-slots")
	c := flag.Int("c", 32, "workers")
	d := flag.Duration("d", 10*time.Second, "duration (check, reserve)")
	n := flag.Int("n", 100000, "leases to hold (hold)")
	users := flag.Int("users", 10000, "distinct users")
	flag.Parse()
	tr := &http.Transport{MaxIdleConnsPerHost: *c, MaxConnsPerHost: *c}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	leaseRE := regexp.MustCompile(`"lease":"(ls_[0-9a-f]+)"`)
	post := func(path, body string) (int, []byte, error) {
		resp, err := client.Post("http://"+*addr+path, "application/json", bytes.NewBufferString(body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	// endpoint /llm is the token bucket's, /slots the concurrency limit's (leasebench.sh).
	endpoint := "/llm"
	if *mode == "acquire" || *mode == "hold-slots" {
		endpoint = "/slots"
	}
	reserve := func(rng *rand.Rand, ttl string) (string, error) {
		code, b, err := post("/v1/reserve", fmt.Sprintf(`{"tenant":"bench","user":"u%d","endpoint":%q,"cost":10,"ttl":%q}`, rng.IntN(*users), endpoint, ttl))
		if err != nil || code != 200 {
			return "", fmt.Errorf("reserve: %d %s %v", code, b, err)
		}
		m := leaseRE.FindSubmatch(b)
		if m == nil {
			return "", fmt.Errorf("reserve: no lease in %s", b)
		}
		return string(m[1]), nil
	}
	var ops, fails atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	switch *mode {
	case "check", "reserve", "acquire":
		stop := time.Now().Add(*d)
		for w := range *c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for time.Now().Before(stop) {
					if *mode == "check" {
						code, _, err := post("/v1/check", fmt.Sprintf(`{"tenant":"bench","user":"u%d","endpoint":"/llm","cost":10}`, rng.IntN(*users)))
						if err != nil || code != 200 {
							fails.Add(1)
							continue
						}
					} else {
						lease, err := reserve(rng, "1m")
						if err != nil {
							fails.Add(1)
							continue
						}
						body := fmt.Sprintf(`{"tenant":"bench","lease":%q,"used":%d}`, lease, rng.IntN(10))
						path := "/v1/commit"
						if *mode == "acquire" {
							path, body = "/v1/release", fmt.Sprintf(`{"tenant":"bench","lease":%q}`, lease)
						}
						code, _, err := post(path, body)
						if err != nil || code != 200 {
							fails.Add(1)
							continue
						}
					}
					ops.Add(1)
				}
			}()
		}
	case "hold", "hold-slots":
		var next atomic.Int64
		for w := range *c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 2))
				for next.Add(1) <= int64(*n) {
					if _, err := reserve(rng, "1h"); err != nil {
						fails.Add(1)
						continue
					}
					ops.Add(1)
				}
			}()
		}
	default:
		fmt.Fprintln(os.Stderr, "leaseload: unknown mode", *mode)
		os.Exit(2)
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("%s: %d ok, %d failed in %.1fs: %.0f/s\n", *mode, ops.Load(), fails.Load(), el.Seconds(), float64(ops.Load())/el.Seconds())
	if fails.Load() > 0 {
		os.Exit(1)
	}
}
