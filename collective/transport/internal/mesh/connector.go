package mesh

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
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

const (
	// maxHandshakes bounds handshakes in progress, so a flood of strangers costs
	// bounded memory; connections over the limit are dropped at once.
	maxHandshakes = 256
	// DefaultHandshakesPerSource is Config.HandshakesPerSource's default.
	// The limit is the acceptor's, per source host: a dialer opens a
	// link's further lanes all at once, so one rank has up to Lanes-1
	// handshakes in progress with one acceptor (3 at TCP's 4 lanes to
	// another host), whatever the size of the world it joins. 64 is room
	// for 16 ranks of one host opening 4-lane links to one acceptor at the
	// same moment (16 first lanes, then 48 further ones), while a single
	// stranger host takes at most a quarter of the 256 slots.
	DefaultHandshakesPerSource = 64
	// maxDialRetry is what Config.DialRetry doubles up to.
	maxDialRetry = 200 * time.Millisecond

	// maxParked bounds authenticated connections waiting for their world's Connect.
	maxParked = 256
	// maxAuthFails bounds the remembered authentication failures.
	maxAuthFails = 16
	// maxJobs bounds the jobs whose latest epoch is remembered.
	maxJobs = 16
)

// Conn is one raw connection from the start of its handshake until Connect
// turns it into a link or it is closed.
//
// No deadline crosses this interface: the transports bound handshake messages
// differently (a TCP acceptor gives the whole handshake one timeout, an SCTP
// association gives each message its own), and that difference is theirs to
// keep. Every read and write returns by the transport's deadline, and on the
// dialing side by the deadline of the context Config.Dial was given.
type Conn interface {
	// ReadMsg reads one handshake message of exactly len(b) bytes.
	ReadMsg(b []byte) error
	// WriteMsg sends one handshake message. settle is set when the connection
	// is closed or handed to a link right after: a transport whose close
	// would discard what is still queued then waits, within the handshake
	// timeout, for the peer to have the message.
	WriteMsg(b []byte, settle bool) error
	// Interrupt makes pending and later calls fail at once. Unlike the other
	// methods it may be called from any goroutine (Close, a dial's context).
	Interrupt()
	// Close releases the connection.
	Close()
	// Link turns the authenticated connection into the link to rank peer of
	// the world (job, epoch) in which this worker is rank self. addr is the
	// peer's address for errors, "" when the world does not name it; keys
	// protect its frames (package framesec).
	Link(peer int, addr string, job, epoch uint64, self int, keys framesec.Keys) transport.Link
}

// LaneConn is implemented by a Conn whose transport can stripe a link
// over several connections (lanes). The dialer then opens Lanes()
// connections per link, the first as always and each further one with a
// Hello naming its lane and carrying handshake.LaneNonce, which ties it to
// the first; the acceptor refuses a dialer that wants another number of
// lanes than it does, and a lane it cannot tie to a first connection of
// the same rank. Each lane gets its own keys from its own handshake.
type LaneConn interface {
	Conn
	// Lanes is how many connections the link this connection opens is to
	// have: 1 to handshake.MaxLanes. Both ends of a link must choose alike.
	Lanes() int
	// LinkLanes is Link for a link over lanes (lanes[0] is the receiver),
	// with keys[i] protecting lane i's frames.
	LinkLanes(lanes []Conn, keys []framesec.Keys, peer int, addr string, job, epoch uint64, self int) transport.Link
}

// lanesOf is how many lanes the link c opens is to have.
func lanesOf(c Conn) int {
	if lc, ok := c.(LaneConn); ok {
		return min(max(lc.Lanes(), 1), handshake.MaxLanes)
	}
	return 1
}

// HostAware is implemented by a Conn that can tell whether its two ends are
// on one host: the default data-plane setting leaves such links plain
// (transport.SecurityDefault).
type HostAware interface {
	SameHost() bool
}

