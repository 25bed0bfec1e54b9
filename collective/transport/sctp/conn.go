package sctp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/pion/logging"
	"github.com/pion/sctp"
)

// Connecting takes four datagrams of datagramSize bytes between the dialer's
// socket and the transport's listening address, little-endian:
//
//	 0 magic   uint32 'G','V','S','U'
//	 4 version uint8
//	 5 type    uint8  request, cookie, echo or reply
//	 6 port    uint16 reply: the port of the socket the acceptor made for this
//	                  dialer (same IP); zero in the others
//	 8 nonce   [16]byte chosen by the dialer, the same in all four
//	24 cookie  [16]byte cookie and echo: the acceptor's cookie; zero in the others
//
// request: the dialer asks to connect. cookie: the acceptor answers from its
// listening socket with a cookie (a timestamp and an HMAC, under a key only
// this transport knows, of the dialer's address and port, the nonce and the
// timestamp) and keeps nothing. echo: the dialer sends the cookie back.
// reply: only for a valid, fresh cookie does the acceptor take a handshake
// slot, make a socket connected to the dialer and answer from it with its
// port. So a datagram from a spoofed address costs the acceptor one HMAC and
// one datagram of the same size back (no amplification), never a slot or a
// socket: the cookie goes to the address the datagram claims, and only a
// sender that receives there can echo it (as SCTP's own INIT cookie does for
// its state).
//
// The dialer's socket is connected to the listening address while it waits,
// so a refusal (nobody listening) fails the dial at once, then to the
// acceptor's new socket. The datagrams carry nothing secret and prove nothing
// about the job: authentication is the handshake's job, over the association.
const (
	udpMagic     uint32 = 'G' | 'V'<<8 | 'S'<<16 | 'U'<<24
	udpVersion   uint8  = 2
	udpRequest   uint8  = 1
	udpReply     uint8  = 2
	udpCookie    uint8  = 3
	udpEcho      uint8  = 4
	datagramSize        = 40
	nonceSize           = 16
	cookieSize          = 16
	// cookieLifetime is how long a cookie is accepted after it was made
	// (whole seconds: the timestamp's unit): long enough for a dialer's
	// resends, short enough that a captured cookie soon expires.
	cookieLifetime = 10
)

// connectMsg is one connect datagram.
type connectMsg struct {
	typ    uint8
	port   uint16
	nonce  [nonceSize]byte
	cookie [cookieSize]byte
}

func (m *connectMsg) encode(b []byte) {
	_ = b[datagramSize-1]
	binary.LittleEndian.PutUint32(b, udpMagic)
	b[4], b[5] = udpVersion, m.typ
	binary.LittleEndian.PutUint16(b[6:], m.port)
	copy(b[8:24], m.nonce[:])
	copy(b[24:datagramSize], m.cookie[:])
}

// decodeConnect parses a connect datagram; it is strict, so a datagram that
// decodes re-encodes to the same bytes.
func decodeConnect(b []byte) (connectMsg, error) {
	var m connectMsg
	switch {
	case len(b) != datagramSize:
		return m, fmt.Errorf("connect datagram of %d bytes, want %d", len(b), datagramSize)
	case binary.LittleEndian.Uint32(b) != udpMagic:
		return m, fmt.Errorf("connect datagram with bad magic %#08x", binary.LittleEndian.Uint32(b))
	case b[4] != udpVersion:
		return m, fmt.Errorf("connect datagram version %d, want %d", b[4], udpVersion)
	}
	m.typ, m.port = b[5], binary.LittleEndian.Uint16(b[6:])
	copy(m.nonce[:], b[8:24])
	copy(m.cookie[:], b[24:datagramSize])
	hasCookie := m.cookie != [cookieSize]byte{}
	switch m.typ {
	case udpRequest, udpCookie, udpEcho, udpReply:
	default:
		return m, fmt.Errorf("connect datagram of type %d", m.typ)
	}
	if (m.typ == udpReply) != (m.port != 0) {
		return m, fmt.Errorf("connect datagram of type %d with port %d", m.typ, m.port)
	}
	if (m.typ == udpCookie || m.typ == udpEcho) != hasCookie {
		return m, fmt.Errorf("connect datagram of type %d with a cookie: %v", m.typ, hasCookie)
	}
	return m, nil
}

// cookieFor returns the cookie of a request from remote with nonce, made at
// unix second at.
func (t *Transport) cookieFor(remote *net.UDPAddr, nonce *[nonceSize]byte, at uint32) [cookieSize]byte {
	mac := hmac.New(sha256.New, t.cookieKey[:])
	mac.Write(remote.IP.To16())
	var w [6]byte
	binary.LittleEndian.PutUint16(w[:2], uint16(remote.Port))
	binary.LittleEndian.PutUint32(w[2:], at)
	mac.Write(w[:])
	mac.Write(nonce[:])
	var c [cookieSize]byte
	binary.LittleEndian.PutUint32(c[:4], at)
	copy(c[4:], mac.Sum(nil))
	return c
}

