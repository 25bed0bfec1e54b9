package mesh

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

// Connect connects this endpoint to every other rank of w: it dials each lower
// rank and waits for each higher rank to dial in. It returns one link per rank
// (links[w.Rank] is nil) or, having closed everything it opened, an error naming
// the rank that failed: a *transport.HandshakeError when a peer it dialed
// refused it or failed authentication, a *transport.PeerError otherwise.
//
// When ctx ends first, the *transport.PeerError lists every rank still missing
// and unwraps to ctx's error and to each missing rank's last failure; a higher
// rank that dialed in but failed authentication shows there as a
// *transport.HandshakeError. Such a failure does not end Connect by itself:
// anyone who saw a rank's hello could replay it with a bad proof, and the real
// rank may still come.
func (m *Connector) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	return m.ConnectSome(ctx, w, nil)
}

// ConnectSome is Connect for the ranks r of w with want[r] set (every rank
// when want is nil): the others' links are left nil, and a rank not wanted
// that dials in is told this side is not ready (it retries). The elastic
// layer uses it for the pairs whose links were not carried over from the
// previous world (transport.PartialConnector).
func (m *Connector) ConnectSome(ctx context.Context, w transport.World, want []bool) ([]transport.Link, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	size := w.Size()
	if want != nil && len(want) != size {
		return nil, fmt.Errorf("%s: %d ranks wanted of a world of %d", m.cfg.Name, len(want), size)
	}
	wanted := func(r int) bool { return r != w.Rank && (want == nil || want[r]) }
	need := 0
	for r := range size {
		if wanted(r) {
			need++
		}
	}
	if need == 0 {
		// Nothing to dial, but the world is this transport's newest: a
		// worker still dialling an older one is refused for good, as when
		// the world is connected (precheck).
		m.mu.Lock()
		key := worldKey{transport.JobHash(w.JobID), w.Epoch}
		if latest, ok := m.jobs[key.job]; !ok || latest < key.epoch {
			m.noteLatest(key)
		}
		m.mu.Unlock()
		return make([]transport.Link, size), nil
	}
	if size > transport.MaxWorldSize {
		return nil, fmt.Errorf("%s: world of %d ranks over the limit %d", m.cfg.Name, size, transport.MaxWorldSize)
	}
	for r := 0; r < w.Rank; r++ {
		if wanted(r) && w.Addrs[r] == "" {
			return nil, fmt.Errorf("%s: world has no address for rank %d", m.cfg.Name, r)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := worldKey{transport.JobHash(w.JobID), w.Epoch}
	pw, err := m.register(key, &w)
	if err != nil {
		return nil, err
	}
	defer m.unregister(key, pw)

	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type dialed struct {
		rank int
		l    transport.Link
		err  error
	}
	results := make(chan dialed, w.Rank)
	var wg sync.WaitGroup
	dialsLeft := 0
	for r := 0; r < w.Rank; r++ {
		if !wanted(r) {
			continue
		}
		dialsLeft++
		wg.Go(func() {
			l, err := m.dialPeer(dctx, &w, r, key)
			results <- dialed{r, l, err}
		})
	}

	links := make([]transport.Link, size)
	// Links whose lanes are still arriving, by rank; what is left of them
	// when Connect ends is closed.
	groups := make(map[int]*laneGroup)
	defer func() {
		for _, g := range groups {
			g.close()
		}
	}()
	dialErrs := make([]error, w.Rank)
	have := 0
	var failure error
	for have < need && failure == nil {
		select {
		case d := <-results:
			dialsLeft--
			if d.err != nil {
				if errors.Is(d.err, errGaveUp) {
					dialErrs[d.rank] = d.err
					failure = ctx.Err()
				} else {
					failure = d.err
				}
				break
			}
			links[d.rank] = d.l
			have++
		case <-pw.notify:
			for _, a := range m.take(pw) {
				from := int(a.hello.From)
				if s, reason := pw.check(&a.hello); s != handshake.StatusOK {
					m.log(slog.LevelInfo, "refusing peer", "remote", a.remote, "rank", from, "status", s, "reason", reason)
					writeVerdict(a.conn, s, reason)
					a.conn.Close()
					continue
				}
				if !wanted(from) {
					reason := "this side keeps its link to that rank from the previous world"
					m.log(slog.LevelDebug, "refusing peer", "remote", a.remote, "rank", from, "reason", reason)
					writeVerdict(a.conn, handshake.RejectNotReady, reason)
					a.conn.Close()
					continue
				}
				g := groups[from]
				if a.hello.Lane > 0 && !g.fits(m.cfg.Secret, a) {
					reason := "lane of a link this side does not have (replaced by a newer connection?)"
					m.log(slog.LevelInfo, "refusing peer", "remote", a.remote, "rank", from, "lane", a.hello.Lane, "reason", reason)
					writeVerdict(a.conn, handshake.RejectNotReady, reason)
					a.conn.Close()
					continue
				}
				if !writeVerdict(a.conn, handshake.StatusOK, "") {
					a.conn.Close()
					continue
				}
				var l transport.Link
				switch {
				case a.hello.Lanes == 1:
					l = a.conn.Link(from, w.Addrs[from], key.job, key.epoch, w.Rank, a.keys)
				case a.hello.Lane == 0:
					// The first lane of a link: its others follow. A first lane
					// replaces an unfinished link's (the dialer gave up on it).
					g.close()
					groups[from] = &laneGroup{lanes: make([]*Arrival, a.hello.Lanes)}
					groups[from].lanes[0] = a
					continue
				default:
					g.lanes[a.hello.Lane] = a
					if !g.complete() {
						continue
					}
					delete(groups, from)
					l = g.link(from, w.Addrs[from], key.job, key.epoch, w.Rank)
				}
				if old := links[from]; old != nil {
					// The dialer gave up on its previous connection (it never saw
					// our verdict), so this one is the one it will use.
					old.Close()
				} else {
					have++
				}
				links[from] = l
			}
		case <-ctx.Done():
			failure = ctx.Err()
		case <-m.done:
			failure = m.cfg.ErrClosed
		}
	}
	if failure == nil {
		// Every dial succeeded, so every dialer goroutine has already sent its result.
		wg.Wait()
		return links, nil
	}

	cancel()
	for ; dialsLeft > 0; dialsLeft-- {
		d := <-results
		if d.l != nil {
			d.l.Close()
		}
		if d.err != nil {
			dialErrs[d.rank] = d.err
		}
	}
	wg.Wait()
	for _, l := range links {
		if l != nil {
			l.Close()
		}
	}
	if cerr := ctx.Err(); cerr != nil && errors.Is(failure, cerr) {
		acceptErrs := make([]error, size)
		for r := w.Rank + 1; r < size; r++ {
			acceptErrs[r] = m.authFailure(pw, r)
		}
		return nil, missingError(&w, links, wanted, dialErrs, acceptErrs, cerr)
	}
	return nil, failure
}

// errGaveUp marks a dial that stopped because its context ended; the message
// around it is the last attempt's failure.
var errGaveUp = errors.New("gave up")

// missingError names every rank not connected when ctx ended, with why when
// known: the last dial attempt's failure, or a dialer that failed authentication.
func missingError(w *transport.World, links []transport.Link, wanted func(int) bool, dialErrs, acceptErrs []error, cerr error) error {
	e := &missingRanksError{ctxErr: cerr}
	for r := range links {
		if !wanted(r) || links[r] != nil {
			continue
		}
		e.missing = append(e.missing, r)
		var why error
		switch {
		case r < w.Rank && dialErrs[r] != nil:
			why = dialErrs[r]
		case r < w.Rank:
			why = errors.New("not reached")
		case acceptErrs[r] != nil:
			why = acceptErrs[r]
		default:
			why = errors.New("never dialed in")
		}
		e.causes = append(e.causes, why)
	}
	if len(e.missing) == 0 {
		return cerr
	}
	return &transport.PeerError{Rank: e.missing[0], Addr: w.Addrs[e.missing[0]], Op: "connect", Err: e}
}

// missingRanksError is the context's error plus, for each rank still missing,
// the reason it is missing. It unwraps to all of them, so errors.Is finds the
// context's error and errors.As finds a *transport.HandshakeError among them.
type missingRanksError struct {
	ctxErr  error
	missing []int
	causes  []error
}

func (e *missingRanksError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: ranks %v not connected (", e.ctxErr, e.missing)
	for i, r := range e.missing {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "rank %d: %v", r, e.causes[i])
	}
	b.WriteString(")")
	return b.String()
}

func (e *missingRanksError) Unwrap() []error {
	return append([]error{e.ctxErr}, e.causes...)
}

// dialPeer dials rank peer until it connects, refuses for good or ctx ends.
func (m *Connector) dialPeer(ctx context.Context, w *transport.World, peer int, key worldKey) (transport.Link, error) {
	addr := w.Addrs[peer]
	backoff := m.cfg.DialRetry
	var last error
	for {
		l, err := m.dialOnce(ctx, w, peer, key)
		if err == nil {
			return l, nil
		}
		var he *transport.HandshakeError
		if errors.As(err, &he) && he.Fatal {
			return nil, err
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		m.log(slog.LevelDebug, "dial failed, retrying", "rank", peer, "addr", addr, "err", err, "retry_in", backoff)
		// Jitter keeps ranks that started together from retrying in lockstep.
		timer := time.NewTimer(backoff/2 + mrand.N(backoff/2+1))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("%w after: %v", errGaveUp, last)
		}
		backoff = min(2*backoff, max(maxDialRetry, m.cfg.DialRetry))
	}
}

// dialOnce makes one connection attempt and runs the dialer's side of the
// handshake: on the link's first lane, then on all of its further lanes at
// once. The further lanes wait for the first one's verdict because each
// carries a nonce tied to the first lane's hello and challenge, and the
// acceptor ties a further lane to a first lane it has already taken (it
// refuses one that comes before); after that they are independent, so a
// link takes two handshakes' time however many lanes it has.
func (m *Connector) dialOnce(ctx context.Context, w *transport.World, peer int, key worldKey) (transport.Link, error) {
	addr := w.Addrs[peer]
	c, err := m.cfg.Dial(ctx, addr)
	if err != nil {
		return nil, &transport.PeerError{Rank: peer, Addr: addr, Op: "connect", Err: err}
	}
	n := lanesOf(c)
	first, err := m.dialHandshake(ctx, c, w, peer, key, n, 0, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if n == 1 {
		return c.Link(peer, addr, key.job, key.epoch, w.Rank, first.keys), nil
	}
	conns := make([]Conn, n)
	keys := make([]framesec.Keys, n)
	errs := make([]error, n)
	conns[0], keys[0] = c, first.keys
	// The first lane to fail stops the others: the link is dialled again
	// as a whole.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for lane := 1; lane < n; lane++ {
		wg.Go(func() {
			lc, err := m.cfg.Dial(lctx, addr)
			if err != nil {
				errs[lane] = &transport.PeerError{Rank: peer, Addr: addr, Op: "connect", Err: fmt.Errorf("lane %d: %w", lane, err)}
				cancel()
				return
			}
			nonce := handshake.LaneNonce(m.cfg.Secret, first.hello[:], &first.nonceA, uint8(lane))
			hs, err := m.dialHandshake(lctx, lc, w, peer, key, n, lane, &nonce)
			if err != nil {
				lc.Close()
				errs[lane] = err
				cancel()
				return
			}
			conns[lane], keys[lane] = lc, hs.keys
		})
	}
	wg.Wait()
	if err := firstLaneError(ctx, errs); err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return c.(LaneConn).LinkLanes(conns, keys, peer, addr, key.job, key.epoch, w.Rank), nil
}

// firstLaneError picks the error a failed link reports from its lanes'
// errors: a refusal for good (which ends the dialling) before any other,
// and a lane's own failure before one caused by another lane's stopping
// it (a context error while ctx itself is live).
func firstLaneError(ctx context.Context, errs []error) error {
	var fatal, own, any error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if any == nil {
			any = err
		}
		var he *transport.HandshakeError
		if errors.As(err, &he) && he.Fatal && fatal == nil {
			fatal = err
		}
		if own == nil && (ctx.Err() != nil || !errors.Is(err, context.Canceled)) {
			own = err
		}
	}
	switch {
	case fatal != nil:
		return fatal
	case own != nil:
		return own
	}
	return any
}

// handshaken is what the dialer's side of one connection's handshake yields:
// the connection's keys, and the hello and acceptor nonce that the link's
// further lanes are tied to.
type handshaken struct {
	keys   framesec.Keys
	hello  [handshake.HelloSize]byte
	nonceA [handshake.NonceSize]byte
}

// laneGroup is, on the accepting side, a link whose lanes are arriving:
// lanes[i] is lane i's arrival, nil until it comes.
type laneGroup struct{ lanes []*Arrival }

// fits reports whether a, a lane past the first, belongs to g: the lane
// is still missing and its hello carries the nonce that ties it to g's
// first lane.
func (g *laneGroup) fits(secret []byte, a *Arrival) bool {
	if g == nil || a.hello.Lanes != uint8(len(g.lanes)) || g.lanes[a.hello.Lane] != nil {
		return false
	}
	first := g.lanes[0]
	want := handshake.LaneNonce(secret, first.helloBytes[:], &first.nonceA, a.hello.Lane)
	return handshake.MACEqual(&want, &a.hello.Nonce)
}

func (g *laneGroup) complete() bool {
	for _, a := range g.lanes {
		if a == nil {
			return false
		}
	}
	return true
}

func (g *laneGroup) link(peer int, addr string, job, epoch uint64, self int) transport.Link {
	conns := make([]Conn, len(g.lanes))
	keys := make([]framesec.Keys, len(g.lanes))
	for i, a := range g.lanes {
		conns[i], keys[i] = a.conn, a.keys
	}
	return conns[0].(LaneConn).LinkLanes(conns, keys, peer, addr, job, epoch, self)
}

// close drops an unfinished group's connections; g may be nil.
func (g *laneGroup) close() {
	if g == nil {
		return
	}
	for _, a := range g.lanes {
		if a != nil {
			a.conn.Close()
		}
	}
}

// dialHandshake runs the dialer's side of the handshake on c, lane `lane`
// of a link of `lanes`, and returns the connection's keys. A lane past the
// first carries laneNonce as its hello's nonce.
func (m *Connector) dialHandshake(ctx context.Context, c Conn, w *transport.World, peer int, key worldKey, lanes, lane int, laneNonce *[handshake.NonceSize]byte) (handshaken, error) {
	var none handshaken
	addr := w.Addrs[peer]
	ioErr := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return &transport.PeerError{Rank: peer, Addr: addr, Op: "connect", Err: fmt.Errorf("handshake: %w", err)}
	}
	refused := func(s handshake.Status, reason string) error {
		msg := "refused: " + s.String()
		if reason != "" {
			msg += ": " + reason
		}
		return &transport.HandshakeError{Rank: peer, Addr: addr, Reason: msg, Fatal: s.Fatal()}
	}
	malformed := func(err error) error {
		return &transport.HandshakeError{Rank: peer, Addr: addr, Reason: reasonOf(err), Fatal: true}
	}
	// ctx's end wakes whichever message is under way; the connection is not
	// used after that.
	stop := context.AfterFunc(ctx, c.Interrupt)
	defer stop()

	hello := handshake.Hello{
		JobHash:  key.job,
		Epoch:    key.epoch,
		From:     uint32(w.Rank),
		To:       uint32(peer),
		Size:     uint32(w.Size()),
		Security: m.linkSecurity(c),
		Lanes:    uint8(lanes),
		Lane:     uint8(lane),
	}
	if laneNonce != nil {
		hello.Nonce = *laneNonce
	} else {
		_, _ = rand.Read(hello.Nonce[:])
	}
	var hb [handshake.HelloSize]byte
	hello.Encode(hb[:])
	if err := c.WriteMsg(hb[:], false); err != nil {
		return none, ioErr(err)
	}

	var cb [handshake.ChallengeSize]byte
	if err := c.ReadMsg(cb[:]); err != nil {
		return none, ioErr(err)
	}
	var ch handshake.Challenge
	if err := handshake.DecodeChallenge(cb[:], &ch); err != nil {
		return none, malformed(err)
	}
	if ch.Status != handshake.StatusOK {
		return none, refused(ch.Status, ch.Reason)
	}
	want := handshake.AcceptorMAC(m.cfg.Secret, hb[:], &ch.Nonce)
	if !handshake.MACEqual(&want, &ch.MAC) {
		// Answer with a proof that cannot verify (and reveals nothing), so the
		// acceptor's Connect learns of the mismatch too instead of waiting for us.
		var zero [handshake.ResponseSize]byte
		(&handshake.Response{}).Encode(zero[:])
		_ = c.WriteMsg(zero[:], true)
		return none, &transport.HandshakeError{Rank: peer, Addr: addr, Fatal: true, Reason: "peer failed authentication (wrong secret?)"}
	}
	resp := handshake.Response{MAC: handshake.DialerMAC(m.cfg.Secret, hb[:], &ch.Nonce, &hello.Nonce)}
	var rb [handshake.ResponseSize]byte
	resp.Encode(rb[:])
	if err := c.WriteMsg(rb[:], false); err != nil {
		return none, ioErr(err)
	}

	var vb [handshake.VerdictSize]byte
	if err := c.ReadMsg(vb[:]); err != nil {
		return none, ioErr(err)
	}
	var v handshake.Verdict
	if err := handshake.DecodeVerdict(vb[:], &v); err != nil {
		return none, malformed(err)
	}
	if v.Status != handshake.StatusOK {
		return none, refused(v.Status, v.Reason)
	}
	// Interrupted after all: the connection may be half closed.
	if !stop() {
		return none, ioErr(ctx.Err())
	}
	keys, err := framesec.Derive(hello.Security, m.cfg.Secret, hb[:], ch.Nonce[:], hello.Nonce[:], true)
	if err != nil {
		return none, &transport.HandshakeError{Rank: peer, Addr: addr, Fatal: true, Reason: "link keys could not be derived: " + err.Error()}
	}
	return handshaken{keys: keys, hello: hb, nonceA: ch.Nonce}, nil
}
