package node

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// testConfig parses args as `sluice serve` would, on loopback ports the kernel picks and a
// data folder of the test's own.
func testConfig(t *testing.T, args ...string) Config {
	t.Helper()
	cmd := &cobra.Command{Use: "serve"}
	c := Config{Version: "test"}
	c.RegisterFlags(cmd)
	base := []string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"), "--log-level", "error"}
	if err := cmd.Flags().Parse(append(base, args...)); err != nil {
		t.Fatal(err)
	}
	if err := c.ReadEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNodeInProcess starts a whole node through the composition root, decides a request over
// HTTP, drains it and closes it; a second node then takes the same data folder, which holds
// only while the first's lock is released.
func TestNodeInProcess(t *testing.T) {
	c := testConfig(t)
	n, err := New(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	resp, err := http.Post("http://"+n.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"tenant":"acme","user":"alice"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("check: %d, want 200", resp.StatusCode)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := http.Get("http://" + n.HTTPAddr() + "/healthz"); err == nil {
		t.Error("the HTTP listener still answers after Close")
	}
	again, err := New(t.Context(), c)
	if err != nil {
		t.Fatalf("a node on the same data folder after Close: %v", err)
	}
	again.Close()
}

// TestNewUnwindsOnError: when a part fails (the gRPC address is taken), New closes what it
// built before: the HTTP listener is free again and the data folder unlocked.
func TestNewUnwindsOnError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := free.Addr().String()
	free.Close()
	c := testConfig(t, "--http", httpAddr, "--grpc", taken.Addr().String())
	if _, err := New(t.Context(), c); err == nil || !strings.Contains(err.Error(), "--grpc") {
		t.Fatalf("New with a taken gRPC address: %v, want an error naming --grpc", err)
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		t.Fatalf("the HTTP listener was left open: %v", err)
	}
	ln.Close()
	c = testConfig(t, "--http", httpAddr, "--data-dir", c.dataDir)
	n, err := New(t.Context(), c)
	if err != nil {
		t.Fatalf("the data folder stayed locked: %v", err)
	}
	if err := n.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Errorf("Close without Run: %v", err)
	}
}

// TestGRPCClosesSilentConnections: a connection to the gRPC port that never starts its
// handshake is closed, as the HTTP listener closes one that sends no headers. The bound leaves
// a loaded machine room; handshakeTimeout is the figure.
func TestGRPCClosesSilentConnections(t *testing.T) {
	n, err := New(t.Context(), testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() { cancel(); <-ran; n.Close() }()
	conn, err := net.Dial("tcp", n.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(handshakeTimeout + 25*time.Second))
	buf := make([]byte, 64)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("a silent connection was still open after %s", handshakeTimeout+25*time.Second)
			}
			return // closed by the server
		}
	}
}

// TestAdminHTTP: with --admin-http the admin API and the dashboard answer on their own
// listener and not on --http, which keeps the data plane's API.
func TestAdminHTTP(t *testing.T) {
	n, err := New(t.Context(), testConfig(t, "--admin-http", "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() { cancel(); <-ran; n.Close() }()
	status := func(method, addr, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	admin, data := n.AdminHTTPAddr(), n.HTTPAddr()
	for _, tc := range []struct {
		name, method, addr, path, body string
		want                           int
	}{
		{"admin API on the admin port", "GET", admin, "/admin/v1/openapi.json", "", 200},
		{"dashboard on the admin port", "GET", admin, "/ui/", "", 200},
		{"no admin API on the data port", "GET", data, "/admin/v1/openapi.json", "", 404},
		{"no dashboard on the data port", "GET", data, "/ui/", "", 404},
		{"checks on the data port", "POST", data, "/v1/check", `{"user":"u"}`, 200},
		{"no checks on the admin port", "POST", admin, "/v1/check", `{"user":"u"}`, 404},
	} {
		if got := status(tc.method, tc.addr, tc.path, tc.body); got != tc.want {
			t.Errorf("%s: %s %s answered %d, want %d", tc.name, tc.method, tc.path, got, tc.want)
		}
	}
}

func TestParsePrefixes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{"", nil, false},
		{"10.0.0.0/8, 192.0.2.7", []string{"10.0.0.0/8", "192.0.2.7/32"}, false},
		{"2001:db8::1/64,::ffff:192.0.2.8", []string{"2001:db8::/64", "192.0.2.8/32"}, false},
		{"10.0.0.0/33", nil, true},
		{"lb.internal", nil, true},
	} {
		got, err := parsePrefixes("--trusted-proxies", tc.in)
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), "--trusted-proxies") {
				t.Errorf("%q: %v, %v; want an error naming the flag", tc.in, got, err)
			}
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		if err != nil || strings.Join(s, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%q: %v, %v; want %v", tc.in, s, err, tc.want)
		}
	}
}

// TestGRPCReflectionSwitch: reflection is served by default and not with
// --grpc-reflection=false.
func TestGRPCReflectionSwitch(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want codes.Code
	}{
		{nil, codes.OK},
		{[]string{"--grpc-reflection=false"}, codes.Unimplemented},
	} {
		n, err := New(t.Context(), testConfig(t, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- n.Run(ctx) }()
		conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(t.Context(), 30*time.Second)
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(cctx)
		if err == nil {
			err = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		}
		if err == nil || errors.Is(err, io.EOF) {
			_, err = stream.Recv() // a Send the server already ended says io.EOF; Recv has the status
		}
		if got := status.Code(err); got != tc.want {
			t.Errorf("%v: reflection answered %v (%v), want %v", tc.args, got, err, tc.want)
		}
		ccancel()
		conn.Close()
		cancel()
		<-ran
		n.Close()
	}
}
