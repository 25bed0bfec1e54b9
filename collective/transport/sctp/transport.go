package sctp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/mesh"
)

// ErrClosed is returned by Connect on a Transport that is closed or closing.
var ErrClosed = errors.New("sctp: transport closed")

// Transport is an SCTP-over-UDP endpoint that connects worlds. It implements
// transport.Transport.
type Transport struct {
	cfg  Config
	ln   *net.UDPConn
	addr string
	log  *slog.Logger
	mesh *mesh.Connector

	base   context.Context    // ends when Close starts
	cancel context.CancelFunc // ends base
	wg     sync.WaitGroup     // the request loop and every association goroutine

	mu       sync.Mutex
	requests map[requestKey]bool // connect requests being answered

	// cookieKey authenticates the cookies this transport hands out
	// (conn.go): random, made at Listen, never sent.
	cookieKey [32]byte
}

type requestKey struct {
	remote string
	nonce  [nonceSize]byte
}

var _ transport.Transport = (*Transport)(nil)

// Listen starts a transport on the UDP address cfg.ListenAddr.
func Listen(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	laddr, err := net.ResolveUDPAddr("udp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("sctp: listen %s: %w", cfg.ListenAddr, err)
	}
	ln, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("sctp: listen %s: %w", cfg.ListenAddr, err)
	}
	t := &Transport{
		cfg:      cfg,
		ln:       ln,
		addr:     cfg.AdvertiseAddr,
		log:      cfg.Logger,
		requests: make(map[requestKey]bool),
	}
	t.mesh = mesh.New(mesh.Config{
		Name:             "sctp",
		Secret:           cfg.Secret,
		Security:         cfg.Security,
		HandshakeTimeout: cfg.HandshakeTimeout,
		DialRetry:        cfg.DialRetry,
		Logger:           cfg.Logger,
		ErrClosed:        ErrClosed,
		Dial:             t.dial,
	})
	if _, err := rand.Read(t.cookieKey[:]); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("sctp: cookie key: %w", err)
	}
	t.addr = mesh.AdvertiseAddr(cfg.AdvertiseAddr, ln.LocalAddr())
	t.base, t.cancel = context.WithCancel(context.Background())
	t.wg.Add(1)
	go t.requestLoop()
	return t, nil
}

// Addr is the address peers send connect requests to.
func (t *Transport) Addr() string { return t.addr }

// Close stops listening, drops associations that are still handshaking or
// parked, makes pending Connect calls fail with ErrClosed and waits for the
// transport's goroutines to end. Links already returned stay usable.
func (t *Transport) Close() error {
	if !t.mesh.Close() {
		return nil
	}
	t.cancel()
	err := t.ln.Close()
	t.wg.Wait()
	return err
}

