package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/gorovod/gorovod/collective/transport"
)

// Point-to-point messages (Send, Recv) travel on the links the collectives
// use, between the collectives' frames, outside their one-order-for-all rule:
// a rank sends to one peer when it likes, and the peer takes the message when
// it posts a receive for it.
//
// Framing. A message is a run of data frames of collective kind collP2P, at
// most ChunkBytes each: Tag is the caller's tag, Seq numbers the sender's
// messages to that peer with that tag (from 1: a sequence space per (peer,
// tag), apart from the collectives', whose frames have other Coll values), Count
// is the message's length in bytes, announced by every frame, and Step the
// frame's index. A sender sends one message's frames to a peer at a time,
// so a message's frames are consecutive among the p2p data frames on a
// link; control frames (below) and the collectives' frames may come between
// them. Flags says what a p2p frame is
// (p2pFrameKind).
//
// Eager and rendezvous. A message of at most p2pEagerBytes goes at once
// (eager) while the sender holds enough credit for it: the eager bytes
// (frames with their headers) on a link that the receiver has not taken
// off yet stay within p2pEagerWindow, which the links buffer
// (transport.InlinePayload), so eager frames never hold a link's sending
// side while the peer is not reading. The receiver gives credit back
// (p2pCredit frames) as receives take eager messages (one kept for a
// receive not posted yet holds its credit, so at most the window is kept
// per peer). A larger message, or one the credit does not cover, would
// fill the link, and a collective this rank starts next, whose first move
// is a send to that peer, would wait behind it for a reader that, on the
// peer, may be stuck the same way (both ranks isend, then all_reduce, then
// irecv). So such a message goes by rendezvous: the sender sends a
// ready-to-send frame (p2pRTS, no payload) and waits, without holding the
// link; the receiver, once a receive with that tag is posted (or at once
// if one is), answers with a clear-to-send (p2pCTS) naming the receive
// buffer's length; only then do the data frames (p2pRendezvous) follow,
// straight into the posted buffer: no copy, and nothing is kept for a
// receive not yet posted but the announcement. A clear-to-send of another
// length than the message refuses it: both sides drop it with a
// *SizeMismatchError and go on.
//
// Receiving. Whoever reads a link takes the p2p frames off it: a collective
// that finds one where it expects its own hands it over (receiveFrame) and
// reads on; and a pump goroutine per peer with a receive posted (or a
// send waiting for its clear-to-send) reads the link while no collective
// has claimed it. A collective claims a link when
// it first reads it (claim: the pump stops after the frame it is reading)
// and holds it until it ends; so during a collective the pumps go on
// draining the links it has not read yet, and a peer whose collective
// frames wait behind its message's frames is not stuck while this rank's
// collective is busy elsewhere (sending to that peer, say). A pump that
// reads a collective's frame keeps its header for the collective (pending)
// and stops: the stream cannot be read past it until this rank runs that
// collective. A message goes straight into the first posted receive with its
// tag (in posting order); an eager one that comes before its receive is
// kept (bounded by Config.P2PBufferBytes) until one is posted, and a
// rendezvous one is kept as its announcement only. A pump also reads while
// a Send waits for its clear-to-send.
//
// Any source. A receive from any rank (RecvAny) takes the earliest kept
// message with its tag, if there is one (kept messages are stamped in the
// order they came, across peers); else it is posted to every peer's list at
// once, in each at its place in posting order, and the first message with
// its tag from any peer takes it out of all of them (takePosted). A pump
// then no longer wanted stops its wait for the next header (a header wait
// cut short leaves the stream where it was), so a peer that stays silent
// does not keep a read open on its link. A receive from any of some ranks
// (PostRecvAnyOf: a process set's members) is the same over those peers
// only: the others' messages with its tag stay for other receives.
//
// Failures. A message whose length differs from the receive's buffer fails
// that receive with a *SizeMismatchError and is dropped (so does a refused
// rendezvous message its Send); the world goes on. Everything else that goes
// wrong — the peer dies, stalls past the I/O timeout, aborts, a frame out of
// sequence, a Send or Recv whose context ends part-way (a Send waiting for
// its clear-to-send included) — fails the communicator, as a failed
// collective does: the streams may be out of step.

// collP2P is the Coll value of point-to-point frames.
const collP2P collKind = 64

// DefaultP2PBufferBytes is Config.P2PBufferBytes' default.
const DefaultP2PBufferBytes = 256 << 20

// p2pEagerBytes is the largest message sent without waiting for the
// receiver's clear-to-send: what every link buffers.
const p2pEagerBytes = transport.InlinePayload

// p2pEagerWindow bounds a sender's eager bytes, headers included, that its
// peer has not taken off the link yet (its credit): a few inline frames'
// worth, which every link buffers beside the collectives' own.
const p2pEagerWindow = 2 * transport.InlinePayload

// eagerCost is what an eager message of n bytes in frames of at most chunk
// bytes takes of the window.
func eagerCost(n, chunk int) int {
	frames := max(1, (n+chunk-1)/chunk)
	return n + frames*transport.HeaderSize
}

// p2pFrameKind is a p2p frame's Flags: what the frame is.
type p2pFrameKind uint8

const (
	p2pEager      p2pFrameKind = 0 // a data frame of an eager message
	p2pRTS        p2pFrameKind = 1 // ready-to-send: a message of Count bytes waits
	p2pCTS        p2pFrameKind = 2 // clear-to-send: the receive buffer has Count bytes
	p2pRendezvous p2pFrameKind = 3 // a data frame of a cleared message
	p2pCredit     p2pFrameKind = 4 // Count eager bytes were taken off the link
)