// validCookie reports whether c is a cookie this transport made for remote
// and nonce within the last cookieLifetime seconds.
func (t *Transport) validCookie(remote *net.UDPAddr, nonce *[nonceSize]byte, c *[cookieSize]byte, now time.Time) bool {
	at := int64(binary.LittleEndian.Uint32(c[:4]))
	if age := now.Unix() - at; age < 0 || age > cookieLifetime {
		return false
	}
	want := t.cookieFor(remote, nonce, uint32(at))
	return hmac.Equal(want[:], c[:])
}

// sconn is one association being set up or handshaken: its connected UDP
// socket, the association over it and its stream 0.
type sconn struct {
	udp    *net.UDPConn
	assoc  *sctp.Association
	stream *sctp.Stream // stream 0: frames (and the handshake)
	credit *sctp.Stream // stream 1: flow-control reports (see link.go)
	remote string
	// flushed is signalled when the stream's queue falls to its threshold.
	flushed chan struct{}
}

// sizeBuffers sets an association socket's kernel buffers: with the
// privilege to, past net.core.rmem_max (SO_RCVBUFFORCE), else up to it.
func (t *Transport) sizeBuffers(c *net.UDPConn) {
	n := t.cfg.SocketBuffer
	rc, err := c.SyscallConn()
	if err != nil || n == 0 {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n) != nil {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
		}
		if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, n) != nil {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, n)
		}
	})
}

// options are the association settings both sides use.
func (t *Transport) options(c *net.UDPConn) []sctp.AssociationOption {
	t.sizeBuffers(c)
	return []sctp.AssociationOption{
		sctp.WithNetConn(c),
		sctp.WithLoggerFactory(&logging.DefaultLoggerFactory{DefaultLogLevel: logging.LogLevelDisabled}),
		sctp.WithMTU(uint32(t.cfg.MTU)),
		sctp.WithMaxReceiveBufferSize(uint32(t.cfg.ReceiveBuffer)),
		sctp.WithMaxMessageSize(messageBytes),
	}
}

func newSconn(udp *net.UDPConn, assoc *sctp.Association, stream *sctp.Stream, remote string) (*sconn, error) {
	// Both sides open stream 1 before anything can be sent on it: pion drops
	// the data of a stream the peer opens once 16 such streams wait unaccepted.
	credit, err := assoc.OpenStream(1, sctp.PayloadTypeWebRTCBinary)
	if err != nil {
		return nil, err
	}
	c := &sconn{udp: udp, assoc: assoc, stream: stream, credit: credit, remote: remote, flushed: make(chan struct{}, 1)}
	stream.SetBufferedAmountLowThreshold(0)
	stream.OnBufferedAmountLow(func() {
		select {
		case c.flushed <- struct{}{}:
		default:
		}
	})
	return c, nil
}

// close aborts the association (at once: queued data is dropped) and closes
// the socket. It may be called on a partly built sconn.
func (c *sconn) close() {
	if c.assoc != nil {
		c.assoc.Abort("gorovod: closed")
	}
	_ = c.udp.Close()
}

// flush waits, until the deadline, for everything written to be acknowledged,
// so that a last message (a verdict, a refusal) is delivered before the
// association goes.
func (c *sconn) flush(deadline time.Time) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for c.stream.BufferedAmount() > 0 {
		select {
		case <-c.flushed:
		case <-timer.C:
			return
		}
	}
}

// writeMsg sends one handshake message.
func (c *sconn) writeMsg(b []byte) error {
	_, err := c.stream.Write(b)
	return err
}

// readMsg reads one handshake message of exactly len(b) bytes by the deadline.
func (c *sconn) readMsg(b []byte, deadline time.Time) error {
	_ = c.stream.SetReadDeadline(deadline)
	n, err := c.stream.Read(b)
	if err != nil {
		if errors.Is(err, sctp.ErrReadDeadlineExceeded) {
			return os.ErrDeadlineExceeded
		}
		return err
	}
	if n != len(b) {
		return fmt.Errorf("handshake message of %d bytes, want %d", n, len(b))
	}
	return nil
}

