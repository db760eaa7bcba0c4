// Package testproxy is a loopback TCP proxy whose traffic tests can delay, drop or cut, to
// make a real server slow, silent or unreachable without touching it, and which counts the
// bytes it forwards.
package testproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections from Addr to an upstream address.
type Proxy struct {
	Addr  string
	ln    net.Listener
	delay atomic.Int64 // ns added before each chunk is forwarded
	drop  atomic.Bool  // swallow traffic, answer nothing
	cut   atomic.Bool  // close every connection and refuse new ones
	bytes atomic.Int64 // forwarded, both directions

	mu       sync.Mutex
	upstream string
	conns    map[net.Conn]struct{}
}

// Start proxies a free 127.0.0.1 port to upstream until the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
	})
	return p
}

// Delay makes every chunk be forwarded d after it was read (0 for none): a one-way delay
// that, unlike a sleep per chunk, does not slow a stream down to one chunk per d.
func (p *Proxy) Delay(d time.Duration) { p.delay.Store(int64(d)) }

// Blackhole makes the proxy swallow all traffic (true) or forward it again (false).
func (p *Proxy) Blackhole(on bool) { p.drop.Store(on) }

// Cut closes every connection and refuses new ones (true), as a partition does, or lets
// connections through again (false).
func (p *Proxy) Cut(on bool) {
	p.cut.Store(on)
	if on {
		p.closeAll()
	}
}

// SetUpstream makes new connections go to addr; those open stay where they are.
func (p *Proxy) SetUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// Bytes returns how many bytes the proxy forwarded, both directions.
func (p *Proxy) Bytes() int64 { return p.bytes.Load() }

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		p.mu.Lock()
		upstream := p.upstream
		p.mu.Unlock()
		up, err := net.Dial("tcp", upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// chunk is data read at a time, waiting for its turn to be written.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst: a reader stamps each chunk with when it is due, a writer forwards it
// then, so chunks keep their spacing and each is delayed once.
func (p *Proxy) pipe(dst, src net.Conn) {
	queue := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer dst.Close()
		for c := range queue {
			if wait := time.Until(c.due); wait > 0 {
				time.Sleep(wait)
			}
			p.bytes.Add(int64(len(c.data))) // before the write, so a reader of the reply sees it counted
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer func() {
		close(queue)
		<-done
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.drop.Load() {
			select {
			case queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.delay.Load()))}:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}
