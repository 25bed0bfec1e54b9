package transport

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gorovod/gorovod/collective/transport/internal/spin"
)

// A link whose two ends are both members of the next world need not be
// dialled again: its ends exchange one rekey frame each, inside the link's
// own authenticated stream and under its current keys, and move it into
// the new world (its epoch, both ends' new ranks and, on a sealed link,
// fresh keys derived from the old link secret and both frames' nonces).
// Then each end sends its message again under the new keys (key
// confirmation), so both ends agree on the outcome. Any failure closes
// the link and the pair is dialled as for a new member.

// RekeyMsgSize is the size of a rekey frame's payload.
const RekeyMsgSize = 8 + 8 + 4 + 4 + 4 + 4 + RekeyNonceSize + RekeyMACSize

// RekeyNonceSize is the size of each end's fresh nonce.
const RekeyNonceSize = 32

// RekeyMACSize is the size of the MAC a rekey message carries.
const RekeyMACSize = 32

// rekeyMagic opens every rekey message ("GVRK" and a format version).
const rekeyMagic uint64 = 'G' | 'V'<<8 | 'R'<<16 | 'K'<<24 | 1<<32

// RekeyMsg is what one end of a link tells the other when the link moves
// into a new world: the new world and the two ends' ranks in it, a fresh
// nonce, and a MAC over all of it under the link's secret (transports
// whose links have no secret, such as shared memory inside one host, leave
// it zero).
type RekeyMsg struct {
	Epoch uint64 // the new world's epoch
	Size  uint32 // the new world's size
	From  uint32 // the sender's rank in the new world
	To    uint32 // the receiver's rank in the new world
	Lane  uint32 // which connection of a link over several (0 otherwise)
	Nonce [RekeyNonceSize]byte
	MAC   [RekeyMACSize]byte
}

// Encode writes m into b (RekeyMsgSize bytes).
func (m *RekeyMsg) Encode(b []byte) {
	_ = b[RekeyMsgSize-1]
	binary.LittleEndian.PutUint64(b[0:], rekeyMagic)
	binary.LittleEndian.PutUint64(b[8:], m.Epoch)
	binary.LittleEndian.PutUint32(b[16:], m.Size)
	binary.LittleEndian.PutUint32(b[20:], m.From)
	binary.LittleEndian.PutUint32(b[24:], m.To)
	binary.LittleEndian.PutUint32(b[28:], m.Lane)
	copy(b[32:], m.Nonce[:])
	copy(b[32+RekeyNonceSize:], m.MAC[:])
}

// MACInput is the part of the encoded message b the MAC covers: all of it
// but the MAC.
func MACInput(b []byte) []byte { return b[:RekeyMsgSize-RekeyMACSize] }

// DecodeRekey parses a rekey message. It checks the size, the magic and
// that the world and ranks are in range; whether they are the ones expected
// is the receiver's to check.
func DecodeRekey(b []byte, m *RekeyMsg) error {
	if len(b) != RekeyMsgSize {
		return fmt.Errorf("rekey message of %d bytes, want %d", len(b), RekeyMsgSize)
	}
	if v := binary.LittleEndian.Uint64(b[0:]); v != rekeyMagic {
		return fmt.Errorf("rekey message with bad magic %#x", v)
	}
	*m = RekeyMsg{
		Epoch: binary.LittleEndian.Uint64(b[8:]),
		Size:  binary.LittleEndian.Uint32(b[16:]),
		From:  binary.LittleEndian.Uint32(b[20:]),
		To:    binary.LittleEndian.Uint32(b[24:]),
		Lane:  binary.LittleEndian.Uint32(b[28:]),
	}
	copy(m.Nonce[:], b[32:])
	copy(m.MAC[:], b[32+RekeyNonceSize:])
	switch {
	case m.Size == 0 || m.Size > MaxWorldSize:
		return fmt.Errorf("rekey message names a world of %d ranks", m.Size)
	case m.From >= m.Size || m.To >= m.Size:
		return fmt.Errorf("rekey message names ranks %d and %d in a world of %d", m.From, m.To, m.Size)
	case m.From == m.To:
		return fmt.Errorf("rekey message from rank %d to itself", m.From)
	}
	return nil
}

// ErrRekey is wrapped by every failure to move a link into a new world: the
// peer sent something other than its rekey frame, a frame for another world
// or with a MAC that does not verify. The link is closed and the pair
// dialled afresh.
var ErrRekey = errors.New("link could not be moved into the new world")

