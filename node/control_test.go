package node

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestCheckControl(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url string
		ok  bool
	}{
		{"sqlite", true},
		{"", true},
		{"postgres://u:pw@db:5432/sluice", true},
		{"postgresql://db/sluice", true},
		{"mysql://u:pw@db/x", false},
		{"sqlite:/tmp/x.db", false},
	} {
		err := checkControl(c.url)
		if (err == nil) != c.ok {
			t.Errorf("checkControl(%q) = %v", c.url, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("checkControl(%q) shows the password: %v", c.url, err)
		}
	}
}

func TestDurationFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"365d", 365 * 24 * time.Hour, true},
		{"30d", 30 * 24 * time.Hour, true},
		{"12h", 12 * time.Hour, true},
		{"0", 0, false},
		{"-1h", 0, false},
		{"soon", 0, false},
	} {
		var d time.Duration
		err := durationFlag{&d}.Set(c.in)
		if (err == nil) != c.ok || d != c.want {
			t.Errorf("Set(%q) = %v, %v; want %v", c.in, d, err, c.want)
		}
	}
	d := 365 * 24 * time.Hour
	if got := (durationFlag{&d}).String(); got != "365d" {
		t.Errorf("String() = %q", got)
	}
}

func TestNodeID(t *testing.T) {
	t.Parallel()
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	if got := nodeID("edge-1", addr); got != "edge-1" {
		t.Errorf("nodeID(flag) = %q", got)
	}
	if got := nodeID("", addr); !strings.HasSuffix(got, ":8080") || len(got) <= len(":8080") {
		t.Errorf("nodeID() = %q, want hostname:8080", got)
	}
}
