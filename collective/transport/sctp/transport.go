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

	done   chan struct{}      // closed by Close
	base   context.Context    // ends when Close starts
	cancel context.CancelFunc // ends base
	wg     sync.WaitGroup     // the request loop and every association goroutine

	mu         sync.Mutex
	closed     bool
	conns      map[*sconn]struct{} // handshaking or parked: Close closes these
	requests   map[requestKey]bool // connect requests being answered
	handshakes int                 // requests and handshakes in progress
	jobs       map[uint64]uint64   // job hash -> newest epoch Connect has started
	worlds     map[worldKey]*pendingWorld
	parked     map[worldKey][]*authConn
	nParked    int
	authFails  []authFailure
}

type requestKey struct {
	remote string
	nonce  [nonceSize]byte
}

// authFailure is a dialer that failed authentication before its world's
// Connect started here.
type authFailure struct {
	hello  transport.Hello
	remote string
	at     time.Time
}

var _ transport.Transport = (*Transport)(nil)

type worldKey struct{ job, epoch uint64 }

// pendingWorld is a Connect in progress, as seen by the accepting side.
type pendingWorld struct {
	rank, size int
	queue      []*authConn // guarded by Transport.mu
	authFails  map[int]error
	notify     chan struct{}
}

func (pw *pendingWorld) signal() {
	select {
	case pw.notify <- struct{}{}:
	default:
	}
}

// authConn is an accepted association whose dialer has proved it knows the
// secret and is waiting for the final verdict.
type authConn struct {
	c       *sconn
	hello   transport.Hello
	remote  string
	claimed bool // guarded by Transport.mu
	claim   chan struct{}
}

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
		done:     make(chan struct{}),
		conns:    make(map[*sconn]struct{}),
		requests: make(map[requestKey]bool),
		jobs:     make(map[uint64]uint64),
		worlds:   make(map[worldKey]*pendingWorld),
		parked:   make(map[worldKey][]*authConn),
	}
	if t.addr == "" {
		t.addr = ln.LocalAddr().String()
	}
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
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	t.cancel()
	conns := make([]*sconn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	err := t.ln.Close()
	for _, c := range conns {
		// Closing the socket ends whatever the association's goroutine is
		// waiting for; that goroutine then closes the association itself.
		_ = c.udp.Close()
	}
	t.wg.Wait()
	return err
}

// requestLoop answers connect requests, each on its own goroutine.
func (t *Transport) requestLoop() {
	defer t.wg.Done()
	var buf [requestSize + 1]byte
	for {
		n, remote, err := t.ln.ReadFromUDP(buf[:])
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A datagram error (an ICMP report about an earlier reply): go on.
			continue
		}
		var nonce [nonceSize]byte
		if _, err := decodeRequest(buf[:n], udpRequest, &nonce); err != nil {
			t.log.Debug("gorovod sctp: ignoring a datagram", "remote", remote, "err", err)
			continue
		}
		key := requestKey{remote.String(), nonce}
		t.mu.Lock()
		switch {
		case t.closed:
			t.mu.Unlock()
			return
		case t.requests[key]:
			// A resent request: the reply is on its way or lost; the dialer
			// resends until the association starts, which answers it.
			t.mu.Unlock()
			continue
		case t.handshakes >= maxHandshakes:
			t.mu.Unlock()
			t.log.Warn("gorovod sctp: dropping a connect request: too many handshakes in progress", "remote", remote)
			continue
		}
		t.handshakes++
		t.requests[key] = true
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(key, remote, nonce)
	}
}

func (t *Transport) serve(key requestKey, remote *net.UDPAddr, nonce [nonceSize]byte) {
	defer t.wg.Done()
	ac := t.accept(remote, &nonce)
	t.mu.Lock()
	t.handshakes--
	delete(t.requests, key)
	t.mu.Unlock()
	if ac != nil {
		t.route(ac)
	}
}