// checkP2PFrame checks what a p2p frame's header says by itself: a known
// kind, and no payload on the control frames (which are one frame each).
// What it says against the link's state (receiveFrame) comes after.
func checkP2PFrame(h *transport.Header) (p2pFrameKind, error) {
	k := p2pFrameKind(h.Flags)
	switch k {
	case p2pEager, p2pRendezvous:
		if uint64(h.Length) > h.Count {
			return k, fmt.Errorf("a frame of %d bytes in a %d-byte message", h.Length, h.Count)
		}
	case p2pRTS, p2pCTS, p2pCredit:
		if h.Step != 0 || h.Length != 0 {
			return k, fmt.Errorf("a control frame (kind %d) with step %d and %d payload bytes", k, h.Step, h.Length)
		}
	default:
		return k, fmt.Errorf("unknown frame kind %d", k)
	}
	return k, nil
}

// SizeMismatchError is a Recv's error when the message that matched it (the
// peer's next message with its tag) is not as long as the receive buffer,
// and a Send's when the peer's receive refused a message sent by rendezvous
// for that reason. The message is dropped and the communicator goes on.
type SizeMismatchError struct {
	Peer      int    // the other rank: the sender's for a Recv, the receiver's for a Send
	Tag       uint64 // the message's tag
	Sent      uint64 // the message's length in bytes
	Receiving int    // the receive buffer's length in bytes
	// Refused: the error of a Send, whose receiver refused the message.
	Refused bool
}

func (e *SizeMismatchError) Error() string {
	if e.Refused {
		return fmt.Sprintf("collective: rank %d refused the message of %d bytes with tag %d: its receive buffer is %d bytes", e.Peer, e.Sent, e.Tag, e.Receiving)
	}
	return fmt.Sprintf("collective: the message with tag %d from rank %d is %d bytes, the receive buffer %d", e.Tag, e.Peer, e.Sent, e.Receiving)
}

// p2pRecv is a posted receive.
type p2pRecv struct {
	tag  uint64
	buf  []byte
	done chan struct{}
	err  error
	// anySource: a receive from any rank (RecvAny), posted to every
	// peer at once until one's message takes it (takePosted); from is
	// that peer.
	anySource bool
	from      int
	// among are the ranks an any-source receive takes a message from
	// (PostRecvAnyOf); nil: every rank but this one.
	among    []int
	finished bool // finish ran (under mu): an any-source receive is in several lists
}

// p2pMsg is a message being received or one kept until its receive is
// posted.
type p2pMsg struct {
	tag, seq uint64
	size     uint64
	// into is where its bytes go: the receive's buffer, a kept copy, or nil
	// when it is being dropped (size mismatch).
	into []byte
	recv *p2pRecv // the receive it goes into; nil when kept or dropped
	next uint32   // the next frame's Step
	got  uint64   // bytes received so far
	// rendezvous: announced by a ready-to-send; its frames come only
	// after this rank's clear-to-send. Kept, it holds no bytes.
	rendezvous bool
	// arrived orders the kept messages of all peers (p2pState.arrivals
	// when it was kept): an any-source receive takes the earliest.
	arrived uint64
}

// p2pKey names a message: its tag and its number among the sender's
// messages to the receiver with that tag.
type p2pKey struct{ tag, seq uint64 }

// p2pClear is a Send waiting for the peer's clear-to-send.
type p2pClear struct {
	tag, seq uint64
	done     chan struct{} // closed by the clear-to-send or a failure
	// receiving is the receive buffer's length the clear-to-send named;
	// err the communicator's failure, when that came first.
	receiving uint64
	err       error
}

// p2pPeer is one peer's point-to-point state (p2pState.mu).
type p2pPeer struct {
	posted []*p2pRecv // unmatched receives, in posting order
	// kept: complete eager messages and announced rendezvous ones no
	// receive took yet, in arrival order.
	kept    []*p2pMsg
	current *p2pMsg // the message whose frames are arriving
	// cleared are the rendezvous messages this rank sent a clear-to-send
	// for, with their receives, until a message's first frame makes it
	// current.
	cleared map[p2pKey]*p2pMsg
	// awaiting are this rank's Sends waiting for the peer's
	// clear-to-send.
	awaiting map[p2pKey]*p2pClear
	// controls counts the control frames (clear-to-send, credit) being
	// sent to the peer.
	controls int
	// credit is what this rank may still send eagerly to the peer
	// (p2pEagerWindow less the eager bytes the peer has not given back);
	// owed is what this rank took off the link from the peer and has not
	// given back yet.
	credit, owed int
	recvSeq      map[uint64]uint64 // per tag: the last message's Seq
	sendSeq      map[uint64]uint64 // per tag: the last Seq sent
	// lastPosted is closed once the last send posted to the peer took its
	// number (PostedSend).
	lastPosted <-chan struct{}
	// sending is held (a one-slot semaphore) by the Send that has the
	// link: a message's frames go out together.
	sending chan struct{}
	pumping bool
	// claimed: the running collective reads this link (claim), until it
	// ends; the pump does not start a read meanwhile.
	claimed bool
	// readDone is non-nil while the pump reads a frame, closed when done;
	// stopRead ends the pump's wait for a frame's header (nothing of the
	// stream is consumed then) when the peer is no longer wanted: an
	// any-source receive another peer's message took, or withdrawn.
	readDone chan struct{}
	stopRead context.CancelFunc
	// pending is a collective's frame header the pump read; hasPending
	// says it is there.
	pending    transport.Header
	hasPending bool
}

// p2pState is the point-to-point state of a communicator, shared with its
// subsets (their links are its), indexed by its ranks.
type p2pState struct {
	mu        sync.Mutex
	cond      *sync.Cond // a collective ended, receives changed, failure
	peers     []p2pPeer
	keptBytes int
	limit     int
	err       error  // the communicator's failure, once p2p saw it
	arrivals  uint64 // messages kept so far (p2pMsg.arrived)
	// fail stops the communicator (the root one) with an error.
	fail func(error)
}

