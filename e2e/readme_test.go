package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readmeSkipped are the README's commands that do not run against the quick-start server,
// by prefix, with the reason. Every other shell command in the README runs: a new one that
// needs something else must be listed here, or TestReadmeCommands fails on it.
var readmeSkipped = []struct{ prefix, why string }{
	{"go run ./cmd/sluice serve", "the server itself: the test started it"},
	{"make build", "the test runs the binary TestMain built"},
	// Most specific first: the first prefix that matches gives the reason.
	{"sluice serve --store rediss:", "needs a Redis server with TLS"},
	{"sluice serve --store redis-sentinel:", "needs Redis Sentinel"},
	{"sluice serve --store redis-cluster:", "needs a Redis Cluster"},
	{"sluice serve --store redis://redis:6379 --otlp-endpoint", "needs Redis and an OpenTelemetry collector"},
	{"sluice serve --store redis:", "needs a Redis server"},
	{"SLUICE_REGION_TOKEN_FILE=", "needs Redis and two other regions"},
	{"docker run", "needs a Docker engine and the image"},
}

// readmeCommand is one logical shell command of the README: continuation lines joined.
type readmeCommand struct {
	line int    // where it starts in README.md
	text string // as written
	want int    // the HTTP status its curl calls must answer (a trailing "# 429"), else 0: 2xx
}

// readmeCommands extracts the commands of the README's shell blocks: indented code blocks
// and ```sh fences, comment lines dropped.
func readmeCommands(t *testing.T, readme string) []readmeCommand {
	t.Helper()
	var cmds []readmeCommand
	var cur *readmeCommand
	add := func(n int, s string) {
		if cur != nil {
			cur.text += "\n" + s
		} else {
			if strings.HasPrefix(strings.TrimSpace(s), "#") || strings.TrimSpace(s) == "" {
				return
			}
			cmds = append(cmds, readmeCommand{line: n, text: s})
			cur = &cmds[len(cmds)-1]
		}
		if !strings.HasSuffix(s, "\\") {
			cur = nil
		}
	}
	fence, shell, prevBlank, indented := false, false, true, false
	for i, l := range strings.Split(readme, "\n") {
		n := i + 1
		if strings.HasPrefix(l, "```") {
			fence, shell = !fence, false
			if fence {
				lang := strings.TrimPrefix(l, "```")
				shell = lang == "sh" || lang == "bash" || lang == "shell"
			}
			continue
		}
		switch {
		case fence:
			if shell {
				add(n, l)
			}
		case strings.HasPrefix(l, "    ") && (prevBlank || indented):
			indented = true
			add(n, strings.TrimPrefix(l, "    "))
		case strings.TrimSpace(l) != "":
			indented = false
		}
		prevBlank = strings.TrimSpace(l) == ""
	}
	status := regexp.MustCompile(`#\s*([1-5][0-9][0-9])\b[^\n]*$`)
	for i := range cmds {
		if m := status.FindStringSubmatch(cmds[i].text); m != nil {
			cmds[i].want, _ = strconv.Atoi(m[1])
		}
	}
	return cmds
}