// track registers a connection Close must close; it fails once closed.
func (t *Transport) track(c *sconn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// drop closes a connection this transport still tracks.
func (t *Transport) drop(c *sconn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.close()
}

// accept sets up the association of a connect request and runs the
// acceptor's side of the handshake up to authentication. It returns nil when
// the connection was dropped.
func (t *Transport) accept(remote *net.UDPAddr, nonce *[nonceSize]byte) *authConn {
	ctx, cancel := context.WithTimeout(t.base, t.cfg.HandshakeTimeout)
	defer cancel()
	c, err := t.acceptAssoc(ctx, t.ln, remote, nonce)
	if err != nil {
		t.log.Debug("gorovod sctp: association not set up", "remote", remote, "err", err)
		return nil
	}
	if !t.track(c) {
		c.close()
		return nil
	}
	ac := t.acceptHandshake(c)
	if ac == nil {
		t.drop(c)
	}
	return ac
}

func (t *Transport) acceptHandshake(c *sconn) *authConn {
	remote := c.remote
	deadline := time.Now().Add(t.cfg.HandshakeTimeout)

	var hb [transport.HelloSize]byte
	if err := c.readMsg(hb[:], deadline); err != nil {
		t.log.Debug("gorovod sctp: no hello", "remote", remote, "err", err)
		return nil
	}
	var hello transport.Hello
	if err := transport.DecodeHello(hb[:], &hello); err != nil {
		t.log.Debug("gorovod sctp: bad hello", "remote", remote, "err", err)
		t.writeChallenge(c, &transport.Challenge{Status: transport.RejectMalformed, Reason: reasonOf(err)})
		return nil
	}
	key := worldKey{hello.JobHash, hello.Epoch}
	t.mu.Lock()
	status, reason := t.precheck(&hello)
	t.mu.Unlock()
	if status != transport.StatusOK {
		t.log.Info("gorovod sctp: refusing peer", "remote", remote, "rank", hello.From, "epoch", hello.Epoch, "status", status, "reason", reason)
		t.writeChallenge(c, &transport.Challenge{Status: status, Reason: reason})
		return nil
	}
	ch := transport.Challenge{Status: transport.StatusOK}
	_, _ = rand.Read(ch.Nonce[:])
	ch.MAC = transport.AcceptorMAC(t.cfg.Secret, hb[:], &ch.Nonce)
	if !t.writeChallenge(c, &ch) {
		return nil
	}
	var rb [transport.ResponseSize]byte
	if err := c.readMsg(rb[:], time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		t.log.Debug("gorovod sctp: no response", "remote", remote, "err", err)
		return nil
	}
	var resp transport.Response
	if err := transport.DecodeResponse(rb[:], &resp); err != nil {
		t.log.Debug("gorovod sctp: bad response", "remote", remote, "err", err)
		t.writeVerdict(c, transport.RejectMalformed, reasonOf(err))
		return nil
	}
	want := transport.DialerMAC(t.cfg.Secret, hb[:], &ch.Nonce, &hello.Nonce)
	if !transport.MACEqual(&want, &resp.MAC) {
		t.log.Warn("gorovod sctp: peer failed authentication (wrong secret?)", "remote", remote, "rank", hello.From, "epoch", hello.Epoch)
		// Recorded before the verdict goes out: delivering it may take a while.
		t.mu.Lock()
		if pw := t.worlds[key]; pw != nil {
			pw.authFailed(&hello, remote)
		} else {
			if len(t.authFails) == maxAuthFails {
				t.authFails = append(t.authFails[:0], t.authFails[1:]...)
			}
			t.authFails = append(t.authFails, authFailure{hello: hello, remote: remote, at: time.Now()})
		}
		t.mu.Unlock()
		t.writeVerdict(c, transport.RejectWrongSecret, "your proof did not verify (secrets differ?)")
		return nil
	}
	return &authConn{c: c, hello: hello, remote: remote, claim: make(chan struct{})}
}

func reasonOf(err error) string {
	var he *transport.HandshakeError
	if errors.As(err, &he) {
		return he.Reason
	}
	return err.Error()
}

// precheck decides from the (unauthenticated) hello alone whether to go on.
// Called with t.mu held.
func (t *Transport) precheck(h *transport.Hello) (transport.HandshakeStatus, string) {
	if t.closed {
		return transport.RejectShutdown, "transport closing"
	}
	latest, known := t.jobs[h.JobHash]
	switch {
	case !known && len(t.jobs) > 0:
		return transport.RejectWrongJob, fmt.Sprintf("job %#x is not served here", h.JobHash)
	case known && h.Epoch < latest:
		return transport.RejectStaleEpoch, fmt.Sprintf("epoch %d is older than epoch %d connected here", h.Epoch, latest)
	}
	if pw := t.worlds[worldKey{h.JobHash, h.Epoch}]; pw != nil {
		return pw.check(h)
	}
	return transport.StatusOK, ""
}

// authFailed records that a dialer claiming a rank of this world failed
// authentication. Called with Transport.mu held.
func (pw *pendingWorld) authFailed(h *transport.Hello, remote string) {
	if s, _ := pw.check(h); s != transport.StatusOK {
		return
	}
	if pw.authFails == nil {
		pw.authFails = make(map[int]error)
	}
	pw.authFails[int(h.From)] = &transport.HandshakeError{Rank: int(h.From), Addr: remote, Fatal: true,
		Reason: "peer failed authentication (wrong secret?)"}
}

// check verifies that a hello fits this world.
func (pw *pendingWorld) check(h *transport.Hello) (transport.HandshakeStatus, string) {
	switch {
	case int(h.Size) != pw.size:
		return transport.RejectWrongWorld, fmt.Sprintf("world size %d, this side has %d", h.Size, pw.size)
	case int(h.To) != pw.rank:
		return transport.RejectWrongRank, fmt.Sprintf("this is rank %d, not %d", pw.rank, h.To)
	case int(h.From) <= pw.rank:
		return transport.RejectWrongRank, fmt.Sprintf("rank %d must be dialed by rank %d, not dial it", h.From, pw.rank)
	}
	return transport.StatusOK, ""
}

// writeChallenge and writeVerdict send the acceptor's messages. A refusal is
// the last message on its association: it is given the handshake timeout to be
// acknowledged before the caller drops the association.
func (t *Transport) writeChallenge(c *sconn, ch *transport.Challenge) bool {
	var b [transport.ChallengeSize]byte
	ch.Encode(b[:])
	if err := c.writeMsg(b[:]); err != nil {
		return false
	}
	if ch.Status != transport.StatusOK {
		c.flush(time.Now().Add(t.cfg.HandshakeTimeout))
	}
	return true
}

func (t *Transport) writeVerdict(c *sconn, s transport.HandshakeStatus, reason string) bool {
	var b [transport.VerdictSize]byte
	v := transport.Verdict{Status: s, Reason: reason}
	v.Encode(b[:])
	if err := c.writeMsg(b[:]); err != nil {
		return false
	}
	c.flush(time.Now().Add(t.cfg.HandshakeTimeout))
	return true
}

// route hands an authenticated association to its world's Connect, or parks
// it for a while in case that Connect is about to start.
func (t *Transport) route(ac *authConn) {
	key := worldKey{ac.hello.JobHash, ac.hello.Epoch}
	t.mu.Lock()
	if s, reason := t.precheck(&ac.hello); s != transport.StatusOK {
		t.mu.Unlock()
		t.reject(ac, s, reason)
		return
	}
	if pw := t.worlds[key]; pw != nil {
		if len(pw.queue) >= pw.size {
			t.mu.Unlock()
			t.reject(ac, transport.RejectBusy, "too many connections for this world")
			return
		}
		pw.queue = append(pw.queue, ac)
		delete(t.conns, ac.c)
		pw.signal()
		t.mu.Unlock()
		return
	}
	if t.nParked >= maxParked {
		t.mu.Unlock()
		t.reject(ac, transport.RejectBusy, "too many connections waiting")
		return
	}
	t.parked[key] = append(t.parked[key], ac)
	t.nParked++
	t.mu.Unlock()

	// Half the handshake timeout, so that the dialer, which waits a whole one
	// for the verdict, hears "not ready" and retries instead of timing out.
	timer := time.NewTimer(t.cfg.HandshakeTimeout / 2)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ac.claim:
	case <-t.done:
	}
	t.mu.Lock()
	if ac.claimed {
		t.mu.Unlock()
		return
	}
	t.unpark(key, ac)
	s, reason := t.precheck(&ac.hello)
	t.mu.Unlock()
	if s == transport.StatusOK {
		s, reason = transport.RejectNotReady, "this worker is not connecting that world (yet)"
	}
	t.reject(ac, s, reason)
}