func newP2PState(n, limit int, fail func(error)) *p2pState {
	p := &p2pState{peers: make([]p2pPeer, n), limit: limit, fail: fail}
	p.cond = sync.NewCond(&p.mu)
	none := make(chan struct{}) // no send posted before the first
	close(none)
	for i := range p.peers {
		p.peers[i].lastPosted = none
		p.peers[i].recvSeq = map[uint64]uint64{}
		p.peers[i].sendSeq = map[uint64]uint64{}
		p.peers[i].sending = make(chan struct{}, 1)
		p.peers[i].credit = p2pEagerWindow
		p.peers[i].cleared = map[p2pKey]*p2pMsg{}
		p.peers[i].awaiting = map[p2pKey]*p2pClear{}
	}
	return p
}

// leave ends a collective's claims on the links (see claim): the pumps
// may read them again.
func (p *p2pState) leave() {
	p.mu.Lock()
	for i := range p.peers {
		p.peers[i].claimed = false
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// stop fails every posted receive with err and stops the pumps (the
// communicator failed or closed).
func (p *p2pState) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	for i := range p.peers {
		pp := &p.peers[i]
		for _, r := range pp.posted {
			r.finish(p.err)
		}
		pp.posted = nil
		if m := pp.current; m != nil && m.recv != nil {
			m.recv.finish(p.err)
			m.recv = nil
		}
		for _, m := range pp.cleared {
			if m.recv != nil {
				m.recv.finish(p.err)
				m.recv = nil
			}
		}
		for k, w := range pp.awaiting {
			w.err = p.err
			close(w.done)
			delete(pp.awaiting, k)
		}
	}
	p.cond.Broadcast()
}

// halt is stop for a communicator handing its links over (Release): it
// also reports, per peer, whether point-to-point traffic is on the link —
// a pump reading or about to, a send holding it, a message part-way in or
// kept, a collective's header the pump read. With err set no receive is
// posted and no pump starts afterwards; a send that had not taken its link
// yet finds the communicator failed.
func (p *p2pState) halt(err error) []bool {
	p.stop(err)
	p.mu.Lock()
	defer p.mu.Unlock()
	busy := make([]bool, len(p.peers))
	for i := range p.peers {
		pp := &p.peers[i]
		busy[i] = pp.pumping || pp.readDone != nil || pp.current != nil || len(pp.kept) > 0 ||
			pp.hasPending || len(pp.sending) > 0 || len(pp.cleared) > 0 || len(pp.awaiting) > 0 || pp.controls > 0
	}
	return busy
}

// finish completes r (under mu); an any-source receive posted to several
// peers is finished once.
func (r *p2pRecv) finish(err error) {
	if r.finished {
		return
	}
	r.finished = true
	r.err = err
	close(r.done)
}

// wanted says whether the pump should read the peer's link (under mu): a
// receive is posted, a message part-way in or cleared (its receive is no
// longer among the posted ones), or a Send waits for its clear-to-send.
func (pp *p2pPeer) wanted() bool {
	return len(pp.posted) > 0 || pp.current != nil || len(pp.cleared) > 0 || len(pp.awaiting) > 0
}

// keep adds message m to peer's kept ones (under mu), stamped for the
// any-source receives.
func (p *p2pState) keep(peer int, m *p2pMsg) {
	p.arrivals++
	m.arrived = p.arrivals
	p.peers[peer].kept = append(p.peers[peer].kept, m)
}

// takePosted takes the first receive posted for peer's messages with tag
// (under mu), or nil. An any-source receive leaves the other peers' lists
// too, and records peer as its source.
func (p *p2pState) takePosted(peer int, tag uint64) *p2pRecv {
	pp := &p.peers[peer]
	i := slices.IndexFunc(pp.posted, func(r *p2pRecv) bool { return r.tag == tag })
	if i < 0 {
		return nil
	}
	r := pp.posted[i]
	pp.posted = slices.Delete(pp.posted, i, i+1)
	if r.anySource {
		r.from = peer
		p.withdraw(r)
	}
	return r
}

// withdraw removes any-source receive r from every peer's posted list
// (under mu), and stops the header wait of each pump no longer wanted.
func (p *p2pState) withdraw(r *p2pRecv) {
	for i := range p.peers {
		pp := &p.peers[i]
		j := slices.Index(pp.posted, r)
		if j < 0 {
			continue
		}
		pp.posted = slices.Delete(pp.posted, j, j+1)
		if !pp.wanted() && pp.stopRead != nil {
			pp.stopRead()
		}
	}
	p.cond.Broadcast()
}

// claim is the start of a collective's receive from peer (a root rank): it
// claims the link for the collective until it ends (leave), waits for the
// pump's read on it, if one is under way, and returns the header the pump
// kept for the collective, if it did.
func (p *p2pState) claim(ctx context.Context, peer int, h *transport.Header) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := &p.peers[peer]
	pp.claimed = true
	for pp.readDone != nil {
		done := pp.readDone
		p.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			p.mu.Lock()
			return false, &transport.PeerError{Rank: peer, Op: "recv", Err: ctx.Err()}
		}
		p.mu.Lock()
	}
	if !pp.hasPending {
		return false, nil
	}
	*h = pp.pending
	pp.hasPending = false
	return true, nil
}

// isP2P says whether a received header is a point-to-point frame.
func isP2P(h *transport.Header) bool {
	return h.Kind == transport.FrameData && collKind(h.Coll) == collP2P
}