// linkSecurity is the data-plane setting of the link c is to become.
func (m *Connector) linkSecurity(c Conn) transport.Security {
	h, ok := c.(HostAware)
	return m.cfg.Security.ForLink(ok && h.SameHost())
}

// Config is what a Connector needs from its transport.
type Config struct {
	// Name ("tcp", "sctp") starts the errors and log messages.
	Name string
	// Secret is the job secret both ends prove they hold.
	Secret []byte
	// Security is this endpoint's data-plane setting. Each connection's
	// setting is Security.ForLink(c.SameHost()) where the Conn has a
	// SameHost method (see HostAware), else Security.ForLink(false). The
	// dialer names its choice in the Hello; an acceptor that chooses
	// otherwise refuses it.
	Security transport.Security
	// HandshakesPerSource bounds the handshakes in progress from one source
	// address (the host part of the remote address Admit is given), so one
	// stranger host cannot take every slot. Default (0):
	// DefaultHandshakesPerSource.
	HandshakesPerSource int
	// HandshakeTimeout: a parked arrival waits half of it, and remembered
	// authentication failures expire after it.
	HandshakeTimeout time.Duration
	// DialRetry is the first retry interval of a dial; it doubles up to 200ms.
	DialRetry time.Duration
	// Logger receives connection diagnostics. Default: discard.
	Logger *slog.Logger
	// ErrClosed is what Connect fails with once Close has been called.
	ErrClosed error
	// Dial opens one raw connection to addr, ready for the dialer's side of the
	// handshake and bounded by ctx. Its error is wrapped in a
	// *transport.PeerError naming the rank.
	Dial func(ctx context.Context, addr string) (Conn, error)
}

// Connector is the transport-independent state of one endpoint: the handshakes
// in progress, the worlds being connected and the arrivals parked for worlds
// that are not yet. Its methods are safe for concurrent use.
type Connector struct {
	cfg    Config
	prefix string        // "gorovod <name>: ", for log messages
	done   chan struct{} // closed by Close

	mu         sync.Mutex
	closed     bool
	conns      map[Conn]struct{} // handshaking or parked: Close interrupts these
	handshakes int               // admitted and not yet authenticated or dropped
	perSource  map[string]int    // handshakes in progress per source host
	jobs       map[uint64]uint64 // job hash -> newest epoch Connect has started
	worlds     map[worldKey]*pendingWorld
	parked     map[worldKey][]*Arrival
	nParked    int
	authFails  []authFailure // recent failures for worlds not being connected yet
}

// New returns a Connector for a transport configured with cfg.
func New(cfg Config) *Connector {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakesPerSource <= 0 {
		cfg.HandshakesPerSource = DefaultHandshakesPerSource
	}
	return &Connector{
		perSource: make(map[string]int),
		cfg:       cfg,
		prefix:    "gorovod " + cfg.Name + ": ",
		done:      make(chan struct{}),
		conns:     make(map[Conn]struct{}),
		jobs:      make(map[uint64]uint64),
		worlds:    make(map[worldKey]*pendingWorld),
		parked:    make(map[worldKey][]*Arrival),
	}
}

type worldKey struct{ job, epoch uint64 }

// authFailure is a dialer that failed authentication before its world's
// Connect started here.
type authFailure struct {
	hello  handshake.Hello
	remote string
	at     time.Time
}

// pendingWorld is a Connect in progress, as seen by the accepting side.
type pendingWorld struct {
	rank, size int
	// Guarded by Connector.mu.
	queue []*Arrival // authenticated, waiting for Connect to answer them
	// authFails holds, per rank, the last dialer claiming that rank that failed
	// authentication. It does not fail the Connect: anyone who saw a Hello could
	// replay it with a bad proof. It explains the rank if it never connects.
	authFails map[int]error
	notify    chan struct{}
}

func (pw *pendingWorld) signal() {
	select {
	case pw.notify <- struct{}{}:
	default:
	}
}

