// Package testproxy is a loopback TCP proxy whose traffic tests can delay or drop, to make a
// real server slow or silent without touching it.
package testproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections from Addr to an upstream address.
type Proxy struct {
	Addr     string
	upstream string
	ln       net.Listener
	delay    atomic.Int64 // ns added before each chunk is forwarded
	drop     atomic.Bool  // swallow traffic, answer nothing
	mu       sync.Mutex
	conns    []net.Conn
}

// Start proxies a free 127.0.0.1 port to upstream until the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

// Delay makes every chunk wait d before it is forwarded (0 for none).
func (p *Proxy) Delay(d time.Duration) { p.delay.Store(int64(d)) }

// Blackhole makes the proxy swallow all traffic (true) or forward it again (false).
func (p *Proxy) Blackhole(on bool) { p.drop.Store(on) }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.drop.Load() {
			if d := p.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