// receiveFrame takes the p2p frame whose header h was just read from l
// (peer is a root rank): it checks the frame against the message it belongs
// to and reads its payload where the message goes. Only one goroutine at a
// time reads a link, so the message's state is that goroutine's while it
// reads; the lock guards the lists others post to.
func (p *p2pState) receiveFrame(ctx context.Context, l transport.Link, peer int, h *transport.Header) error {
	kind, err := checkP2PFrame(h)
	if err != nil {
		return p.protocolError(peer, h, "%v", err)
	}
	p.mu.Lock()
	pp := &p.peers[peer]
	switch kind {
	case p2pCTS:
		defer p.mu.Unlock()
		return p.receiveClear(peer, h)
	case p2pRTS:
		defer p.mu.Unlock()
		return p.receiveAnnouncement(l, peer, h)
	case p2pCredit:
		defer p.mu.Unlock()
		if h.Count > uint64(p2pEagerWindow-pp.credit) {
			return p.protocolError(peer, h, "%d bytes of credit given back where %d were taken", h.Count, p2pEagerWindow-pp.credit)
		}
		pp.credit += int(h.Count)
		return nil
	}
	m := pp.current
	if m == nil {
		if h.Step != 0 {
			p.mu.Unlock()
			return p.protocolError(peer, h, "a message's frame %d came before its frame 0", h.Step)
		}
		if kind == p2pRendezvous {
			key := p2pKey{h.Tag, h.Seq}
			m = pp.cleared[key]
			if m == nil || m.size != h.Count {
				p.mu.Unlock()
				return p.protocolError(peer, h, "message %d with tag %d came by rendezvous without this rank's clear-to-send", h.Seq, h.Tag)
			}
			delete(pp.cleared, key)
			if m.recv == nil {
				// stop failed its receive; the failure reaches the
				// reader through p.err below.
				m.into = nil
			}
		} else {
			if want := pp.recvSeq[h.Tag] + 1; h.Seq != want {
				p.mu.Unlock()
				return p.protocolError(peer, h, "message %d with tag %d came where message %d was due", h.Seq, h.Tag, want)
			}
			m = &p2pMsg{tag: h.Tag, seq: h.Seq, size: h.Count}
			if r := p.takePosted(peer, h.Tag); r != nil {
				if uint64(len(r.buf)) == h.Count {
					m.into, m.recv = r.buf, r
				} else {
					r.finish(&SizeMismatchError{Peer: peer, Tag: h.Tag, Sent: h.Count, Receiving: len(r.buf)})
				}
			} else {
				if h.Count > uint64(p.limit-p.keptBytes) {
					p.mu.Unlock()
					return fmt.Errorf("collective: rank %d sent a message of %d bytes with tag %d before this rank posted its receive, and %d bytes of such messages are kept already (Config.P2PBufferBytes %d)", peer, h.Count, h.Tag, p.keptBytes, p.limit)
				}
				p.keptBytes += int(h.Count)
				m.into = make([]byte, h.Count)
			}
			pp.recvSeq[h.Tag] = h.Seq
		}
		pp.current = m
	}
	p.mu.Unlock()
	switch {
	case h.Tag != m.tag || h.Seq != m.seq:
		return p.protocolError(peer, h, "a frame of message %d with tag %d came inside message %d with tag %d", h.Seq, h.Tag, m.seq, m.tag)
	case (kind == p2pRendezvous) != m.rendezvous:
		return p.protocolError(peer, h, "a frame of kind %d came inside message %d with tag %d", kind, m.seq, m.tag)
	case h.Step != m.next || h.Count != m.size:
		return p.protocolError(peer, h, "frame %d of a %d-byte message came where frame %d of a %d-byte message was due", h.Step, h.Count, m.next, m.size)
	case uint64(h.Length) > m.size-m.got || (h.Length == 0 && m.size > 0):
		return p.protocolError(peer, h, "a frame of %d bytes at byte %d of a %d-byte message", h.Length, m.got, m.size)
	}
	if m.into != nil {
		err = l.RecvPayload(ctx, m.into[m.got:m.got+uint64(h.Length)])
	} else {
		err = l.RecvPayload(ctx, make([]byte, h.Length))
	}
	if err != nil {
		return err
	}
	m.got += uint64(h.Length)
	m.next++
	if m.got < m.size {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pp.current = nil
	if p.err != nil {
		return p.err // stop failed its receive already
	}
	if !m.rendezvous && (m.recv != nil || m.into == nil) {
		p.consumed(l, peer, m) // received, or dropped (size mismatch)
	}
	switch {
	case m.recv != nil:
		m.recv.finish(nil)
	case m.into != nil:
		// Kept: a receive posted while it arrived takes it now.
		if r := p.takePosted(peer, m.tag); r != nil {
			p.deliverKept(l, peer, m, r)
		} else {
			p.keep(peer, m)
		}
	}
	p.cond.Broadcast()
	return nil
}

// receiveClear takes the peer's clear-to-send for this rank's waiting Send
// (under mu).
func (p *p2pState) receiveClear(peer int, h *transport.Header) error {
	pp := &p.peers[peer]
	key := p2pKey{h.Tag, h.Seq}
	w := pp.awaiting[key]
	if w == nil {
		return p.protocolError(peer, h, "a clear-to-send for message %d with tag %d, which this rank is not sending", h.Seq, h.Tag)
	}
	delete(pp.awaiting, key)
	w.receiving = h.Count
	close(w.done)
	p.cond.Broadcast()
	return nil
}

// receiveAnnouncement takes the peer's ready-to-send (under mu): the first
// posted receive with its tag clears it, or it is kept until one is posted
// (Recv). A kept announcement counts HeaderSize bytes against
// Config.P2PBufferBytes, so a peer announcing without end is bounded.
func (p *p2pState) receiveAnnouncement(l transport.Link, peer int, h *transport.Header) error {
	pp := &p.peers[peer]
	if pp.current != nil {
		return p.protocolError(peer, h, "message %d with tag %d announced inside message %d with tag %d", h.Seq, h.Tag, pp.current.seq, pp.current.tag)
	}
	if want := pp.recvSeq[h.Tag] + 1; h.Seq != want {
		return p.protocolError(peer, h, "message %d with tag %d came where message %d was due", h.Seq, h.Tag, want)
	}
	pp.recvSeq[h.Tag] = h.Seq
	m := &p2pMsg{tag: h.Tag, seq: h.Seq, size: h.Count, rendezvous: true}
	if r := p.takePosted(peer, h.Tag); r != nil {
		p.clear(l, peer, m, r)
		return nil
	}
	if transport.HeaderSize > p.limit-p.keptBytes {
		return fmt.Errorf("collective: rank %d announced a message of %d bytes with tag %d before this rank posted its receive, and %d bytes of such messages and announcements are kept already (Config.P2PBufferBytes %d)", peer, h.Count, h.Tag, p.keptBytes, p.limit)
	}
	p.keptBytes += transport.HeaderSize
	p.keep(peer, m)
	return nil
}

// clear answers announced message m with receive r (under mu): with a
// clear-to-send when r's buffer fits, and with a refusal (its length) that
// fails r when it does not.
func (p *p2pState) clear(l transport.Link, peer int, m *p2pMsg, r *p2pRecv) {
	pp := &p.peers[peer]
	if uint64(len(r.buf)) == m.size {
		m.into, m.recv = r.buf, r
		pp.cleared[p2pKey{m.tag, m.seq}] = m
	} else {
		r.finish(&SizeMismatchError{Peer: peer, Tag: m.tag, Sent: m.size, Receiving: len(r.buf)})
	}
	p.sendControl(l, peer, transport.Header{Kind: transport.FrameData, Coll: uint8(collP2P), Flags: uint8(p2pCTS), Tag: m.tag, Seq: m.seq, Count: uint64(len(r.buf))}, fmt.Sprintf("clear-to-send for message %d with tag %d", m.seq, m.tag))
}

// sendControl sends control frame h to peer from a goroutine of its own
// (under mu): the caller may be the reader a collective needs, and the
// link's sending side may be busy with frames the peer reads only later.
func (p *p2pState) sendControl(l transport.Link, peer int, h transport.Header, what string) {
	pp := &p.peers[peer]
	pp.controls++
	go func() {
		// The link's I/O timeout bounds the send.
		err := l.Send(context.Background(), &h, nil)
		p.mu.Lock()
		pp.controls--
		p.mu.Unlock()
		if err != nil {
			p.fail(fmt.Errorf("collective: sending the %s to rank %d: %w", what, peer, err))
		}
	}()
}

// consumed gives the window an eager message took back to its sender
// (under mu) once a receive took it (or refused it): a message kept for a
// receive not posted yet holds its share, so a sender whose messages are not
// received goes on by rendezvous, and the bytes kept per peer stay within
// the window. Credit goes back half a window at a time, so small messages
// do not each cost a frame.
func (p *p2pState) consumed(l transport.Link, peer int, m *p2pMsg) {
	pp := &p.peers[peer]
	pp.owed += int(m.size) + int(m.next)*transport.HeaderSize
	if pp.owed >= p2pEagerWindow/2 {
		p.sendControl(l, peer, transport.Header{Kind: transport.FrameData, Coll: uint8(collP2P), Flags: uint8(p2pCredit), Count: uint64(pp.owed)}, "credit")
		pp.owed = 0
	}
}

// deliverKept hands kept eager message m to receive r (under mu).
func (p *p2pState) deliverKept(l transport.Link, peer int, m *p2pMsg, r *p2pRecv) {
	p.consumed(l, peer, m)
	p.keptBytes -= int(m.size)
	if uint64(len(r.buf)) != m.size {
		r.finish(&SizeMismatchError{Peer: peer, Tag: m.tag, Sent: m.size, Receiving: len(r.buf)})
		return
	}
	copy(r.buf, m.into)
	r.finish(nil)
}

func (p *p2pState) protocolError(peer int, h *transport.Header, format string, args ...any) error {
	return &transport.FrameError{Peer: peer, Reason: "point-to-point: " + fmt.Sprintf(format, args...)}
}

// pump reads peer's link while receives from it are posted, a message
// from it is on its way in, or a Send to it waits for its clear-to-send,
// and no collective holds the links (see the package comment above).
func (p *p2pState) pump(l transport.Link, peer int) {
	p.mu.Lock()
	pp := &p.peers[peer]
	for {
		for p.err == nil && pp.wanted() && (pp.claimed || pp.hasPending) {
			p.cond.Wait()
		}
		if p.err != nil || !pp.wanted() {
			pp.pumping = false
			p.mu.Unlock()
			return
		}
		done := make(chan struct{})
		waitCtx, stopRead := context.WithCancel(context.Background())
		pp.readDone, pp.stopRead = done, stopRead
		p.mu.Unlock()
		err := p.pumpFrame(waitCtx, l, peer)
		p.mu.Lock()
		pp.readDone, pp.stopRead = nil, nil
		stopRead()
		close(done)
		if errors.Is(err, errHeaderWaitStopped) {
			continue // no longer wanted (withdraw): wanted() says so above
		}
		if err != nil {
			pp.pumping = false
			p.mu.Unlock()
			p.fail(err)
			return
		}
	}
}

// errHeaderWaitStopped: the pump's wait for a header was stopped
// (stopRead) before a header came; the stream is where it was.
var errHeaderWaitStopped = errors.New("collective: the wait for the next point-to-point frame was stopped")

// pumpFrame reads one frame from peer's link for the pump. The read waits
// as long as the link lets it (its I/O timeout) or until waitCtx ends (the
// peer is no longer wanted: errHeaderWaitStopped): a receive is posted or a
// Send waits for its clear-to-send, and the frames on the link are what it
// waits for. waitCtx bounds the header's wait only (a header wait cut short
// consumes nothing of the stream; a payload read cut short would break it).
func (p *p2pState) pumpFrame(waitCtx context.Context, l transport.Link, peer int) error {
	ctx := context.Background()
	var h transport.Header
	if err := l.RecvHeader(waitCtx, &h); err != nil {
		if waitCtx.Err() != nil && errors.Is(err, context.Canceled) {
			return errHeaderWaitStopped
		}
		return err
	}
	if isP2P(&h) {
		return p.receiveFrame(ctx, l, peer, &h)
	}
	if h.Kind == transport.FrameAbort {
		reason := make([]byte, h.Length)
		if err := l.RecvPayload(ctx, reason); err != nil {
			return &RemoteAbortError{Rank: peer, Reason: "(reason lost: " + err.Error() + ")"}
		}
		return &RemoteAbortError{Rank: peer, Reason: string(reason)}
	}
	p.mu.Lock()
	p.peers[peer].pending, p.peers[peer].hasPending = h, true
	p.mu.Unlock()
	return nil
}

// Send sends payload to rank peer as one message with tag; the peer takes
// it with a Recv from this rank with the same tag and a buffer of the same
// length. Messages to one peer with one tag are received in the order they
// were sent. A message of at most p2pEagerBytes (16 KiB) goes at once, as
// long as the peer keeps taking such messages off the link (see the
// package comment above), and Send returns once its frames are handed to
// the link; a larger one, or a small one beyond that, waits until the peer
// has posted its receive (see the package comment above) and
// then goes straight into the receive's buffer, so Send returns once the
// last frame is handed over. A posted receive of another length refuses
// a large message: Send returns a *SizeMismatchError (the message is not
// delivered) and the communicator goes on. Sends may run from several
// goroutines at once (with one tag, they are numbered in the order they
// were called: PostSend), beside receives and collectives; a large message waiting for its
// receive does not hold up the others to that peer.
//
// Send runs only on a communicator that owns its links (not a Subset). A
// failure — the peer dead or silent past the I/O timeout, ctx ended part-way
// or while waiting for the peer's receive — fails the communicator, as a
// failed collective does.
func (c *Communicator) Send(ctx context.Context, peer int, tag uint64, payload []byte) error {
	return c.PostSend(peer, tag, payload).Wait(ctx)
}

// PostedSend is a send PostSend posted: it has its place among the sends to
// its peer at once, in the order of the PostSend calls, and Wait sends it.
// (Send posts and waits in one call; a caller that sends from another
// goroutine than the one that makes the calls, as an engine handing out
// handles does, posts first so that messages with one tag are numbered, and
// so received, in the order it made them.)
type PostedSend struct {
	c       *Communicator
	peer    int
	tag     uint64
	payload []byte
	// prev is closed once the send posted to peer before this one took its
	// number (or gave up before it did); this one closes mine when it has.
	prev <-chan struct{}
	mine chan struct{}
	err  error // posting failed
}

// PostSend posts a send of payload to rank peer with tag (see Send); Wait
// sends it. Every posted send must be waited for: the sends posted after it
// take their numbers only once it has taken its own or given up.
func (c *Communicator) PostSend(peer int, tag uint64, payload []byte) *PostedSend {
	if err := c.p2pCheck("send to", peer); err != nil {
		return &PostedSend{err: err}
	}
	p := c.p2p
	s := &PostedSend{c: c, peer: peer, tag: tag, payload: payload, mine: make(chan struct{})}
	p.mu.Lock()
	s.prev, p.peers[peer].lastPosted = p.peers[peer].lastPosted, s.mine
	p.mu.Unlock()
	return s
}

// Wait sends the posted message (see Send). When ctx ends before its turn
// (the sends posted before it still waiting for the link), it gives its
// place up and returns ctx's error wrapped, the communicator unharmed.
func (s *PostedSend) Wait(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	c, peer, tag, payload := s.c, s.peer, s.tag, s.payload
	select {
	case <-s.prev:
	case <-ctx.Done():
		// The sends posted after this one still wait for the ones before
		// it: the place is given up only once theirs are taken.
		go func() {
			<-s.prev
			close(s.mine)
		}()
		return fmt.Errorf("collective: sending %d bytes with tag %d to rank %d: %w", len(payload), tag, peer, ctx.Err())
	}
	p := c.p2p
	pp := &p.peers[peer]
	if err := c.takeSending(ctx, peer); err != nil {
		close(s.mine)
		return err
	}
	chunk := c.cfg.ChunkBytes
	p.mu.Lock()
	pp.sendSeq[tag]++
	seq := pp.sendSeq[tag]
	kind := p2pRendezvous
	if cost := eagerCost(len(payload), chunk); len(payload) <= p2pEagerBytes && cost <= pp.credit {
		kind = p2pEager
		pp.credit -= cost
	}
	p.mu.Unlock()
	// Numbered: the next posted send may take the link once this one
	// lets it go (its frames sent, or its announcement).
	close(s.mine)
	if kind == p2pEager {
		defer func() { <-pp.sending }()
		return c.sendFrames(ctx, peer, kind, tag, seq, payload)
	}
	w, err := c.announce(ctx, peer, tag, seq, len(payload))
	<-pp.sending // other messages to the peer go while this one waits
	if err != nil {
		return err
	}
	if err := c.awaitClear(ctx, peer, w, len(payload)); err != nil {
		return err
	}
	// The peer waits for the frames now: a failure from here on leaves
	// it waiting, so it fails the communicator.
	select {
	case pp.sending <- struct{}{}:
	case <-ctx.Done():
		err := fmt.Errorf("collective: sending %d bytes with tag %d to rank %d: %w", len(payload), tag, peer, ctx.Err())
		c.p2pFail(err)
		return err
	}
	defer func() { <-pp.sending }()
	return c.sendFrames(ctx, peer, kind, tag, seq, payload)
}

// takeSending takes the link to peer for this Send's frames: a message's
// frames go out together.
func (c *Communicator) takeSending(ctx context.Context, peer int) error {
	pp := &c.p2p.peers[peer]
	select {
	case pp.sending <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := c.Err(); err != nil {
		<-pp.sending
		return err
	}
	return nil
}

// sendFrames sends message seq with tag, of kind p2pEager or
// p2pRendezvous, to peer (holding its link, takeSending).
func (c *Communicator) sendFrames(ctx context.Context, peer int, kind p2pFrameKind, tag, seq uint64, payload []byte) error {
	chunk := c.cfg.ChunkBytes
	h := transport.Header{Kind: transport.FrameData, Coll: uint8(collP2P), Flags: uint8(kind), Seq: seq, Count: uint64(len(payload)), Tag: tag}
	for step, off := 0, 0; step == 0 || off < len(payload); step++ {
		end := min(off+chunk, len(payload))
		h.Step, h.Length = uint32(step), uint32(end-off)
		hc := h
		if err := c.links[peer].Send(ctx, &hc, payload[off:end]); err != nil {
			err = fmt.Errorf("collective: sending %d bytes with tag %d to rank %d: %w", len(payload), tag, peer, err)
			c.p2pFail(err)
			return err
		}
		off = end
	}
	return nil
}

// announce sends message seq with tag's ready-to-send (size bytes) to peer
// (holding its link, takeSending) and returns what its clear-to-send will
// fill in. The pump reads the link from now on (or the running collective
// does), so a collective of this rank's is never stuck behind the message.
func (c *Communicator) announce(ctx context.Context, peer int, tag, seq uint64, size int) (*p2pClear, error) {
	p := c.p2p
	pp := &p.peers[peer]
	w := &p2pClear{tag: tag, seq: seq, done: make(chan struct{})}
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	pp.awaiting[p2pKey{tag, seq}] = w
	p.startPump(c.links[peer], peer)
	p.mu.Unlock()
	h := transport.Header{Kind: transport.FrameData, Coll: uint8(collP2P), Flags: uint8(p2pRTS), Seq: seq, Count: uint64(size), Tag: tag}
	if err := c.links[peer].Send(ctx, &h, nil); err != nil {
		err = fmt.Errorf("collective: announcing %d bytes with tag %d to rank %d: %w", size, tag, peer, err)
		c.p2pFail(err)
		return nil, err
	}
	return w, nil
}

// awaitClear waits for the clear-to-send w stands for. A refusal is a
// *SizeMismatchError.
func (c *Communicator) awaitClear(ctx context.Context, peer int, w *p2pClear, size int) error {
	select {
	case <-w.done:
	case <-ctx.Done():
		err := &transport.PeerError{Rank: peer, Op: fmt.Sprintf("send: waiting for rank %d to post the receive of %d bytes with tag %d", peer, size, w.tag), Err: ctx.Err()}
		c.p2pFail(err)
		return err
	}
	if w.err != nil {
		return w.err
	}
	if w.receiving != uint64(size) {
		return &SizeMismatchError{Peer: peer, Tag: w.tag, Sent: uint64(size), Receiving: int(min(w.receiving, math.MaxInt)), Refused: true}
	}
	return nil
}

// Recv receives into buf the next message from rank peer with tag (see
// Send), waiting for it as long as ctx lets it. A message of another length
// than buf is a *SizeMismatchError, after which the communicator goes on.
// Receives may be posted from several goroutines at once; those with the
// same peer and tag are matched in the order they were posted.
//
// A failure fails the communicator, as for Send; so does ctx ending while
// the receive waits, since the message may be arriving.
func (c *Communicator) Recv(ctx context.Context, peer int, tag uint64, buf []byte) error {
	if err := c.p2pCheck("receive from", peer); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := c.PostRecv(peer, tag, buf).Wait(ctx)
	return err
}

// RecvAny receives into buf the next message with tag from any rank and
// returns the rank that sent it: the earliest of the messages with tag kept
// already (in the order they came), else the first to come. It takes its
// place among the posted receives of every peer, in posting order, as a
// Recv from each would. A message of another length than buf is a
// *SizeMismatchError naming its sender (the message is dropped; the
// communicator goes on).
//
// When ctx ends before a message took the receive, it is withdrawn and
// RecvAny returns ctx's error wrapped, the communicator unharmed; once a
// message took it, it waits for that message as Recv does (ctx ending then
// fails the communicator). Any other failure fails the communicator, as for
// Recv.
func (c *Communicator) RecvAny(ctx context.Context, tag uint64, buf []byte) (int, error) {
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	return c.PostRecvAny(tag, buf).Wait(ctx)
}

// PostedRecv is a receive PostRecv or PostRecvAny posted: it takes its
// place among the receives at once, in the order of those calls, and Wait
// collects it. (Recv and RecvAny post and wait in one call; a caller that
// waits on another goroutine than the one that makes the calls, as an
// engine handing out handles does, posts first so that receives with one
// tag match messages in the order it made them.)
type PostedRecv struct {
	c    *Communicator
	r    *p2pRecv // nil when posting failed (err)
	peer int      // the rank received from; -1 for any rank
	err  error
}

// PostRecv posts a receive into buf of the next message from rank peer
// with tag (see Recv); Wait collects it.
func (c *Communicator) PostRecv(peer int, tag uint64, buf []byte) *PostedRecv {
	if err := c.p2pCheck("receive from", peer); err != nil {
		return &PostedRecv{c: c, peer: peer, err: err}
	}
	p := c.p2p
	r := &p2pRecv{tag: tag, buf: buf, done: make(chan struct{}), from: peer}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return &PostedRecv{c: c, peer: peer, err: p.err}
	}
	if !p.post(c.links[peer], peer, r) {
		p.startPump(c.links[peer], peer)
	}
	return &PostedRecv{c: c, r: r, peer: peer}
}

// PostRecvAny posts a receive into buf of the next message with tag from
// any rank (see RecvAny); Wait collects it.
func (c *Communicator) PostRecvAny(tag uint64, buf []byte) *PostedRecv {
	if c.parent == nil && c.Size() < 2 {
		return &PostedRecv{c: c, peer: -1, err: fmt.Errorf("collective: cannot receive from any rank: rank %d is the only one", c.Rank())}
	}
	return c.postRecvAny(nil, tag, buf)
}

// PostRecvAnyOf posts a receive into buf of the next message with tag from
// any of ranks (this communicator's, without this rank; at least one): as
// PostRecvAny, but the messages of the other ranks are left to other
// receives, and the source Wait returns is one of ranks. A process set's
// receive from any of its members is one.
func (c *Communicator) PostRecvAnyOf(ranks []int, tag uint64, buf []byte) *PostedRecv {
	if len(ranks) == 0 {
		return &PostedRecv{c: c, peer: -1, err: errors.New("collective: cannot receive from any of no ranks")}
	}
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if err := c.p2pCheck("receive from", r); err != nil {
			return &PostedRecv{c: c, peer: -1, err: err}
		}
		if seen[r] {
			return &PostedRecv{c: c, peer: -1, err: fmt.Errorf("collective: cannot receive from any of ranks %v: rank %d is there twice", ranks, r)}
		}
		seen[r] = true
	}
	return c.postRecvAny(slices.Clone(ranks), tag, buf)
}

