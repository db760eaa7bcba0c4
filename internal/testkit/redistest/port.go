package redistest

import (
	"errors"
	"net"
	"sync"
)

// clusterBusOffset is where Redis puts a cluster node's bus port: client port + 10000.
const clusterBusOffset = 10000

// reserved holds ports handed out in this process and not yet released. The kernel may give
// the same free port to two parallel tests between probe and bind; this set stops that among
// our own servers (other processes are handled by retrying in Start).
var (
	reservedMu sync.Mutex
	reserved   = map[int]bool{}
)

// freePort returns a 127.0.0.1 port nothing listens on, found by letting the kernel pick one.
// For a cluster node the bus port (port+10000) must fit below 65536 and be free as well.
func freePort(cluster bool) (int, error) {
	reservedMu.Lock()
	defer reservedMu.Unlock()
	// The ephemeral range (often 32768-60999) puts roughly a fifth of picks above 55535, so
	// a cluster node needs a few tries; 200 is far more than chance requires.
	for range 200 {
		port, err := probe(0)
		if err != nil {
			return 0, err
		}
		if reserved[port] {
			continue
		}
		if cluster {
			bus := port + clusterBusOffset
			if bus > 65535 || reserved[bus] {
				continue
			}
			if _, err := probe(bus); err != nil {
				continue
			}
			reserved[bus] = true
		}
		reserved[port] = true
		return port, nil
	}
	return 0, errors.New("no free loopback port found")
}

// probe listens on 127.0.0.1:port (0 for any) and closes again, returning the port.
func probe(port int) (int, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// release returns port (and its bus port) to the pool once its server is gone.
func release(port int, cluster bool) {
	if port == 0 {
		return
	}
	reservedMu.Lock()
	defer reservedMu.Unlock()
	delete(reserved, port)
	if cluster {
		delete(reserved, port+clusterBusOffset)
	}
}
