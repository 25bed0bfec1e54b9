package metrics

import (
	"net"
	"sync"
)

// limitListener accepts at most max connections open at once: Accept waits
// for one of them to close first, so further clients wait in the kernel's
// backlog instead of each costing the server a goroutine and buffers.
type limitListener struct {
	net.Listener
	slots     chan struct{} // a token per open connection
	closed    chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex
	open, peak int // open connections, and the most at once (for tests)
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.peak = max(l.peak, l.open)
	l.mu.Unlock()
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *limitListener) counts() (open, peak int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.peak
}

// limitedConn gives its slot back on its first Close.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}