// postRecvAny posts an any-source receive from among (nil: every other
// rank).
func (c *Communicator) postRecvAny(among []int, tag uint64, buf []byte) *PostedRecv {
	if c.parent != nil {
		return &PostedRecv{c: c, peer: -1, err: errP2POnSubset}
	}
	if err := c.Err(); err != nil {
		return &PostedRecv{c: c, peer: -1, err: err}
	}
	p := c.p2p
	r := &p2pRecv{tag: tag, buf: buf, done: make(chan struct{}), anySource: true, from: -1, among: among}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return &PostedRecv{c: c, peer: -1, err: p.err}
	}
	p.postAny(c, r)
	return &PostedRecv{c: c, r: r, peer: -1}
}

// sources names the ranks an any-source receive takes messages from, for
// errors.
func (r *p2pRecv) sources() string {
	if r.among == nil {
		return "any rank"
	}
	return fmt.Sprintf("any of ranks %v", r.among)
}

// Wait waits for the posted receive as long as ctx lets it and returns the
// rank its message came from (-1 when none did) and its error: see Recv and
// RecvAny, also for what ctx ending does.
func (pr *PostedRecv) Wait(ctx context.Context) (int, error) {
	if pr.err != nil {
		return -1, pr.err
	}
	c, r, p := pr.c, pr.r, pr.c.p2p
	select {
	case <-r.done:
		return pr.from(), r.err
	case <-ctx.Done():
	}
	p.mu.Lock()
	if r.finished {
		p.mu.Unlock()
		return r.from, r.err
	}
	if r.anySource && r.from < 0 {
		p.withdraw(r) // no message took it: the streams are untouched
		p.mu.Unlock()
		return -1, fmt.Errorf("collective: receiving from %s with tag %d: %w", r.sources(), r.tag, ctx.Err())
	}
	from := r.from
	p.mu.Unlock()
	what := fmt.Sprintf("rank %d", from)
	if r.anySource {
		what += " (" + r.sources() + ")"
	}
	err := fmt.Errorf("collective: receiving from %s with tag %d: %w", what, r.tag, ctx.Err())
	c.p2pFail(err)
	<-r.done
	if r.err == nil {
		return from, nil // it came meanwhile
	}
	return from, err
}

