package sctp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Connect connects this worker to every other rank of w: it dials each lower
// rank and waits for each higher rank to dial in. It returns one link per rank
// (links[w.Rank] is nil) or, having closed everything it opened, an error naming
// the rank that failed, exactly as the TCP transport's Connect does: a
// *transport.HandshakeError when a peer it dialed refused it or failed
// authentication, a *transport.PeerError otherwise; when ctx ends first, the
// PeerError lists every rank still missing and why.
func (t *Transport) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	size := w.Size()
	if size == 1 {
		return []transport.Link{nil}, nil
	}
	if size > transport.MaxWorldSize {
		return nil, fmt.Errorf("sctp: world of %d ranks over the limit %d", size, transport.MaxWorldSize)
	}
	for r := 0; r < w.Rank; r++ {
		if w.Addrs[r] == "" {
			return nil, fmt.Errorf("sctp: world has no address for rank %d", r)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := worldKey{transport.JobHash(w.JobID), w.Epoch}
	pw, err := t.register(key, &w)
	if err != nil {
		return nil, err
	}
	defer t.unregister(key, pw)

	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type dialed struct {
		rank int
		l    *link
		err  error
	}
	results := make(chan dialed, w.Rank)
	var wg sync.WaitGroup
	for r := 0; r < w.Rank; r++ {
		wg.Go(func() {
			l, err := t.dialPeer(dctx, &w, r, key)
			results <- dialed{r, l, err}
		})
	}

	links := make([]*link, size)
	dialErrs := make([]error, w.Rank)
	have, dialsLeft := 0, w.Rank
	var failure error
	for have < size-1 && failure == nil {
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
			for _, ac := range t.take(pw) {
				from := int(ac.hello.From)
				if s, reason := pw.check(&ac.hello); s != transport.StatusOK {
					t.log.Info("gorovod sctp: refusing peer", "remote", ac.remote, "rank", from, "status", s, "reason", reason)
					t.writeVerdict(ac.c, s, reason)
					ac.c.close()
					continue
				}
				if !t.writeVerdict(ac.c, transport.StatusOK, "") {
					ac.c.close()
					continue
				}
				l := newLink(ac.c, from, w.Addrs[from], key.job, key.epoch, w.Rank, &t.cfg)
				if old := links[from]; old != nil {
					// The dialer gave up on its previous association (it never
					// saw our verdict), so this one is the one it will use.
					old.Close()
				} else {
					have++
				}
				links[from] = l
			}
		case <-ctx.Done():
			failure = ctx.Err()
		case <-t.done:
			failure = ErrClosed
		}
	}
	if failure == nil {
		wg.Wait()
		out := make([]transport.Link, size)
		for r, l := range links {
			if l != nil {
				out[r] = l
			}
		}
		return out, nil
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
			acceptErrs[r] = t.authFailure(pw, r)
		}
		return nil, missingError(&w, links, dialErrs, acceptErrs, cerr)
	}
	return nil, failure
}

// errGaveUp marks a dial that stopped because its context ended.
var errGaveUp = errors.New("gave up")

