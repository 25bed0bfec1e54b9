package inproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/mesh"
)

// ErrClosed is returned by Connect on a Transport that is closed or closing.
var ErrClosed = errors.New("inproc: transport closed")

// errRefused is a dial to an address where no transport listens.
var errRefused = errors.New("inproc: nothing listens at that address")

// Network is the in-process network Transports listen on: they reach each
// other by the addresses it hands out. Transports on different Networks never
// meet.
type Network struct {
	mu        sync.Mutex
	next      int
	listeners map[string]*Transport
}

// NewNetwork returns an empty network.
func NewNetwork() *Network { return &Network{listeners: map[string]*Transport{}} }

// Listen starts a transport on the network, at a fresh address.
func (n *Network) Listen(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(cfg.Secret) == 0 {
		return nil, fmt.Errorf("%w: Secret is required", ErrInvalidConfig)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	t := &Transport{net: n, cfg: cfg, addr: fmt.Sprintf("inproc:%d", n.next)}
	t.mesh = mesh.New(mesh.Config{
		Name:   "inproc",
		Secret: cfg.Secret,
		// Frames never leave the process: there is no path to protect.
		Security:         transport.SecurityPlain,
		HandshakeTimeout: cfg.HandshakeTimeout,
		DialRetry:        cfg.DialRetry,
		Logger:           cfg.Logger,
		ErrClosed:        ErrClosed,
		Dial:             t.dial,
	})
	n.listeners[t.addr] = t
	return t, nil
}

func (n *Network) lookup(addr string) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listeners[addr]
}

func (n *Network) remove(t *Transport) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listeners[t.addr] == t {
		delete(n.listeners, t.addr)
	}
}

// Transport is one endpoint on a Network. It implements transport.Transport.
type Transport struct {
	net  *Network
	cfg  Config
	addr string
	mesh *mesh.Connector
	wg   sync.WaitGroup // the goroutines serving arriving connections
}

var _ transport.Transport = (*Transport)(nil)

// Addr is the address peers dial to reach this transport.
func (t *Transport) Addr() string { return t.addr }

// Connect connects this endpoint to every other rank of w, with the same
// handshake, checks and errors as the TCP transport (see tcp.Transport.Connect).
func (t *Transport) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	return t.mesh.Connect(ctx, w)
}

// Close leaves the network, drops connections still handshaking, makes
// pending Connect calls fail with ErrClosed and waits for the transport's
// goroutines to end. Links already returned stay usable.
func (t *Transport) Close() error {
	if !t.mesh.Close() {
		return nil
	}
	t.net.remove(t)
	t.wg.Wait()
	return nil
}

// dial opens an in-memory connection to the transport at addr for the
// dialer's side of the handshake, and serves the other side there.
func (t *Transport) dial(ctx context.Context, addr string) (mesh.Conn, error) {
	peer := t.net.lookup(addr)
	if peer == nil {
		return nil, errRefused
	}
	if !peer.mesh.Admit(t.addr) {
		return nil, errRefused // closing, or too many handshakes
	}
	c := newConnPair(t.cfg.BufferBytes, t.addr, addr)
	dl, _ := ctx.Deadline()
	dialer := &conn{c: c, side: 0, cfg: &t.cfg, by: dl}
	acceptor := &conn{c: c, side: 1, cfg: &peer.cfg, by: time.Now().Add(peer.cfg.HandshakeTimeout)}
	peer.wg.Go(func() {
		if a := peer.mesh.Accept(acceptor, t.addr); a != nil {
			peer.mesh.Route(a)
		}
	})
	return dialer, nil
}

// connPair is an in-memory connection: the handshake messages each way, and
// the frame queues its links use once it is authenticated.
type connPair struct {
	msgs   [2]chan []byte // msgs[s]: messages to side s
	closed [2]*end        // closed[s]: side s closed or was interrupted
	frames *pair          // side 0 is the pair's a
	addrs  [2]string      // each side's own address
}

func newConnPair(bufferBytes int, dialerAddr, acceptorAddr string) *connPair {
	// Each side sends at most two handshake messages: writes never wait.
	return &connPair{
		msgs:   [2]chan []byte{make(chan []byte, 4), make(chan []byte, 4)},
		closed: [2]*end{newEnd(), newEnd()},
		frames: newPair(bufferBytes),
		addrs:  [2]string{dialerAddr, acceptorAddr},
	}
}

// conn is one side of a connPair while package mesh runs the handshake on it.
type conn struct {
	c    *connPair
	side int
	cfg  *Config
	by   time.Time // no message waits past it (zero: no bound)
}

var errConnClosed = errors.New("inproc: connection closed")

// ReadMsg waits for the next message, up to a handshake timeout (capped by
// the connection's bound).
func (c *conn) ReadMsg(b []byte) error {
	dl := time.Now().Add(c.cfg.HandshakeTimeout)
	if !c.by.IsZero() && c.by.Before(dl) {
		dl = c.by
	}
	timer := time.NewTimer(time.Until(dl))
	defer timer.Stop()
	take := func(m []byte) error {
		if len(m) != len(b) {
			return fmt.Errorf("inproc: handshake message of %d bytes, want %d", len(m), len(b))
		}
		copy(b, m)
		return nil
	}
	select {
	case m := <-c.c.msgs[c.side]:
		return take(m)
	case <-c.c.closed[c.side].closed:
		return errConnClosed
	case <-c.c.closed[1-c.side].closed:
		// The peer may have written its last message before closing.
		select {
		case m := <-c.c.msgs[c.side]:
			return take(m)
		default:
			return errConnClosed
		}
	case <-timer.C:
		return fmt.Errorf("inproc: handshake message: %w", context.DeadlineExceeded)
	}
}

// WriteMsg queues a message for the other side; it never waits.
func (c *conn) WriteMsg(b []byte, settle bool) error {
	if c.c.closed[c.side].isClosed() || c.c.closed[1-c.side].isClosed() {
		return errConnClosed
	}
	select {
	case c.c.msgs[1-c.side] <- append([]byte(nil), b...):
		return nil
	default:
		return errors.New("inproc: too many handshake messages")
	}
}

func (c *conn) Interrupt() { c.c.closed[c.side].close() }

// Close closes this side; the links made from the connection are not
// affected (Link is called instead of Close once it is authenticated).
func (c *conn) Close() { c.c.closed[c.side].close() }

func (c *conn) Link(peer int, addr string, job, epoch uint64, self int, _ framesec.Keys) transport.Link {
	if addr == "" {
		addr = c.c.addrs[1-c.side]
	}
	la, lb := c.c.frames.links(0, 0, "", "", job, epoch, c.cfg.IOTimeout)
	l := la
	if c.side == 1 {
		l = lb
	}
	l.rank, l.PeerRank, l.Addr = self, peer, peerAddr(peer, addr)
	return l
}