// from is the rank the finished receive's message came from.
func (pr *PostedRecv) from() int {
	pr.c.p2p.mu.Lock()
	defer pr.c.p2p.mu.Unlock()
	return pr.r.from
}

// postAny matches any-source receive r with the earliest kept message with
// its tag from the peers it takes messages from (r.among, else every
// other), or else posts it to each of them and starts their pumps (under
// mu); it reports whether r is finished already (see post).
func (p *p2pState) postAny(c *Communicator, r *p2pRecv) bool {
	peers := r.among
	if peers == nil {
		for i := range p.peers {
			if i != c.Rank() {
				peers = append(peers, i)
			}
		}
	}
	from, first := -1, uint64(0)
	for _, i := range peers {
		for _, m := range p.peers[i].kept {
			if m.tag == r.tag && (from < 0 || m.arrived < first) {
				from, first = i, m.arrived
				break // a peer's kept messages are in arrival order
			}
		}
	}
	if from >= 0 {
		r.from = from
		if p.post(c.links[from], from, r) {
			return true
		}
		// A kept announcement, cleared: its frames come into r's buffer.
		p.startPump(c.links[from], from)
		return false
	}
	for _, i := range peers {
		p.peers[i].posted = append(p.peers[i].posted, r)
		p.startPump(c.links[i], i)
	}
	return false
}