// Arrival is an accepted connection whose dialer has proved it knows the
// secret and is waiting for the final verdict.
type Arrival struct {
	conn   Conn
	hello  handshake.Hello
	remote string
	keys   framesec.Keys
	// The hello as received and the acceptor's nonce: what the hellos of
	// the link's further lanes are tied to (handshake.LaneNonce).
	helloBytes [handshake.HelloSize]byte
	nonceA     [handshake.NonceSize]byte
	// Guarded by Connector.mu: set when a Connect takes the connection over
	// from its parked goroutine, which claim then wakes.
	claimed bool
	claim   chan struct{}
}

func (m *Connector) log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if m.cfg.Logger.Enabled(ctx, level) {
		m.cfg.Logger.Log(ctx, level, m.prefix+msg, args...)
	}
}

// Done is closed once Close has been called.
func (m *Connector) Done() <-chan struct{} { return m.done }

// Close makes pending and later Connect calls fail with Config.ErrClosed,
// refuses arrivals from now on and interrupts the connections still
// handshaking or parked, whose goroutines then drop them. It reports false
// when the Connector was already closed.
func (m *Connector) Close() bool {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return false
	}
	m.closed = true
	close(m.done)
	conns := make([]Conn, 0, len(m.conns))
	for c := range m.conns {
		conns = append(conns, c)
	}
	m.mu.Unlock()
	for _, c := range conns {
		c.Interrupt()
	}
	return true
}

// Idle reports whether no handshake is in progress and no connection is
// parked, for tests that wait for strangers to be gone.
func (m *Connector) Idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handshakes == 0 && len(m.conns) == 0
}

// Admit takes one of 256 handshake slots for a newcomer from remote
// ("host:port"), which Accept or Release frees. It reports false when none
// is free, when remote's host already holds Config.HandshakesPerSource of
// them, or when the Connector is closed: the newcomer is to be dropped at
// once.
func (m *Connector) Admit(remote string) bool {
	src := sourceOf(remote)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.handshakes >= maxHandshakes || m.perSource[src] >= m.cfg.HandshakesPerSource {
		return false
	}
	m.handshakes++
	m.perSource[src]++
	return true
}

// Release frees the slot Admit(remote) took for a newcomer that never got
// as far as Accept.
func (m *Connector) Release(remote string) {
	src := sourceOf(remote)
	m.mu.Lock()
	m.handshakes--
	if m.perSource[src]--; m.perSource[src] <= 0 {
		delete(m.perSource, src)
	}
	m.mu.Unlock()
}

// sourceOf is the host a remote address counts against.
func sourceOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// Accept runs the acceptor's side of the handshake on c, from remote, and
// frees c's slot (see Admit(remote)). It returns the authenticated arrival,
// to be handed to Route, or nil having dropped c.
func (m *Connector) Accept(c Conn, remote string) *Arrival {
	if !m.track(c) {
		m.Release(remote)
		c.Close()
		return nil
	}
	a := m.acceptHandshake(c, remote)
	m.Release(remote)
	if a == nil {
		m.drop(c)
	}
	return a
}