// TestReadmeCommands pastes the README's shell commands, in order, into one shell next to
// `sluice serve` on its embedded default, as a newcomer would (issue 30: the reset example
// answered 401 as written), and checks that each succeeds: exit 0, and every HTTP answer 2xx
// or the status its trailing comment names. Differences from a reader's terminal, each
// because the test shares its machine: the server listens on free ports (the commands'
// localhost:8080 and :8081 are rewritten, and SLUICE_SERVER and SLUICE_GRPC name them),
// `go run ./cmd/sluice` is the binary TestMain built (the same code, not compiled again), and
// the folder is a temporary one holding ./data and a link to examples/.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("SLUICE_REQUIRE_CURL") == "1" {
			t.Fatal("curl not found and SLUICE_REQUIRE_CURL=1: run scripts/install-deps.sh")
		}
		t.Skip("curl not found: scripts/install-deps.sh installs it")
	}
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t, string(raw))
	if len(cmds) < 10 {
		t.Fatalf("found %d commands in the README: the extraction is broken", len(cmds))
	}

	work := t.TempDir()
	examples, err := filepath.Abs("../examples")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(examples, filepath.Join(work, "examples")); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(work, "path")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary, filepath.Join(bin, "sluice")); err != nil {
		t.Fatal(err)
	}
	s := start(t, "", filepath.Join(work, "data"))

	// One script, so that what a command sets (TOKEN=...) is there for the next, as in one
	// terminal. Markers delimit each command's output; curl reports its status after it.
	var script strings.Builder
	script.WriteString("curl() { command curl -w '\\n@@status %{http_code}\\n' \"$@\"; }\n")
	rewrite := strings.NewReplacer(
		"localhost:8080", s.http, "127.0.0.1:8080", s.http,
		"localhost:8081", s.grpc, "127.0.0.1:8081", s.grpc,
		"go run ./cmd/sluice ", "sluice ",
	)
	var run []readmeCommand
	for _, c := range cmds {
		skipped := false
		for _, sk := range readmeSkipped {
			if strings.HasPrefix(c.text, sk.prefix) {
				t.Logf("README.md:%d: not run (%s): %s", c.line, sk.why, firstLine(c.text))
				skipped = true
				break
			}
		}
		if skipped {
			continue
		}
		if strings.HasPrefix(c.text, "make ") {
			t.Errorf("README.md:%d: %q: make targets are not run here; list it in readmeSkipped with why", c.line, c.text)
			continue
		}
		fmt.Fprintf(&script, "echo '@@begin %d'\n%s\necho \"@@exit %d $?\"\n", len(run), rewrite.Replace(c.text), len(run))
		run = append(run, c)
	}
	sh := exec.Command("bash", "-c", script.String())
	sh.Dir = work
	sh.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SLUICE_SERVER=http://"+s.http, "SLUICE_GRPC="+s.grpc,
		// The token must come from ./data/admin.token, as on a reader's machine.
		"SLUICE_TOKEN=", "SLUICE_ADMIN_TOKEN=", "SLUICE_DATA_DIR=")
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("the script failed: %v\n%s", err, out)
	}

	outputs := map[int]string{}
	exits := map[int]int{}
	cur := -1
	var buf strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		var n, code int
		switch {
		case scan(l, "@@begin %d", &n):
			cur = n
			buf.Reset()
		case scan(l, "@@exit %d %d", &n, &code):
			outputs[n], exits[n] = buf.String(), code
			cur = -1
		case cur >= 0:
			buf.WriteString(l + "\n")
		}
	}
	statusLine := regexp.MustCompile(`(?m)^@@status (\d+)$`)
	for i, c := range run {
		o, ok := outputs[i]
		if !ok {
			t.Errorf("README.md:%d: no output recorded for %s", c.line, firstLine(c.text))
			continue
		}
		if exits[i] != 0 {
			t.Errorf("README.md:%d: exit %d: %s\n%s", c.line, exits[i], c.text, o)
		}
		for _, m := range statusLine.FindAllStringSubmatch(o, -1) {
			code, _ := strconv.Atoi(m[1])
			switch {
			case c.want != 0 && code != c.want:
				t.Errorf("README.md:%d: HTTP %d, want %d as its comment says: %s\n%s", c.line, code, c.want, c.text, o)
			case c.want == 0 && (code < 200 || code > 299):
				t.Errorf("README.md:%d: HTTP %d: %s\n%s", c.line, code, c.text, o)
			}
		}
	}
	if t.Failed() {
		return
	}
	// What issue 30 found, seen through the README's own commands: the admin CLI said where
	// its token came from, and the ban's 429 on /v1/check neither said shadow nor
	// reset_after_ms 0 (RLS answers have neither field).
	all := string(out)
	if !strings.Contains(all, "sluice admin: using the bootstrap token in data/admin.token") {
		t.Errorf("sluice admin did not say it used ./data/admin.token:\n%s", all)
	}
	for i, c := range run {
		top, _, _ := strings.Cut(outputs[i], `"results"`) // the top-level fields
		if c.want == 429 && strings.Contains(c.text, "/v1/check") && (!strings.Contains(top, `"shadow":false`) || strings.Contains(top, `"reset_after_ms":0,`)) {
			t.Errorf("README.md:%d: the denial's answer: %s", c.line, outputs[i])
		}
	}
}

func scan(l, format string, args ...any) bool {
	n, err := fmt.Sscanf(l, format, args...)
	return err == nil && n == len(args)
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// TestCheckOverGRPC: `sluice check --grpc` (what the README shows instead of grpcurl) asks
// sluice.v1 and, with --domain, Envoy's ShouldRateLimit, and exits 2 on a denial as the HTTP
// form does.
func TestCheckOverGRPC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "native.yaml"), nativePolicy)
	writeFile(t, filepath.Join(dir, "envoy.yaml"), envoyPolicy)
	s := start(t, dir, filepath.Join(dir, "data"))
	check := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"check", "--grpc", "--grpc-server", s.grpc}, args...)...)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	for i, c := range []struct {
		args   []string
		code   int
		prefix string
		holds  string
	}{
		{[]string{"--tenant", "acme", "--user", "gia", "--cost", "5"}, 0, "ALLOWED (gRPC ", `"remaining": "0"`},
		{[]string{"--tenant", "acme", "--user", "gia"}, 2, "DENIED (gRPC ", `"rule": "per-user"`},
		{[]string{"--tenant", "acme", "--user", "gia", "--quota"}, 0, "ALLOWED (gRPC ", `"remaining": "0"`},
		{[]string{"--domain", "edge", "--descriptor", "remote_address=192.0.2.9", "--cost", "2"}, 0, "ALLOWED (gRPC ", `"overall_code": "OK"`},
		{[]string{"--domain", "edge", "--descriptor", "remote_address=192.0.2.9"}, 2, "DENIED (gRPC ", `"overall_code": "OVER_LIMIT"`},
		{[]string{"--domain", "edge", "--user", "gia"}, 1, "sluice: --domain: an Envoy request carries descriptors only", ""},
	} {
		code, out := check(c.args...)
		if code != c.code || !strings.HasPrefix(out, c.prefix) || !strings.Contains(out, c.holds) {
			t.Errorf("call %d, %v: exit %d, want %d with %q...%q:\n%s", i, c.args, code, c.code, c.prefix, c.holds, out)
		}
	}
	cmd := exec.Command(binary, "check", "--domain", "edge")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "add --grpc") {
		t.Errorf("--domain without --grpc: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
}