// acceptAssoc answers a connect request from remote: it makes a socket
// connected to the dialer, replies from it and runs the server side of the
// association until the dialer has opened stream 0. ctx bounds it all.
func (t *Transport) acceptAssoc(ctx context.Context, ln *net.UDPConn, remote *net.UDPAddr, nonce *[nonceSize]byte) (*sconn, error) {
	local := &net.UDPAddr{IP: ln.LocalAddr().(*net.UDPAddr).IP}
	udp, err := net.DialUDP("udp", local, remote)
	if err != nil {
		return nil, err
	}
	c := &sconn{udp: udp, remote: remote.String()}
	// pion's server setup has no deadline of its own: closing the socket ends it.
	stop := context.AfterFunc(ctx, func() { _ = udp.Close() })
	defer stop()
	var reply [datagramSize]byte
	m := connectMsg{typ: udpReply, port: uint16(udp.LocalAddr().(*net.UDPAddr).Port), nonce: *nonce}
	m.encode(reply[:])
	if _, err := ln.WriteToUDP(reply[:], remote); err != nil {
		c.close()
		return nil, err
	}
	opts := t.options(udp)
	sopts := make([]sctp.ServerOption, len(opts))
	for i, o := range opts {
		sopts[i] = o
	}
	if c.assoc, err = sctp.ServerWithOptions(sopts...); err != nil {
		c.close()
		return nil, err
	}
	// Ends when the dialer's first message opens stream 0, or when ctx's end
	// closes the socket and with it the association.
	abort := context.AfterFunc(ctx, func() { c.assoc.Abort("handshake timeout") })
	stream, err := c.assoc.AcceptStream()
	abort()
	if err != nil || ctx.Err() != nil {
		c.close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	if stream.StreamIdentifier() != 0 {
		c.close()
		return nil, fmt.Errorf("peer opened stream %d first", stream.StreamIdentifier())
	}
	sc, err := newSconn(udp, c.assoc, stream, remote.String())
	if err != nil {
		c.close()
		return nil, err
	}
	return sc, nil
}

// dialAssoc sends a connect request to addr, connects to the socket that
// answers and starts the client side of the association.
func (t *Transport) dialAssoc(ctx context.Context, addr string) (*sconn, error) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*sconn, error) {
		_ = udp.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = udp.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := connectMsg{typ: udpRequest}
	_, _ = rand.Read(req.nonce[:])
	var out, buf [datagramSize + 1]byte
	// A datagram may be lost: resend the request (or, once a cookie came,
	// the echo) a few times within the handshake timeout.
	deadline := time.Now().Add(t.cfg.HandshakeTimeout)
	var server *net.UDPAddr
	for attempt := 0; server == nil; attempt++ {
		req.encode(out[:])
		if _, err := udp.Write(out[:datagramSize]); err != nil {
			return fail(err)
		}
		wait := min(time.Duration(20<<min(attempt, 5))*time.Millisecond, time.Until(deadline))
		if wait <= 0 {
			return fail(fmt.Errorf("no answer to the connect request within %v", t.cfg.HandshakeTimeout))
		}
		_ = udp.SetReadDeadline(time.Now().Add(wait))
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		for {
			n, err := udp.Read(buf[:])
			if err != nil {
				if ctx.Err() != nil {
					return fail(ctx.Err())
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				// ECONNREFUSED: nobody listens there (yet).
				return fail(err)
			}
			m, err := decodeConnect(buf[:n])
			if err != nil || m.nonce != req.nonce {
				continue
			}
			if m.typ == udpCookie && req.typ == udpRequest {
				// Echo it at once; the resends above echo it from now on.
				req.typ, req.cookie = udpEcho, m.cookie
				req.encode(out[:])
				if _, err := udp.Write(out[:datagramSize]); err != nil {
					return fail(err)
				}
				continue
			}
			if m.typ == udpReply {
				server = &net.UDPAddr{IP: raddr.IP, Port: int(m.port), Zone: raddr.Zone}
				break
			}
		}
	}
	_ = udp.SetReadDeadline(time.Time{})
	if err := connectUDP(udp, server); err != nil {
		return fail(err)
	}
	opts := t.options(udp)
	copts := make([]sctp.ClientOption, len(opts))
	for i, o := range opts {
		copts[i] = o
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	assoc, err := sctp.ClientContext(cctx, copts...)
	if err != nil {
		return fail(err)
	}
	stream, err := assoc.OpenStream(0, sctp.PayloadTypeWebRTCBinary)
	if err != nil {
		assoc.Abort("")
		return fail(err)
	}
	// What the caller sees as the peer is the listening address it dialed.
	sc, err := newSconn(udp, assoc, stream, addr)
	if err != nil {
		assoc.Abort("")
		return fail(err)
	}
	return sc, nil
}

// connectUDP connects a UDP socket to peer (again), so the kernel hands it only
// that peer's datagrams and reports the peer's port closing.
func connectUDP(c *net.UDPConn, peer *net.UDPAddr) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var sa syscall.Sockaddr
	if ip4 := peer.IP.To4(); ip4 != nil {
		a := &syscall.SockaddrInet4{Port: peer.Port}
		copy(a.Addr[:], ip4)
		sa = a
	} else {
		a := &syscall.SockaddrInet6{Port: peer.Port}
		copy(a.Addr[:], peer.IP.To16())
		sa = a
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = syscall.Connect(int(fd), sa) }); err != nil {
		return err
	}
	return cerr
}
