package tcp_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// pathProxy stands between a dialing rank and the rank it dials, on real
// loopback sockets: it plays whoever controls the path between two hosts.
// Each connection the dialer opens is matched by one to target; what the
// target sends goes back untouched, what the dialer sends goes through
// forward, which the proxies of the tests below differ in.
type pathProxy struct {
	ln     net.Listener
	target string
	// forward copies the dialer's bytes (client) to the target (server)
	// until either side ends; the proxy closes server after it.
	forward func(client, server net.Conn)
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	last    net.Conn // the last connection to the target
	closed  bool
}

// newPathProxy listens on loopback and forwards to target until the test
// ends.
func newPathProxy(t *testing.T, target string, forward func(client, server net.Conn)) *pathProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pathProxy{ln: ln, target: target, forward: forward}
	p.wg.Go(p.acceptLoop)
	t.Cleanup(p.close)
	return p
}

func (p *pathProxy) addr() string { return p.ln.Addr().String() }

func (p *pathProxy) acceptLoop() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Go(func() {
			io.Copy(client, server)
			client.Close()
		})
		p.wg.Go(func() {
			defer server.Close()
			p.forward(client, server)
		})
	}
}

// track records a new pair of connections, or closes them once the proxy
// is closed.
func (p *pathProxy) track(client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		client.Close()
		server.Close()
		return false
	}
	p.conns = append(p.conns, client, server)
	p.last = server
	return true
}

// lastToTarget is the proxy's last connection to the target (nil before
// the first).
func (p *pathProxy) lastToTarget() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// cut closes every connection through the proxy; new ones are still
// accepted.
func (p *pathProxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (p *pathProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}