// track registers a connection Close must interrupt; it fails once closed.
func (m *Connector) track(c Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

// drop closes a connection this Connector may still track.
func (m *Connector) drop(c Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
	c.Close()
}

// acceptHandshake runs the acceptor's side up to authentication. It returns
// nil when the connection is to be dropped.
func (m *Connector) acceptHandshake(c Conn, remote string) *Arrival {
	var hb [handshake.HelloSize]byte
	if err := c.ReadMsg(hb[:]); err != nil {
		m.log(slog.LevelDebug, "no hello", "remote", remote, "err", err)
		return nil
	}
	var hello handshake.Hello
	if err := handshake.DecodeHello(hb[:], &hello); err != nil {
		m.log(slog.LevelDebug, "bad hello", "remote", remote, "err", err)
		writeChallenge(c, &handshake.Challenge{Status: handshake.RejectMalformed, Reason: reasonOf(err)})
		return nil
	}
	key := worldKey{hello.JobHash, hello.Epoch}
	m.mu.Lock()
	status, reason := m.precheck(&hello)
	m.mu.Unlock()
	if want := m.linkSecurity(c); status == handshake.StatusOK && hello.Security != want {
		status, reason = handshake.RejectWrongWorld, fmt.Sprintf("data plane security %v, this side wants %v", hello.Security, want)
	}
	if want := lanesOf(c); status == handshake.StatusOK && int(hello.Lanes) != want {
		status, reason = handshake.RejectWrongWorld, fmt.Sprintf("%d lanes per link, this side wants %d", hello.Lanes, want)
	}
	if status != handshake.StatusOK {
		m.log(slog.LevelInfo, "refusing peer", "remote", remote, "rank", hello.From, "epoch", hello.Epoch, "status", status, "reason", reason)
		writeChallenge(c, &handshake.Challenge{Status: status, Reason: reason})
		return nil
	}

	ch := handshake.Challenge{Status: handshake.StatusOK}
	_, _ = rand.Read(ch.Nonce[:])
	ch.MAC = handshake.AcceptorMAC(m.cfg.Secret, hb[:], &ch.Nonce)
	if !writeChallenge(c, &ch) {
		return nil
	}
	var rb [handshake.ResponseSize]byte
	if err := c.ReadMsg(rb[:]); err != nil {
		m.log(slog.LevelDebug, "no response", "remote", remote, "err", err)
		return nil
	}
	var resp handshake.Response
	if err := handshake.DecodeResponse(rb[:], &resp); err != nil {
		m.log(slog.LevelDebug, "bad response", "remote", remote, "err", err)
		writeVerdict(c, handshake.RejectMalformed, reasonOf(err))
		return nil
	}
	want := handshake.DialerMAC(m.cfg.Secret, hb[:], &ch.Nonce, &hello.Nonce)
	if !handshake.MACEqual(&want, &resp.MAC) {
		m.log(slog.LevelWarn, "peer failed authentication (wrong secret?)", "remote", remote, "rank", hello.From, "epoch", hello.Epoch)
		// Recorded before the verdict goes out, which may take a while to be
		// delivered, so the dialer cannot hear it before its world here knows.
		m.mu.Lock()
		if pw := m.worlds[key]; pw != nil {
			pw.authFailed(&hello, remote)
		} else {
			// Its Connect may start in a moment: remember the failure for it.
			if len(m.authFails) == maxAuthFails {
				m.authFails = append(m.authFails[:0], m.authFails[1:]...)
			}
			m.authFails = append(m.authFails, authFailure{hello: hello, remote: remote, at: time.Now()})
		}
		m.mu.Unlock()
		writeVerdict(c, handshake.RejectWrongSecret, "your proof did not verify (secrets differ?)")
		return nil
	}
	keys, err := framesec.Derive(hello.Security, m.cfg.Secret, hb[:], ch.Nonce[:], hello.Nonce[:], false)
	if err != nil {
		m.log(slog.LevelWarn, "deriving link keys failed", "remote", remote, "err", err)
		writeVerdict(c, handshake.RejectMalformed, "link keys could not be derived")
		return nil
	}
	return &Arrival{conn: c, hello: hello, remote: remote, keys: keys, helloBytes: hb, nonceA: ch.Nonce, claim: make(chan struct{})}
}

func reasonOf(err error) string {
	var he *transport.HandshakeError
	if errors.As(err, &he) {
		return he.Reason
	}
	return err.Error()
}

// precheck decides from the (unauthenticated) hello alone whether to go on.
// Called with m.mu held.
func (m *Connector) precheck(h *handshake.Hello) (handshake.Status, string) {
	if m.closed {
		return handshake.RejectShutdown, "transport closing"
	}
	latest, known := m.jobs[h.JobHash]
	switch {
	case !known && len(m.jobs) > 0:
		return handshake.RejectWrongJob, fmt.Sprintf("job %#x is not served here", h.JobHash)
	case known && h.Epoch < latest:
		return handshake.RejectStaleEpoch, fmt.Sprintf("epoch %d is older than epoch %d connected here", h.Epoch, latest)
	}
	if pw := m.worlds[worldKey{h.JobHash, h.Epoch}]; pw != nil {
		return pw.check(h)
	}
	return handshake.StatusOK, ""
}

// authFailed records that a dialer claiming a rank of this world failed
// authentication. Called with Connector.mu held.
func (pw *pendingWorld) authFailed(h *handshake.Hello, remote string) {
	if s, _ := pw.check(h); s != handshake.StatusOK {
		return
	}
	if pw.authFails == nil {
		pw.authFails = make(map[int]error)
	}
	pw.authFails[int(h.From)] = &transport.HandshakeError{Rank: int(h.From), Addr: remote, Fatal: true,
		Reason: "peer failed authentication (wrong secret?)"}
}

// check verifies that a hello fits this world.
func (pw *pendingWorld) check(h *handshake.Hello) (handshake.Status, string) {
	switch {
	case int(h.Size) != pw.size:
		return handshake.RejectWrongWorld, fmt.Sprintf("world size %d, this side has %d", h.Size, pw.size)
	case int(h.To) != pw.rank:
		return handshake.RejectWrongRank, fmt.Sprintf("this is rank %d, not %d", pw.rank, h.To)
	case int(h.From) <= pw.rank:
		return handshake.RejectWrongRank, fmt.Sprintf("rank %d must be dialed by rank %d, not dial it", h.From, pw.rank)
	}
	return handshake.StatusOK, ""
}

// writeChallenge sends a challenge; a refusal is the connection's last message.
func writeChallenge(c Conn, ch *handshake.Challenge) bool {
	var b [handshake.ChallengeSize]byte
	ch.Encode(b[:])
	return c.WriteMsg(b[:], ch.Status != handshake.StatusOK) == nil
}

// writeVerdict sends a verdict, after which the connection is closed or
// becomes a link.
func writeVerdict(c Conn, s handshake.Status, reason string) bool {
	var b [handshake.VerdictSize]byte
	v := handshake.Verdict{Status: s, Reason: reason}
	v.Encode(b[:])
	return c.WriteMsg(b[:], true) == nil
}

// Route hands an authenticated arrival to its world's Connect, or parks it for
// a while in case that Connect is about to start; in that case it returns once
// a Connect has claimed it or it has been refused.
func (m *Connector) Route(a *Arrival) {
	key := worldKey{a.hello.JobHash, a.hello.Epoch}
	m.mu.Lock()
	// The world may have moved on while the handshake ran.
	if s, reason := m.precheck(&a.hello); s != handshake.StatusOK {
		m.mu.Unlock()
		m.reject(a, s, reason)
		return
	}
	if pw := m.worlds[key]; pw != nil {
		if len(pw.queue) >= pw.size*handshake.MaxLanes {
			m.mu.Unlock()
			m.reject(a, handshake.RejectBusy, "too many connections for this world")
			return
		}
		pw.queue = append(pw.queue, a)
		delete(m.conns, a.conn)
		pw.signal()
		m.mu.Unlock()
		return
	}
	if m.nParked >= maxParked {
		m.mu.Unlock()
		m.reject(a, handshake.RejectBusy, "too many connections waiting")
		return
	}
	m.parked[key] = append(m.parked[key], a)
	m.nParked++
	m.mu.Unlock()

	// Half the handshake timeout, so that the dialer, which waits a whole one for
	// the verdict, hears "not ready" and retries instead of timing out.
	timer := time.NewTimer(m.cfg.HandshakeTimeout / 2)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-a.claim:
	case <-m.done:
	}
	m.mu.Lock()
	if a.claimed {
		m.mu.Unlock()
		return
	}
	m.unpark(key, a)
	s, reason := m.precheck(&a.hello)
	m.mu.Unlock()
	if s == handshake.StatusOK {
		s, reason = handshake.RejectNotReady, "this worker is not connecting that world (yet)"
	}
	m.reject(a, s, reason)
}