// NewRekeyMsg is this end's message for moving a link into world w, where
// the peer is rank peer, on lane lane; its nonce is fresh and its MAC unset.
func NewRekeyMsg(w World, peer, lane int) RekeyMsg {
	m := RekeyMsg{Epoch: w.Epoch, Size: uint32(w.Size()), From: uint32(w.Rank), To: uint32(peer), Lane: uint32(lane)}
	_, _ = rand.Read(m.Nonce[:])
	return m
}

// CheckRekey verifies that the peer's message theirs fits this end's mine:
// the same world, and each end where the other expects it.
func CheckRekey(mine, theirs *RekeyMsg) error {
	switch {
	case theirs.Epoch != mine.Epoch:
		return fmt.Errorf("%w: the peer moves to epoch %d, this end to %d", ErrRekey, theirs.Epoch, mine.Epoch)
	case theirs.Size != mine.Size:
		return fmt.Errorf("%w: the peer names a world of %d ranks, this end %d", ErrRekey, theirs.Size, mine.Size)
	case theirs.From != mine.To || theirs.To != mine.From:
		return fmt.Errorf("%w: the peer says it is rank %d and this end rank %d; this end expects %d and %d",
			ErrRekey, theirs.From, theirs.To, mine.To, mine.From)
	case theirs.Lane != mine.Lane:
		return fmt.Errorf("%w: the peer's message is for lane %d, this is lane %d", ErrRekey, theirs.Lane, mine.Lane)
	}
	return nil
}

// SendRekey sends mine on l as a rekey frame of l's current world.
func SendRekey(ctx context.Context, l Link, mine *RekeyMsg) error {
	var b [RekeyMsgSize]byte
	mine.Encode(b[:])
	h := Header{Kind: FrameRekey, Length: RekeyMsgSize}
	return l.Send(ctx, &h, b[:])
}

// AwaitRekey reads the peer's first rekey message on l, as RecvRekey, but
// without polling for it: it comes when the peer reaches the step boundary
// too, milliseconds away while the peer finishes its step, and a member
// waits so on all its links at once, taking with its polls the CPU its peers
// need to get there (spin.Unpolled). The key confirmation, which follows at
// once, is read with RecvRekey.
func AwaitRekey(ctx context.Context, l Link) (RekeyMsg, error) {
	return RecvRekey(spin.Unpolled(ctx), l)
}

// RecvRekey reads the peer's rekey message, which must be the next frame
// on l. It returns it decoded but not checked (CheckRekey).
func RecvRekey(ctx context.Context, l Link) (RekeyMsg, error) {
	var theirs RekeyMsg
	var h Header
	if err := l.RecvHeader(ctx, &h); err != nil {
		return theirs, err
	}
	if h.Kind != FrameRekey {
		// The payload stays unread: the link is closed after this.
		return theirs, &PeerError{Rank: l.Peer(), Addr: l.RemoteAddr(), Op: "rekey",
			Err: fmt.Errorf("%w: a %v frame (sequence %d) where the peer's rekey frame was due", ErrRekey, h.Kind, h.Seq)}
	}
	var b [RekeyMsgSize]byte
	if err := l.RecvPayload(ctx, b[:h.Length]); err != nil {
		return theirs, err
	}
	if err := DecodeRekey(b[:h.Length], &theirs); err != nil {
		return theirs, &PeerError{Rank: l.Peer(), Addr: l.RemoteAddr(), Op: "rekey", Err: fmt.Errorf("%w: %v", ErrRekey, err)}
	}
	return theirs, nil
}

// RekeyableLink is a Link that can move into a later world without being
// dialled again.
type RekeyableLink interface {
	Link
	// Rekey moves the link into world w, in which the peer is rank peer:
	// both ends must call it at the same point of the stream, after the
	// last frame of the current world. It exchanges one rekey frame each
	// way (under the current keys), checks that both ends move to the same
	// world and expect each other's ranks, confirms with one more frame
	// each way as the first of w, and then carries the frames of w only,
	// under new keys and with counters starting again. On an error
	// the link is unusable and the caller closes it; the error is a
	// *PeerError naming the peer by its current rank.
	Rekey(ctx context.Context, w World, peer int) error
	// Keepable reports whether the link is healthy enough to be moved:
	// not closed, no failure in either direction, nothing of a frame
	// half-read.
	Keepable() bool
}

// PartialConnector is a Transport that can connect a world's ranks only in
// part: Carry uses it to dial the ranks whose links were not carried over.
type PartialConnector interface {
	Transport
	// ConnectSome is Connect for the ranks r of w with want[r] set: it
	// dials the lower ones and waits for the higher ones among them, and
	// returns their links (nil for the others). A rank not wanted that
	// dials in is told this side is not ready, and retries.
	ConnectSome(ctx context.Context, w World, want []bool) ([]Link, error)
}