// missingError names every rank not connected when ctx ended, with why when known.
func missingError(w *transport.World, links []*link, dialErrs, acceptErrs []error, cerr error) error {
	e := &missingRanksError{ctxErr: cerr}
	for r := range links {
		if r == w.Rank || links[r] != nil {
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
// why; it unwraps to all of them.
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
func (t *Transport) dialPeer(ctx context.Context, w *transport.World, peer int, key worldKey) (*link, error) {
	addr := w.Addrs[peer]
	backoff := t.cfg.DialRetry
	var last error
	for {
		l, err := t.dialOnce(ctx, w, peer, key)
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
		t.log.Debug("gorovod sctp: dial failed, retrying", "rank", peer, "addr", addr, "err", err, "retry_in", backoff)
		timer := time.NewTimer(backoff/2 + mrand.N(backoff/2+1))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("%w after: %v", errGaveUp, last)
		}
		backoff = min(2*backoff, max(maxDialRetry, t.cfg.DialRetry))
	}
}

// dialOnce sets up one association and runs the dialer's side of the handshake.
func (t *Transport) dialOnce(ctx context.Context, w *transport.World, peer int, key worldKey) (*link, error) {
	addr := w.Addrs[peer]
	c, err := t.dialAssoc(ctx, addr)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return nil, &transport.PeerError{Rank: peer, Addr: addr, Op: "connect", Err: err}
	}
	if err := t.dialHandshake(ctx, c, w, peer, key); err != nil {
		c.close()
		return nil, err
	}
	return newLink(c, peer, addr, key.job, key.epoch, w.Rank, &t.cfg), nil
}

func (t *Transport) dialHandshake(ctx context.Context, c *sconn, w *transport.World, peer int, key worldKey) error {
	addr := w.Addrs[peer]
	ioErr := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return &transport.PeerError{Rank: peer, Addr: addr, Op: "connect", Err: fmt.Errorf("handshake: %w", err)}
	}
	refused := func(s transport.HandshakeStatus, reason string) error {
		msg := "refused: " + s.String()
		if reason != "" {
			msg += ": " + reason
		}
		return &transport.HandshakeError{Rank: peer, Addr: addr, Reason: msg, Fatal: s.Fatal()}
	}
	malformed := func(err error) error {
		return &transport.HandshakeError{Rank: peer, Addr: addr, Reason: reasonOf(err), Fatal: true}
	}
	// Each read gets its own timeout; ctx's end closes the socket, which ends
	// any of them.
	deadline := func() time.Time {
		dl := time.Now().Add(t.cfg.HandshakeTimeout)
		if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
			dl = cd
		}
		return dl
	}
	stop := context.AfterFunc(ctx, func() { _ = c.udp.Close() })
	defer stop()

	hello := transport.Hello{JobHash: key.job, Epoch: key.epoch, From: uint32(w.Rank), To: uint32(peer), Size: uint32(w.Size())}
	_, _ = rand.Read(hello.Nonce[:])
	var hb [transport.HelloSize]byte
	hello.Encode(hb[:])
	if err := c.writeMsg(hb[:]); err != nil {
		return ioErr(err)
	}
	var cb [transport.ChallengeSize]byte
	if err := c.readMsg(cb[:], deadline()); err != nil {
		return ioErr(err)
	}
	var ch transport.Challenge
	if err := transport.DecodeChallenge(cb[:], &ch); err != nil {
		return malformed(err)
	}
	if ch.Status != transport.StatusOK {
		return refused(ch.Status, ch.Reason)
	}
	want := transport.AcceptorMAC(t.cfg.Secret, hb[:], &ch.Nonce)
	if !transport.MACEqual(&want, &ch.MAC) {
		// Answer with a proof that cannot verify, so the acceptor's Connect
		// learns of the mismatch too instead of waiting for us.
		var zero [transport.ResponseSize]byte
		(&transport.Response{}).Encode(zero[:])
		if c.writeMsg(zero[:]) == nil {
			c.flush(deadline())
		}
		return &transport.HandshakeError{Rank: peer, Addr: addr, Fatal: true, Reason: "peer failed authentication (wrong secret?)"}
	}
	resp := transport.Response{MAC: transport.DialerMAC(t.cfg.Secret, hb[:], &ch.Nonce, &hello.Nonce)}
	var rb [transport.ResponseSize]byte
	resp.Encode(rb[:])
	if err := c.writeMsg(rb[:]); err != nil {
		return ioErr(err)
	}
	// The acceptor answers once its Connect claims us, which may take up to half
	// a handshake timeout: the verdict gets a fresh one.
	var vb [transport.VerdictSize]byte
	if err := c.readMsg(vb[:], deadline()); err != nil {
		return ioErr(err)
	}
	var v transport.Verdict
	if err := transport.DecodeVerdict(vb[:], &v); err != nil {
		return malformed(err)
	}
	if v.Status != transport.StatusOK {
		return refused(v.Status, v.Reason)
	}
	if !stop() {
		return ioErr(ctx.Err())
	}
	return nil
}