// unpark removes a from the parked set. Called with m.mu held.
func (m *Connector) unpark(key worldKey, a *Arrival) {
	list := m.parked[key]
	for i, p := range list {
		if p == a {
			list = append(list[:i], list[i+1:]...)
			m.nParked--
			break
		}
	}
	if len(list) == 0 {
		delete(m.parked, key)
	} else {
		m.parked[key] = list
	}
}

func (m *Connector) reject(a *Arrival, s handshake.Status, reason string) {
	level := slog.LevelInfo
	if !s.Fatal() {
		// The dialer retries; this is routine while ranks reach a world at different times.
		level = slog.LevelDebug
	}
	m.log(level, "refusing peer", "remote", a.remote, "rank", a.hello.From, "epoch", a.hello.Epoch, "status", s, "reason", reason)
	writeVerdict(a.conn, s, reason)
	m.drop(a.conn)
}

// register records a Connect for world w and takes over the arrivals parked
// for it.
func (m *Connector) register(key worldKey, w *transport.World) (*pendingWorld, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, m.cfg.ErrClosed
	}
	if m.worlds[key] != nil {
		return nil, fmt.Errorf("%s: job %q epoch %d is already being connected on this transport", m.cfg.Name, w.JobID, w.Epoch)
	}
	if latest, ok := m.jobs[key.job]; ok && key.epoch < latest {
		return nil, fmt.Errorf("%s: stale epoch: job %q epoch %d is older than epoch %d already connected on this transport", m.cfg.Name, w.JobID, key.epoch, latest)
	}
	m.noteLatest(key)
	pw := &pendingWorld{rank: w.Rank, size: w.Size(), notify: make(chan struct{}, 1)}
	m.worlds[key] = pw
	for _, a := range m.parked[key] {
		a.claimed = true
		close(a.claim)
		delete(m.conns, a.conn)
		m.nParked--
		pw.queue = append(pw.queue, a)
	}
	delete(m.parked, key)
	if len(pw.queue) > 0 {
		pw.signal()
	}
	kept := m.authFails[:0]
	for _, af := range m.authFails {
		switch {
		case time.Since(af.at) > m.cfg.HandshakeTimeout:
		case (worldKey{af.hello.JobHash, af.hello.Epoch}) == key:
			pw.authFailed(&af.hello, af.remote)
		default:
			kept = append(kept, af)
		}
	}
	clear(m.authFails[len(kept):])
	m.authFails = kept
	return pw, nil
}