// Carry returns world w's links, one per rank (nil at w.Rank), keeping
// what it can of an earlier world's: kept[r] is a link of an earlier world
// to the member that is rank r in w (nil when there is none). It re-keys
// the kept links, all at once, and connects every rank left without a link
// through t: a kept link that is not a RekeyableLink, or whose re-key
// fails, is closed, and its rank is dialled as a new one's. t must be a
// PartialConnector unless every rank has a link already or none does. On
// an error every link in kept is closed. rekeyed is how many links were
// carried over. log (nil: none) hears of every kept link that is dialled
// again, and why.
//
// The ranks with no link at all are connected while the kept links
// re-key, not after: a peer may be able to send its rekey frame only once
// its own connect of w has finished, which needs this end to have started
// connecting w (a joiner dials every member, and each member's links
// become usable only when the joiner has them all), so waiting for the
// re-keys first could hold both ends until an I/O timeout.
func Carry(ctx context.Context, t Transport, w World, kept []Link, log *slog.Logger) (links []Link, rekeyed int, err error) {
	return CarryAhead(ctx, t, w, kept, nil, log, CarryWatch{})
}

// Ahead is a world's links that are being connected ahead of its Carry
// (in the background, while the last world trained): those to the ranks
// r with Want[r] set. Wait returns them, indexed by rank, once they are
// connected, or the connect's error; it must return when its ctx ends.
// The links it returns are the caller's.
type Ahead struct {
	Want []bool
	Wait func(ctx context.Context) ([]Link, error)
}

// CarryWatch hears, from any goroutine, how a carry's links come along; a
// nil field hears nothing. A caller that looks for gone members while the
// world connects (a gone member's gossip port refuses connections) looks
// only at the ranks that are being dialled: a kept link's peer that dies
// closes the link, and its re-key fails at once.
type CarryWatch struct {
	// Linked: rank r's link is ready, as soon as it is: connected ahead,
	// re-keyed, or dialled.
	Linked func(r int)
	// Unkept: rank r's kept link is not kept: it is no RekeyableLink, or
	// not Keepable, or its re-key failed (rank r is then dialled, once the
	// other re-keys have ended), or rank r is connected ahead.
	Unkept func(r int)
}