// startPump starts the pump of peer's link l unless it runs (under mu).
func (p *p2pState) startPump(l transport.Link, peer int) {
	if pp := &p.peers[peer]; !pp.pumping {
		pp.pumping = true
		go p.pump(l, peer)
	}
}

// post matches receive r from peer with the first kept message with its
// tag, or else posts it (under mu), and reports whether r is finished
// already: a kept eager message delivered, or one of another length. A
// kept announcement is cleared, its frames to come into r's buffer.
func (p *p2pState) post(l transport.Link, peer int, r *p2pRecv) bool {
	pp := &p.peers[peer]
	i := slices.IndexFunc(pp.kept, func(m *p2pMsg) bool { return m.tag == r.tag })
	if i < 0 {
		pp.posted = append(pp.posted, r)
		return false
	}
	m := pp.kept[i]
	pp.kept = slices.Delete(pp.kept, i, i+1)
	if !m.rendezvous {
		p.deliverKept(l, peer, m, r)
		return true
	}
	p.keptBytes -= transport.HeaderSize
	p.clear(l, peer, m, r)
	_, cleared := pp.cleared[p2pKey{m.tag, m.seq}]
	return !cleared
}

// errP2POnSubset refuses a point-to-point call on a Subset.
var errP2POnSubset = errors.New("collective: point-to-point messages run on the world's communicator, not on a subset")

// p2pCheck refuses a point-to-point call that cannot run.
func (c *Communicator) p2pCheck(what string, peer int) error {
	switch {
	case c.parent != nil:
		return errP2POnSubset
	case peer < 0 || peer >= c.Size():
		return fmt.Errorf("collective: cannot %s rank %d: outside the world of %d", what, peer, c.Size())
	case peer == c.Rank():
		return fmt.Errorf("collective: cannot %s rank %d: that is this rank", what, peer)
	}
	return c.Err()
}

// p2pFail stops the communicator after a point-to-point failure: its links
// close, which fails the running collective and every receive.
func (c *Communicator) p2pFail(err error) {
	c.setFailure(err)
	c.log.Warn("point-to-point failed; aborting communicator", "err", err)
	c.closeLinks()
}