// noteLatest records key's epoch as the newest of its job connected here.
// Called with m.mu held.
func (m *Connector) noteLatest(key worldKey) {
	m.jobs[key.job] = key.epoch
	if len(m.jobs) > maxJobs {
		// Forget some other job that is not being connected right now.
		for j := range m.jobs {
			if j != key.job && !m.connecting(j) {
				delete(m.jobs, j)
				break
			}
		}
	}
}

func (m *Connector) connecting(job uint64) bool {
	for k := range m.worlds {
		if k.job == job {
			return true
		}
	}
	return false
}

// unregister ends a Connect and refuses what is still queued for it.
func (m *Connector) unregister(key worldKey, pw *pendingWorld) {
	m.mu.Lock()
	if m.worlds[key] == pw {
		delete(m.worlds, key)
	}
	queue := pw.queue
	pw.queue = nil
	m.mu.Unlock()
	for _, a := range queue {
		m.log(slog.LevelInfo, "refusing peer: world no longer connecting", "remote", a.remote, "rank", a.hello.From)
		writeVerdict(a.conn, handshake.RejectNotReady, "world no longer connecting")
		a.conn.Close()
	}
}

// take returns what arrived for pw since the last call.
func (m *Connector) take(pw *pendingWorld) []*Arrival {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := pw.queue
	pw.queue = nil
	return q
}

// authFailure returns why rank last failed authentication for pw, if it did.
func (m *Connector) authFailure(pw *pendingWorld, rank int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return pw.authFails[rank]
}