// unpark removes ac from the parked set. Called with t.mu held.
func (t *Transport) unpark(key worldKey, ac *authConn) {
	list := t.parked[key]
	for i, p := range list {
		if p == ac {
			list = append(list[:i], list[i+1:]...)
			t.nParked--
			break
		}
	}
	if len(list) == 0 {
		delete(t.parked, key)
	} else {
		t.parked[key] = list
	}
}

func (t *Transport) reject(ac *authConn, s transport.HandshakeStatus, reason string) {
	level := slog.LevelInfo
	if !s.Fatal() {
		level = slog.LevelDebug
	}
	t.log.Log(context.Background(), level, "gorovod sctp: refusing peer", "remote", ac.remote, "rank", ac.hello.From, "epoch", ac.hello.Epoch, "status", s, "reason", reason)
	t.writeVerdict(ac.c, s, reason)
	t.drop(ac.c)
}

// register records a Connect for world w and takes over the associations
// parked for it.
func (t *Transport) register(key worldKey, w *transport.World) (*pendingWorld, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.worlds[key] != nil {
		return nil, fmt.Errorf("sctp: job %q epoch %d is already being connected on this transport", w.JobID, w.Epoch)
	}
	if latest, ok := t.jobs[key.job]; ok && key.epoch < latest {
		return nil, fmt.Errorf("sctp: stale epoch: job %q epoch %d is older than epoch %d already connected on this transport", w.JobID, key.epoch, latest)
	}
	t.jobs[key.job] = key.epoch
	if len(t.jobs) > maxJobs {
		for j := range t.jobs {
			if j != key.job && !t.connecting(j) {
				delete(t.jobs, j)
				break
			}
		}
	}
	pw := &pendingWorld{rank: w.Rank, size: w.Size(), notify: make(chan struct{}, 1)}
	t.worlds[key] = pw
	for _, ac := range t.parked[key] {
		ac.claimed = true
		close(ac.claim)
		delete(t.conns, ac.c)
		t.nParked--
		pw.queue = append(pw.queue, ac)
	}
	delete(t.parked, key)
	if len(pw.queue) > 0 {
		pw.signal()
	}
	kept := t.authFails[:0]
	for _, af := range t.authFails {
		switch {
		case time.Since(af.at) > t.cfg.HandshakeTimeout:
		case (worldKey{af.hello.JobHash, af.hello.Epoch}) == key:
			pw.authFailed(&af.hello, af.remote)
		default:
			kept = append(kept, af)
		}
	}
	clear(t.authFails[len(kept):])
	t.authFails = kept
	return pw, nil
}

func (t *Transport) connecting(job uint64) bool {
	for k := range t.worlds {
		if k.job == job {
			return true
		}
	}
	return false
}

// unregister ends a Connect and refuses what is still queued for it.
func (t *Transport) unregister(key worldKey, pw *pendingWorld) {
	t.mu.Lock()
	if t.worlds[key] == pw {
		delete(t.worlds, key)
	}
	queue := pw.queue
	pw.queue = nil
	t.mu.Unlock()
	for _, ac := range queue {
		t.log.Info("gorovod sctp: refusing peer: world no longer connecting", "remote", ac.remote, "rank", ac.hello.From)
		t.writeVerdict(ac.c, transport.RejectNotReady, "world no longer connecting")
		ac.c.close()
	}
}

// take returns what arrived for pw since the last call.
func (t *Transport) take(pw *pendingWorld) []*authConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := pw.queue
	pw.queue = nil
	return q
}

// authFailure returns why rank last failed authentication for pw, if it did.
func (t *Transport) authFailure(pw *pendingWorld, rank int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return pw.authFails[rank]
}
