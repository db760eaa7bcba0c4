package e2e

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// static is sluice as `make build` builds it (CGO_ENABLED=0: one static binary that runs in a
// scratch or distroless image). The other tests run a -race build, which needs cgo.
var static struct {
	once sync.Once
	path string
	err  error
}

// staticBinary builds the shipped sluice once, for the tests that need it: with `make build`
// where make is installed, so that the Makefile itself is what is tested, else with the same
// command.
func staticBinary(t *testing.T) string {
	t.Helper()
	static.once.Do(func() {
		static.path = filepath.Join(filepath.Dir(binary), "sluice-static")
		build := exec.Command("make", "-C", "..", "build", "BIN="+static.path)
		if _, err := exec.LookPath("make"); err != nil {
			build = exec.Command("go", "build", "-o", static.path, "../cmd/sluice")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		if out, err := build.CombinedOutput(); err != nil {
			static.err = fmt.Errorf("%s: %v\n%s", strings.Join(build.Args, " "), err, out)
		}
	})
	if static.err != nil {
		t.Fatal(static.err)
	}
	return static.path
}

// TestBinaryIsStatic: the build `make build` makes needs no dynamic loader and no shared
// library: no PT_INTERP or PT_DYNAMIC program header, no .interp or .dynamic section.
func TestBinaryIsStatic(t *testing.T) {
	t.Parallel()
	f, err := elf.Open(staticBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("program header %v: the binary is dynamically linked", p.Type)
		}
	}
	for _, name := range []string{".interp", ".dynamic"} {
		if f.Section(name) != nil {
			t.Errorf("section %s: the binary is dynamically linked", name)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
}

// TestDataDirLock: a second serve on a folder in use fails at once, naming the folder and the
// holder's pid, and leaves the first serving; once the first is gone, even killed with
// SIGKILL, the folder is free again. Runs the static build, so it also shows that build serves.
func TestDataDirLock(t *testing.T) {
	t.Parallel()
	bin := staticBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	first := startBin(t, bin, "", dataDir)
	if code, _, _ := first.post("/v1/check", `{"user":"lock"}`); code != 200 {
		t.Fatalf("check on the first: %d", code)
	}

	// A second serve that did not see the lock would serve until killed: the deadline turns
	// that into a failure rather than a hang.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--http", freePort(t), "--grpc", freePort(t), "--data-dir", dataDir).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("second serve on %s was still running after 15 s:\n%s", dataDir, out)
	}
	if err == nil {
		t.Fatalf("second serve on %s exited 0:\n%s", dataDir, out)
	}
	for _, want := range []string{dataDir, fmt.Sprintf("pid %d", first.cmd.Process.Pid), "in use"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("second serve's error does not contain %q:\n%s", want, out)
		}
	}
	if code, _, _ := first.post("/v1/check", `{"user":"lock"}`); code != 200 {
		t.Fatalf("the first stopped serving: %d", code)
	}

	// The kernel drops the lock of a process that dies without cleaning up.
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.exited
	second := startBin(t, bin, "", dataDir)
	if code, _, _ := second.post("/v1/check", `{"user":"lock"}`); code != 200 {
		t.Fatalf("check after the first was killed: %d", code)
	}
	second.stop()
}