// requestLoop answers connect datagrams: a request with a cookie, at once
// and keeping nothing; an echo of a valid cookie with an association, each on
// its own goroutine.
func (t *Transport) requestLoop() {
	defer t.wg.Done()
	var buf, out [datagramSize + 1]byte
	for {
		n, remote, err := t.ln.ReadFromUDP(buf[:])
		if err != nil {
			select {
			case <-t.mesh.Done():
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A datagram error (an ICMP report about an earlier reply): go on.
			continue
		}
		m, err := decodeConnect(buf[:n])
		switch {
		case err != nil:
		case m.typ == udpRequest:
			c := connectMsg{typ: udpCookie, nonce: m.nonce, cookie: t.cookieFor(remote, &m.nonce, uint32(time.Now().Unix()))}
			c.encode(out[:])
			_, _ = t.ln.WriteToUDP(out[:datagramSize], remote)
			continue
		case m.typ != udpEcho:
			err = fmt.Errorf("connect datagram of type %d sent to the listening address", m.typ)
		case !t.validCookie(remote, &m.nonce, &m.cookie, time.Now()):
			err = errors.New("a connect echo with an invalid or expired cookie")
		}
		if err != nil {
			t.log.Debug("gorovod sctp: ignoring a datagram", "remote", remote, "err", err)
			continue
		}
		key := requestKey{remote.String(), m.nonce}
		// Only this loop adds requests, so one found absent stays absent
		// until it is added below.
		t.mu.Lock()
		resent := t.requests[key]
		t.mu.Unlock()
		if resent {
			// The reply is on its way or lost; the dialer resends until the
			// association starts, which answers it.
			continue
		}
		if !t.mesh.Admit(remote.String()) {
			select {
			case <-t.mesh.Done():
				return
			default:
			}
			t.log.Warn("gorovod sctp: dropping a connect request: too many handshakes in progress", "remote", remote)
			continue
		}
		t.mu.Lock()
		t.requests[key] = true
		t.mu.Unlock()
		t.wg.Add(1)
		go t.serve(key, remote, m.nonce)
	}
}

// serve sets up the association of a connect request and hands it to the
// mesh for the handshake and routing.
func (t *Transport) serve(key requestKey, remote *net.UDPAddr, nonce [nonceSize]byte) {
	defer t.wg.Done()
	ctx, cancel := context.WithTimeout(t.base, t.cfg.HandshakeTimeout)
	c, err := t.acceptAssoc(ctx, t.ln, remote, &nonce)
	cancel()
	var a *mesh.Arrival
	if err != nil {
		t.log.Debug("gorovod sctp: association not set up", "remote", remote, "err", err)
		t.mesh.Release(remote.String())
	} else {
		a = t.mesh.Accept(&handshakeConn{sconn: c, cfg: &t.cfg}, c.remote)
	}
	t.mu.Lock()
	delete(t.requests, key)
	t.mu.Unlock()
	if a != nil {
		t.mesh.Route(a)
	}
}

// dial sets up an association for the dialer's side of the handshake.
func (t *Transport) dial(ctx context.Context, addr string) (mesh.Conn, error) {
	c, err := t.dialAssoc(ctx, addr)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return nil, err
	}
	// Each message gets its own timeout, but no later than ctx's deadline.
	by, _ := ctx.Deadline()
	return &handshakeConn{sconn: c, cfg: &t.cfg, by: by}, nil
}

// handshakeConn is an association while package mesh runs the handshake on
// stream 0. Every read, and every wait for a last message to be acknowledged,
// gets a fresh HandshakeTimeout, capped by by when set.
type handshakeConn struct {
	*sconn
	cfg *Config
	by  time.Time
}

func (c *handshakeConn) deadline() time.Time {
	dl := time.Now().Add(c.cfg.HandshakeTimeout)
	if !c.by.IsZero() && c.by.Before(dl) {
		dl = c.by
	}
	return dl
}

func (c *handshakeConn) ReadMsg(b []byte) error { return c.readMsg(b, c.deadline()) }

// WriteMsg queues b on the stream; with settle it waits for the
// acknowledgement, since aborting the association would drop what is queued.
func (c *handshakeConn) WriteMsg(b []byte, settle bool) error {
	if err := c.writeMsg(b); err != nil {
		return err
	}
	if settle {
		c.flush(c.deadline())
	}
	return nil
}

// Interrupt closes the socket, which ends whatever the association's
// goroutine waits for; that goroutine then closes the association itself.
// SameHost reports whether the association's two ends have the same
// address (mesh.HostAware): the default data-plane setting leaves such
// links plain.
func (c *handshakeConn) SameHost() bool {
	la, ok := c.udp.LocalAddr().(*net.UDPAddr)
	host, _, err := net.SplitHostPort(c.remote)
	return ok && err == nil && la.IP.Equal(net.ParseIP(host))
}

func (c *handshakeConn) Interrupt() { _ = c.udp.Close() }
func (c *handshakeConn) Close()     { c.close() }

func (c *handshakeConn) Link(peer int, addr string, job, epoch uint64, self int, keys framesec.Keys) transport.Link {
	return newLink(c.sconn, peer, addr, job, epoch, self, c.cfg, keys)
}
