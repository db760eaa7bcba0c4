package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// root is the repository's root, where the Dockerfile is.
const root = ".."

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd   string // upper case: FROM, RUN, ...
	args  string
	stage int // index of the FROM it follows
	line  int
}

// parseDockerfile splits the Dockerfile into instructions. It is enough for the checks below,
// not a full parser (no heredocs, which the file does not use).
func parseDockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out     []instruction
		pending string
		start   int
		stage   = -1
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if pending == "" {
			start = n
		}
		if strings.HasSuffix(line, "\\") {
			pending += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		full := pending + line
		pending = ""
		cmd, args, _ := strings.Cut(full, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{cmd: cmd, args: strings.TrimSpace(args), stage: stage, line: start})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDockerfile holds the Dockerfile to what the issue asks of the image, everywhere, docker
// or not: two stages, the binary built by `make build` (static: CGO_ENABLED=0, which e2e's
// TestBinaryIsStatic checks) with the Go version of go.mod, a distroless static or scratch
// base with no RUN in it (it has no shell), a non-root user, the listeners on every interface
// of the container on the ports it exposes, and a HEALTHCHECK in exec form that runs the
// binary's own probe.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	ins := parseDockerfile(t)
	args := map[string]string{}
	var froms []instruction
	final := map[string][]string{}
	last := -1
	for _, in := range ins {
		if in.cmd == "FROM" {
			froms = append(froms, in)
		}
		last = max(last, in.stage)
	}
	for _, in := range ins {
		switch {
		case in.cmd == "ARG" && in.stage == -1:
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case in.stage == last:
			final[in.cmd] = append(final[in.cmd], in.args)
		}
	}
	if len(froms) != 2 {
		t.Fatalf("%d stages, want 2 (build, then the runtime image)", len(froms))
	}
	expand := func(s string) string {
		return regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(s, func(m string) string { return args[m[2:len(m)-1]] })
	}

	build, _, _ := strings.Cut(expand(froms[0].args), " ")
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}
	if want := "golang:" + string(goVersion[1]); build != want && !strings.HasPrefix(build, want+"-") && !strings.HasPrefix(build, want+".") {
		t.Errorf("build stage FROM %q: want %s, the Go version go.mod asks", build, want)
	}
	if !slices.ContainsFunc(ins, func(in instruction) bool {
		return in.stage == 0 && in.cmd == "RUN" && strings.Contains(in.args, "make build BIN=/out/sluice")
	}) {
		t.Error("the build stage does not build with `make build BIN=/out/sluice`, the static build the e2e tests check")
	}

	base := expand(froms[1].args)
	if !strings.Contains(base, "distroless/static") && base != "scratch" {
		t.Errorf("runtime base %q: want distroless static or scratch", base)
	}
	if len(final["RUN"]) > 0 {
		t.Errorf("RUN in the runtime stage: %q (distroless has no shell to run it)", final["RUN"])
	}
	if !slices.Contains(final["COPY"], "--from=build /out/sluice /sluice") {
		t.Errorf("the runtime stage does not copy the built binary to /sluice: %q", final["COPY"])
	}
	if u := final["USER"]; len(u) != 1 || !regexp.MustCompile(`^[1-9]\d*(:[1-9]\d*)?$`).MatchString(u[0]) {
		t.Errorf("USER %q: want a numeric non-root user (Kubernetes' runAsNonRoot checks a number)", u)
	}
	env := dockerEnv(final["ENV"])
	exposed := strings.Fields(strings.Join(final["EXPOSE"], " "))
	for _, v := range []string{"SLUICE_HTTP", "SLUICE_GRPC"} {
		host, port, err := net.SplitHostPort(env[v])
		if err != nil || host != "0.0.0.0" || !slices.Contains(exposed, port) {
			t.Errorf("ENV %s=%q: want 0.0.0.0 and a port EXPOSE names (%q)", v, env[v], exposed)
		}
	}
	if !slices.Equal(exposed, []string{"8080", "8081"}) {
		t.Errorf("EXPOSE %q, want 8080 8081 (the chart's container ports)", exposed)
	}
	if env["SLUICE_DATA_DIR"] == "" {
		t.Error("no SLUICE_DATA_DIR: the default, ./data, is not writable by the user in a distroless root")
	}
	if got := healthcheck(t, final["HEALTHCHECK"]); !slices.Equal(got, []string{"/sluice", "health"}) {
		t.Errorf("HEALTHCHECK runs %q, want [/sluice health]", got)
	}
	if e := final["ENTRYPOINT"]; len(e) != 1 || e[0] != `["/sluice"]` {
		t.Errorf("ENTRYPOINT %q, want [\"/sluice\"]", e)
	}
	if c := final["CMD"]; len(c) != 1 || c[0] != `["serve"]` {
		t.Errorf("CMD %q, want [\"serve\"]", c)
	}
}

