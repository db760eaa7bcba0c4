package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/testca"
)

func TestRegionFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	token, short := filepath.Join(dir, "token"), filepath.Join(dir, "short")
	if err := os.WriteFile(token, []byte("0123456789abcdef-region\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("0123456789abcde\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := regionFlags{name: "eu", regions: "us=us.example:8081, ap=ap.example:8081", sync: 100 * time.Millisecond, timeout: 5 * time.Second, tokenFile: token}
	with := func(f func(*regionFlags)) regionFlags { c := ok; f(&c); return c }
	cases := []struct {
		name  string
		flags regionFlags
		err   string
		peers int
	}{
		{"off", regionFlags{sync: 100 * time.Millisecond, timeout: 5 * time.Second}, "", -1},
		{"two peers", ok, "", 2},
		{"alone", with(func(c *regionFlags) { c.regions = "" }), "", 0},
		{"regions without region", with(func(c *regionFlags) { c.name = "" }), "--regions: needs --region", 0},
		{"ca without region", regionFlags{ca: "x.pem"}, "--region-ca: needs --region", 0},
		{"bad name", with(func(c *regionFlags) { c.name = "e u" }), `--region: region name "e u" holds`, 0},
		{"pair without addr", with(func(c *regionFlags) { c.regions = "us=" }), `--regions: "us=" is not NAME=ADDR`, 0},
		{"pair without =", with(func(c *regionFlags) { c.regions = "us" }), `--regions: "us" is not NAME=ADDR`, 0},
		{"self listed", with(func(c *regionFlags) { c.regions = "eu=x:1" }), "--regions: eu is this region", 0},
		{"twice", with(func(c *regionFlags) { c.regions = "us=x:1,us=y:1" }), "--regions: us listed twice", 0},
		{"bad peer name", with(func(c *regionFlags) { c.regions = "u/s=x:1" }), `--regions: region name "u/s"`, 0},
		{"sync 0", with(func(c *regionFlags) { c.sync = 0 }), "--region-sync: 0s: want 1ms to 1m", 0},
		{"timeout not above sync", with(func(c *regionFlags) { c.timeout = 100 * time.Millisecond }), "--region-timeout: 100ms: must be longer than --region-sync", 0},
		{"missing ca", with(func(c *regionFlags) { c.ca = filepath.Join(dir, "missing.pem") }), "--region-ca: open", 0},
		{"ca not PEM", with(func(c *regionFlags) { c.ca = notPEM }), "holds no PEM certificate", 0},
		{"no token", with(func(c *regionFlags) { c.tokenFile = "" }), "--region-token-file: needed with --region", 0},
		{"short token", with(func(c *regionFlags) { c.tokenFile = short }), "--region-token-file: the region token must hold at least 16", 0},
		{"missing token file", with(func(c *regionFlags) { c.tokenFile = filepath.Join(dir, "missing") }), "--region-token-file: open", 0},
		{"token without region", regionFlags{tokenFile: token}, "--region-token-file: needs --region", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := c.flags.config("", "", slog.Default())
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				if strings.Contains(err.Error(), "0123456789abcde") {
					t.Fatalf("the error shows the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.peers < 0 {
				if cfg != nil {
					t.Fatal("a config without --region")
				}
				return
			}
			if len(cfg.Peers) != c.peers || cfg.Peers["us"] != "" && cfg.Peers["us"] != "us.example:8081" {
				t.Fatalf("peers = %v", cfg.Peers)
			}
			if cfg.Token != "0123456789abcdef-region" {
				t.Fatalf("token not read from the file's first line")
			}
		})
	}
	// A CA bundle turns TLS on for region links, with --tls-cert as the client certificate.
	ca := testca.New(t, "regions")
	cert, key := ca.Client(t, "eu").Files(t, dir, "eu")
	cfg, err := with(func(c *regionFlags) { c.ca = ca.File(t, dir, "ca.pem") }).config(cert, key, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 1 {
		t.Fatalf("TLS config %+v", cfg.TLS)
	}
}
