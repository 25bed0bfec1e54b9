package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/mesh"
)

// ErrClosed is returned by Connect on a Transport that is closed or closing.
var ErrClosed = errors.New("tcp: transport closed")

// Transport is a TCP endpoint that connects worlds. It implements
// transport.Transport.
type Transport struct {
	cfg  Config
	ln   *net.TCPListener
	addr string
	log  *slog.Logger
	mesh *mesh.Connector
	wg   sync.WaitGroup // the accept loop and every connection goroutine
	// bufGranted: the kernel gives sockets buffers of defaultSocketBuffer
	// bytes (asked once, when SocketBuffer is left at its default).
	bufGranted bool
	// mixed: worlds that mix this transport's links with other kinds
	// (MixedWorlds); its links then suggest no chunk.
	mixed atomic.Bool
}

var _ transport.Transport = (*Transport)(nil)

// MixedWorlds says that this transport's links may share worlds with links
// of other transports, as a shared-memory transport's bootstrap and
// fallback do (one host's pairs on shared memory, others on TCP): its links
// then suggest no chunk (transport.ChunkHinter), since ranks that see
// different mixes of links could choose different chunks. Called before
// the first Connect.
func (t *Transport) MixedWorlds() { t.mixed.Store(true) }

// Listen starts a transport listening on cfg.ListenAddr.
func Listen(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Accepted sockets inherit the listener's buffer sizes, which must be set
	// before the handshake so the window scale is negotiated for them.
	lc := net.ListenConfig{Control: cfg.socketControl}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w", cfg.ListenAddr, err)
	}
	t := &Transport{
		cfg:        cfg,
		ln:         ln.(*net.TCPListener),
		addr:       cfg.AdvertiseAddr,
		log:        cfg.Logger,
		bufGranted: cfg.SocketBuffer == 0 && kernelGrants(defaultSocketBuffer),
	}
	t.mesh = mesh.New(mesh.Config{
		Name:                "tcp",
		Secret:              cfg.Secret,
		Security:            cfg.Security,
		HandshakesPerSource: cfg.HandshakesPerSource,
		HandshakeTimeout:    cfg.HandshakeTimeout,
		DialRetry:           cfg.DialRetry,
		Logger:              cfg.Logger,
		ErrClosed:           ErrClosed,
		Dial:                t.dial,
	})
	t.addr = mesh.AdvertiseAddr(cfg.AdvertiseAddr, ln.Addr())
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Addr is the address peers dial to reach this transport.
func (t *Transport) Addr() string { return t.addr }

// Close stops listening, drops connections that are still handshaking or
// parked, makes pending Connect calls fail with ErrClosed and waits for the
// transport's goroutines to end. Links already returned stay usable.
func (t *Transport) Close() error {
	if !t.mesh.Close() {
		return nil
	}
	err := t.ln.Close()
	t.wg.Wait()
	return err
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.ln.AcceptTCP()
		if err != nil {
			select {
			case <-t.mesh.Done():
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off rather than spin.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("gorovod tcp: accept failed", "err", err, "retry_in", delay)
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-t.mesh.Done():
				timer.Stop()
				return
			}
			continue
		}
		delay = 0
		if !t.mesh.Admit(c.RemoteAddr().String()) {
			t.log.Warn("gorovod tcp: dropping connection: too many handshakes in progress (from its host or in all)", "remote", c.RemoteAddr())
			c.Close()
			continue
		}
		t.wg.Add(1)
		go t.serveConn(c)
	}
}

func (t *Transport) serveConn(c *net.TCPConn) {
	defer t.wg.Done()
	remote := c.RemoteAddr().String()
	setupConn(c)
	// Everything the acceptor reads (hello and proof) shares one short
	// timeout, so a stranger that trickles bytes costs no more than one that
	// sends nothing, and its slot is free again within PreAuthTimeout.
	hc := &handshakeConn{conn: c, cfg: &t.cfg, readBy: time.Now().Add(t.cfg.PreAuthTimeout)}
	if a := t.mesh.Accept(hc, remote); a != nil {
		t.mesh.Route(a)
	}
}