// dockerEnv reads ENV instructions of the form K=V K2=V2.
func dockerEnv(envs []string) map[string]string {
	out := map[string]string{}
	for _, e := range envs {
		for _, kv := range strings.Fields(e) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				out[k] = strings.Trim(v, `"`)
			}
		}
	}
	return out
}

// healthcheck returns the command of the one HEALTHCHECK, which must be in exec form: distroless
// has no /bin/sh for the shell form.
func healthcheck(t *testing.T, hc []string) []string {
	t.Helper()
	if len(hc) != 1 {
		t.Fatalf("%d HEALTHCHECK instructions, want 1", len(hc))
	}
	_, cmd, ok := strings.Cut(hc[0], "CMD ")
	var argv []string
	if !ok || json.Unmarshal([]byte(cmd), &argv) != nil {
		t.Fatalf("HEALTHCHECK %q: want CMD [\"...\"] (exec form)", hc[0])
	}
	return argv
}

// TestDockerignoreKeepsTheBuild: the build context keeps every file the image's build reads
// (the Go and embedded files of every package of ./cmd/sluice, go.mod, go.sum, the Makefile),
// by .dockerignore's own rules as Docker applies them (moby's patternmatcher).
func TestDockerignoreKeepsTheBuild(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`, "./cmd/sluice")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	needed := []string{"go.mod", "go.sum", "Makefile"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rel, err := filepath.Rel(abs, fields[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a dependency from the module cache, not from the context
		}
		for _, name := range fields[1:] {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, name)))
		}
	}
	if len(needed) < 20 {
		t.Fatalf("only %d files found for the build: %q", len(needed), needed)
	}
	for _, name := range needed {
		if ignored, err := pm.MatchesOrParentMatches(name); err != nil || ignored {
			t.Errorf("%s is needed by the build but .dockerignore leaves it out (%v)", name, err)
		}
	}
	for _, name := range []string{".git/HEAD", "deploy/go.mod", "bin/sluice", "data/memory.snapshot", "store/redis/redis_test.go"} {
		if ignored, _ := pm.MatchesOrParentMatches(name); !ignored {
			t.Errorf("%s is sent with the build context", name)
		}
	}
}

// binDir holds the binaries the tests build; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// staticBinary is sluice as the image's build stage builds it (`make build`), made once.
var staticBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-deploy-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "sluice")
	cmd := exec.Command("make", "-C", root, "build", "BIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make build: %v\n%s", err, out)
	}
	return bin, nil
})

// TestHealthcheckProbesTheServer runs the Dockerfile's HEALTHCHECK command, with the image's
// environment, beside a real `sluice serve` built as the image builds it: healthy (exit 0)
// while it serves, unhealthy (exit 1) once it is gone. The server listens on loopback; the
// probe is given the image's wildcard SLUICE_HTTP, which it asks on loopback.
func TestHealthcheckProbesTheServer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	bin, err := staticBinary()
	if err != nil {
		t.Fatal(err)
	}
	var final []string
	var finalEnv []string
	ins := parseDockerfile(t)
	for _, in := range ins {
		if in.stage == ins[len(ins)-1].stage {
			switch in.cmd {
			case "HEALTHCHECK":
				final = append(final, in.args)
			case "ENV":
				finalEnv = append(finalEnv, in.args)
			}
		}
	}
	argv := healthcheck(t, final)
	argv[0] = bin // /sluice in the image
	imageEnv := dockerEnv(finalEnv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	grpc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := grpc.Addr().String()
	grpc.Close()

	srv := exec.Command(bin, "serve")
	srv.Env = append(os.Environ(), "SLUICE_HTTP="+addr, "SLUICE_GRPC="+grpcAddr, "SLUICE_DATA_DIR="+t.TempDir())
	var log bytes.Buffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		if srv.ProcessState == nil {
			srv.Process.Kill()
			<-exited
		}
	})

	probe := func() (int, string) {
		cmd := exec.Command(argv[0], argv[1:]...)
		// The image's environment, its port moved to the test server's.
		cmd.Env = append(os.Environ(), "SLUICE_HTTP="+strings.Replace(imageEnv["SLUICE_HTTP"], ":8080", ":"+port, 1))
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, out := probe()
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never became healthy: exit %d %s\n%s", code, out, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	srv.Process.Signal(os.Interrupt)
	<-exited
	if code, out := probe(); code != 1 {
		t.Fatalf("with the server gone: exit %d %s, want 1", code, out)
	}
}

// TestMakeImageWithoutDocker: `make image` says plainly what is missing: the docker client, or
// an engine that answers. The second case puts a docker client on PATH whose engine is not
// there, as on machines with only the client installed.
func TestMakeImageWithoutDocker(t *testing.T) {
	t.Parallel()
	makePath, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not installed")
	}
	noEngine := t.TempDir()
	script := "#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(noEngine, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, path, want string }{
		{"no docker client", t.TempDir(), "make image: docker is not installed"},
		{"no engine", noEngine, "make image: no Docker engine answers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(makePath, "-C", root, "image", "VERSION=test")
			cmd.Env = append(os.Environ(), "PATH="+tc.path)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("make image: %v\n%s\nwant a failure saying %q", err, out, tc.want)
			}
		})
	}
}

// TestImage builds the image with `make image` and runs it as Kubernetes would (read-only root,
// the data folder a tmpfs): it serves, decides, reports healthy through its HEALTHCHECK, runs
// as the non-root user and prints the version it was built with. It needs a Docker engine and
// the base images; without an engine it is skipped, saying so.
func TestImage(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine here (`docker info`: %v: %s); the image is built and run where one answers", err, lastLine(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	docker := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	image := fmt.Sprintf("sluice-test:%d", time.Now().UnixNano())
	if out, err := exec.CommandContext(ctx, "make", "-C", root, "image", "IMAGE="+image, "VERSION=test-image").CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", image).Run() })

	var cfg struct {
		User         string
		ExposedPorts map[string]any
		Healthcheck  struct{ Test []string }
	}
	if err := json.Unmarshal([]byte(docker("image", "inspect", "--format", "{{json .Config}}", image)), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.User)
	}
	for _, p := range []string{"8080/tcp", "8081/tcp"} {
		if _, ok := cfg.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed: %v", p, cfg.ExposedPorts)
		}
	}
	if !slices.Equal(cfg.Healthcheck.Test, []string{"CMD", "/sluice", "health"}) {
		t.Errorf("health check %q", cfg.Healthcheck.Test)
	}
	if v := docker("run", "--rm", image, "version"); v != "sluice test-image" {
		t.Errorf("version %q, want \"sluice test-image\"", v)
	}

	id := docker("run", "-d", "--read-only", "--tmpfs", "/var/lib/sluice:uid=65532,gid=65532",
		"-p", "127.0.0.1::8080", "-p", "127.0.0.1::8081", image)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", id).CombinedOutput()
			t.Logf("container log:\n%s", out)
		}
		exec.Command("docker", "rm", "-f", id).Run()
	})
	hostPort := docker("port", id, "8080/tcp")
	base := "http://" + firstLine([]byte(hostPort))

	// The health check runs every 10 s after a 10 s start period: healthy within a minute.
	deadline := time.Now().Add(90 * time.Second)
	for docker("inspect", "--format", "{{.State.Health.Status}}", id) != "healthy" {
		if time.Now().After(deadline) {
			t.Fatalf("not healthy: %s", docker("inspect", "--format", "{{json .State.Health}}", id))
		}
		time.Sleep(time.Second)
	}
	resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"user": "alice"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /v1/check: %s", resp.Status)
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