// CarryAhead is Carry for a world whose links to the ranks of ahead (nil:
// none) are still being connected: the kept links re-key, and the ranks
// with no link at all are dialled, while ahead's connect finishes, so that
// the carry takes as long as the slowest of the three and not their sum. A
// kept link to a rank of ahead is closed. A rank of ahead for which Wait
// returns no link is dialled afterwards, and an error from Wait ends the
// carry with that error, every link closed. watch hears how each rank's
// link comes along (CarryWatch).
func CarryAhead(ctx context.Context, t Transport, w World, kept []Link, ahead *Ahead, log *slog.Logger, watch CarryWatch) (links []Link, rekeyed int, err error) {
	linked, unkept := watch.Linked, watch.Unkept
	if linked == nil {
		linked = func(int) {}
	}
	if unkept == nil {
		unkept = func(int) {}
	}
	closeAll := func(ls []Link) {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	}
	// fail closes what the caller handed over when the carry cannot start:
	// kept, and ahead's links once they come.
	fail := func(err error) ([]Link, int, error) {
		closeAll(kept)
		if ahead != nil {
			if ls, werr := ahead.Wait(ctx); werr == nil {
				closeAll(ls)
			}
		}
		return nil, 0, err
	}
	if err := w.Validate(); err != nil {
		return fail(err)
	}
	size := w.Size()
	if (kept != nil && len(kept) != size) || (ahead != nil && len(ahead.Want) != size) {
		n := 0
		if ahead != nil {
			n = len(ahead.Want)
		}
		return fail(fmt.Errorf("transport: carrying %d kept and %d connected-ahead links into a world of %d ranks", len(kept), n, size))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fromAhead := make([]bool, size)
	if ahead != nil {
		copy(fromAhead, ahead.Want)
	}
	links = make([]Link, size)
	errs := make([]error, size)
	// want: the ranks with no link to keep nor one connected ahead, dialled
	// while the others re-key.
	want := make([]bool, size)
	missing := 0
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// stop ends the re-keys, the dials and the wait for ahead when one of
	// the last two fails; the first failure is the carry's error, or the
	// first that names a peer when the first names none (the others, cut
	// short by the stop or by the same deadline, may name the rank that
	// never connected: the member to blame).
	var firstMu sync.Mutex
	var first error
	stop := func(err error) {
		firstMu.Lock()
		if first == nil || (!NamesPeer(first) && NamesPeer(err)) {
			first = err
		}
		firstMu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	for r := range size {
		var k Link
		if kept != nil {
			k = kept[r]
		}
		switch {
		case r == w.Rank:
			fromAhead[r] = false
			closeAll([]Link{k})
		case fromAhead[r]:
			// Connected for w ahead (the pair was not carried, or the
			// other end dialled).
			if k != nil {
				k.Close()
				unkept(r)
			}
		case k != nil:
			rl, ok := k.(RekeyableLink)
			if !ok || !rl.Keepable() {
				log.Info("transport: a link of the last world cannot be kept; dialling the peer again", "epoch", w.Epoch, "rank", r, "rekeyable", ok)
				k.Close()
				want[r] = true
				missing++
				unkept(r)
				continue
			}
			wg.Go(func() {
				if err := rl.Rekey(rctx, w, r); err != nil {
					errs[r] = err
					rl.Close()
					unkept(r)
					return
				}
				links[r] = rl
				linked(r)
			})
		default:
			want[r] = true
			missing++
		}
	}
	// again: the ranks dialled after the first round (a failed re-key, a
	// rank that ahead did not connect).
	again := make([]bool, size)
	var aerr error
	aheadEnded := make(chan struct{})
	if ahead != nil {
		wg.Go(func() {
			defer close(aheadEnded)
			ls, err := ahead.Wait(rctx)
			if err == nil && ls != nil && len(ls) != size {
				closeAll(ls)
				err = fmt.Errorf("transport: %d links connected ahead for a world of %d ranks", len(ls), size)
			}
			if err != nil {
				aerr = err
				stop(err)
				return
			}
			for r := range size {
				var l Link
				if ls != nil {
					l = ls[r]
				}
				switch {
				case fromAhead[r] && l != nil:
					links[r] = l
					linked(r)
				case fromAhead[r]:
					again[r] = true
				case l != nil:
					l.Close()
				}
			}
		})
	}
	if ahead != nil && missing > 0 {
		// A transport connects a world once at a time: dialled alongside
		// the connect ahead of w, the ranks left would be refused ("already
		// being connected"). They are left when the world the connect ahead
		// was planned from failed (nothing carried) or a kept link could
		// not be kept.
		select {
		case <-aheadEnded:
		case <-rctx.Done():
		}
	}
	more, derr := connectMissing(rctx, t, w, want, missing)
	if derr != nil {
		stop(derr)
	}
	wg.Wait()
	for r, l := range more {
		if want[r] {
			links[r] = l
			if l != nil && derr == nil {
				linked(r)
			}
		} else if l != nil {
			l.Close()
		}
	}
	if aerr != nil || derr != nil {
		closeAll(links)
		return nil, 0, first
	}
	failed := 0
	for r, err := range errs {
		if err != nil {
			log.Warn("transport: a kept link failed its re-key; dialling the peer again", "epoch", w.Epoch, "rank", r, "err", err)
			again[r] = true
		}
	}
	for r := range size {
		if again[r] {
			failed++
		}
		if r != w.Rank && links[r] != nil && !want[r] && !fromAhead[r] {
			rekeyed++
		}
	}
	if err := ctx.Err(); err != nil {
		closeAll(links)
		return nil, 0, err
	}
	pc, partial := t.(PartialConnector)
	if failed == 0 {
		if partial && missing == 0 {
			// Dials nothing; the transport learns that w is its newest
			// world, so a worker dialling an older one is refused for good.
			if _, err := pc.ConnectSome(ctx, w, again); err != nil {
				closeAll(links)
				return nil, 0, err
			}
		}
		return links, rekeyed, nil
	}
	more, err = connectMissing(ctx, t, w, again, failed)
	if err != nil {
		closeAll(links)
		return nil, 0, err
	}
	for r, l := range more {
		if again[r] {
			links[r] = l
			if l != nil {
				linked(r)
			}
		} else if l != nil {
			l.Close()
		}
	}
	return links, rekeyed, nil
}

// connectMissing connects the n ranks marked in want for world w: nothing
// when n is 0, the whole world with Connect when every peer is missing, else
// those ranks with the transport's ConnectSome; a transport that connects
// only whole worlds cannot link some ranks of a world and not others.
func connectMissing(ctx context.Context, t Transport, w World, want []bool, n int) ([]Link, error) {
	switch {
	case n == 0:
		return nil, nil
	case n == len(want)-1:
		return t.Connect(ctx, w)
	}
	if pc, ok := t.(PartialConnector); ok {
		return pc.ConnectSome(ctx, w, want)
	}
	return nil, fmt.Errorf("transport: %d ranks of %d to connect, and the transport connects only whole worlds", n, len(want)-1)
}
