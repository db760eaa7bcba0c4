package testproxy

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo starts a loopback server that writes back every line it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, r *bufio.Reader, c net.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// TestDelayIsOneWayAndDoesNotAccumulate checks that a delay d adds 2d to a round trip, and
// that messages sent faster than d are not queued behind each other's delays.
func TestDelayIsOneWayAndDoesNotAccumulate(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t))
	p.Delay(50 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if rtt := roundTrip(t, r, c); rtt < 100*time.Millisecond || rtt > 400*time.Millisecond {
		t.Fatalf("round trip %v with 50ms each way", rtt)
	}
	// Ten lines 10ms apart: all back about 100ms after the last was sent, not 10 × 100ms.
	start := time.Now()
	for range 10 {
		if _, err := c.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 10 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took > 600*time.Millisecond {
		t.Fatalf("ten spaced lines took %v: delays accumulate", took)
	}
	if p.Bytes() < 2*(5+10*2) {
		t.Fatalf("Bytes() = %d, want at least %d", p.Bytes(), 2*(5+10*2))
	}
}

// TestCutAndHeal checks that Cut closes open connections and refuses new ones until healed,
// and that SetUpstream moves new connections.
func TestCutAndHeal(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t))
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Cut(true)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a cut connection still reads")
	}
	c2, err := net.Dial("tcp", p.Addr)
	if err == nil {
		c2.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err == nil {
			t.Fatal("a new connection through a cut proxy works")
		}
		c2.Close()
	}
	p.Cut(false)
	p.SetUpstream(echo(t))
	c3, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	roundTrip(t, bufio.NewReader(c3), c3)
}