// dial opens a connection for the dialer's side of the handshake.
func (t *Transport) dial(ctx context.Context, addr string) (mesh.Conn, error) {
	d := net.Dialer{Timeout: t.cfg.HandshakeTimeout, Control: t.cfg.socketControl}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*net.TCPConn)
	setupConn(c)
	// Each message gets its own timeout, but no later than ctx's deadline.
	dl, _ := ctx.Deadline()
	return &handshakeConn{conn: c, cfg: &t.cfg, readBy: dl, writeBy: dl}, nil
}

func setupConn(c *net.TCPConn) {
	// Collectives send a frame and wait for an answer; Nagle would hold the frame.
	_ = c.SetNoDelay(true)
}

// handshakeConn is a TCP connection while package mesh runs the handshake on
// it. Every message gets a fresh HandshakeTimeout, capped by readBy or
// writeBy when set. Writes are never capped on the accepting side: its
// verdict may go out long after the handshake, once Connect claims the
// connection.
type handshakeConn struct {
	conn            *net.TCPConn
	cfg             *Config
	readBy, writeBy time.Time
}

func (c *handshakeConn) deadline(by time.Time) time.Time {
	dl := time.Now().Add(c.cfg.HandshakeTimeout)
	if !by.IsZero() && by.Before(dl) {
		dl = by
	}
	return dl
}

func (c *handshakeConn) ReadMsg(b []byte) error {
	_ = c.conn.SetReadDeadline(c.deadline(c.readBy))
	_, err := io.ReadFull(c.conn, b)
	return err
}

// WriteMsg ignores settle: closing a TCP connection still delivers what was
// written.
func (c *handshakeConn) WriteMsg(b []byte, settle bool) error {
	_ = c.conn.SetWriteDeadline(c.deadline(c.writeBy))
	_, err := c.conn.Write(b)
	return err
}

// SameHost reports whether the connection's two ends are on this host
// (mesh.HostAware), as link.sameHost does.
func (c *handshakeConn) SameHost() bool { return sameHostConn(c.conn) }

func (c *handshakeConn) Interrupt() { c.conn.Close() }
func (c *handshakeConn) Close()     { c.conn.Close() }

// Lanes is how many connections the link this connection opens is to have
// (mesh.LaneConn): Config.Lanes, or when that is 0, one to a peer on this
// host and autoLanes to a peer on another.
func (c *handshakeConn) Lanes() int { return lanesFor(c.cfg.Lanes, c.SameHost()) }

// lanesFor is the lanes of a link: configured (Config.Lanes) when set,
// else one to a peer on this host and autoLanes to one on another, of
// which the link's senders use as many as they measure to help.
func lanesFor(configured int, sameHost bool) int {
	switch {
	case configured > 0:
		return configured
	case sameHost:
		return 1
	}
	return autoLanes
}

// LinkLanes makes the link over lanes, connections of the same peer that
// each passed the handshake (mesh.LaneConn).
func (c *handshakeConn) LinkLanes(lanes []mesh.Conn, keys []framesec.Keys, peer int, addr string, job, epoch uint64, self int) transport.Link {
	ls := make([]*link, len(lanes))
	for i, lc := range lanes {
		hc := lc.(*handshakeConn)
		_ = hc.conn.SetDeadline(time.Time{})
		ls[i] = newLink(hc.conn, peer, addr, job, epoch, self, c.cfg, keys[i])
	}
	l := newLanedLink(ls, c.cfg.Lanes == 0)
	log := c.cfg.Logger
	l.settled = func(lanes int, rates []float64) {
		log.Debug("gorovod tcp: lanes chosen", "peer", l.Peer(), "lanes", lanes, "of", len(ls), "rates_MBps", laneRates(rates))
	}
	return l
}

func (c *handshakeConn) Link(peer int, addr string, job, epoch uint64, self int, keys framesec.Keys) transport.Link {
	_ = c.conn.SetDeadline(time.Time{})
	return newLink(c.conn, peer, addr, job, epoch, self, c.cfg, keys)
}

// laneRates formats the rates a link measured at each lane count it
// tried, "count:MB/s" separated by spaces.
func laneRates(rates []float64) string {
	var b []byte
	for n, r := range rates {
		if r == 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, ':')
		b = strconv.AppendFloat(b, r/1e6, 'f', 0, 64)
	}
	return string(b)
}
