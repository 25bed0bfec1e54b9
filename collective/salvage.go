package collective

import (
	"context"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
)

// A world that fails (a member dies mid-collective) used to close every
// link, so the next world, whose members are mostly the same, dialled and
// authenticated all its links again: at 16 workers across hosts that
// redial was most of a host kill's cost. With Config.KeepLinksOnFailure a
// failed collective leaves the links open after its abort frames, and
// Salvage reads each one up to the peer's abort frame, which is the last
// frame the peer sends in the failed world. Both directions of the link
// are then at a frame boundary, and the next world re-keys it as it does
// a link released from a healthy world (transport.Carry).
//
// A link is salvaged only when its stream is known to be whole: this
// rank's abort frame went onto it whole, no send or receive stopped
// part-way on it, and no point-to-point traffic is on it. Any other ends
// as before: it closes, and the pair is dialled again. So does one whose
// peer never sends its abort frame (it closed the link, or moved on
// through a healthy world: a rekey frame comes instead), within the
// context Take is given.

// maxDrainFrame bounds the payload of a failed world's frame that Salvage
// reads past (the largest a collective sends is a chunk or a piece, far
// smaller): a peer announcing more is not trusted with the link.
const maxDrainFrame = 256 << 20

// Salvaged is the links of a failed communicator being brought back to a
// frame boundary (Salvage). Take hands over those that got there; Close
// closes them all. A nil *Salvaged holds no link.
type Salvaged struct {
	links  []transport.Link // by rank; nil where none is salvaged
	done   []chan error     // by rank: the drain's outcome
	cancel context.CancelFunc
}

// Salvage ends a communicator that failed with Config.KeepLinksOnFailure
// set, as Abort does, except that it keeps the links whose streams the
// failure left whole and starts reading each up to its peer's abort frame
// (discarding the failed world's frames before it), in the background.
// Take then returns those whose peers' abort frames came. Salvage aborts
// with cause, keeping nothing, a communicator that has not failed, one
// with a collective running, a subset (Subset) and one without
// KeepLinksOnFailure; it then returns nil.
func (c *Communicator) Salvage(cause error) *Salvaged {
	if c.parent != nil || !c.cfg.KeepLinksOnFailure {
		c.Abort(cause)
		return nil
	}
	// linkMu before opMu, as runTagged takes them (see Release).
	if !c.linkMu.TryLock() {
		c.Abort(cause)
		return nil
	}
	defer c.linkMu.Unlock()
	if !c.opMu.TryLock() {
		c.Abort(cause)
		return nil
	}
	if c.Err() == nil {
		// No abort frame ended the links: their streams are where the
		// last collective left them, which the peers cannot know.
		c.opMu.Unlock()
		c.Abort(cause)
		return nil
	}
	busy := c.p2p.halt(c.Err())
	s := &Salvaged{links: make([]transport.Link, len(c.links)), done: make([]chan error, len(c.links))}
	seen := make([]bool, len(c.links))
	kept := 0
	c.stateMu.Lock()
	c.handed = make([]bool, len(c.links))
	for r, l := range c.links {
		rl, ok := l.(transport.RekeyableLink)
		if !ok || busy[r] || c.sendBroken[r] || !c.abortSent[r].Load() || !rl.Keepable() {
			continue
		}
		c.handed[r] = true
		s.links[r] = l
		seen[r] = c.abortSeen[r].Load()
		kept++
	}
	c.stateMu.Unlock()
	c.opMu.Unlock()
	c.closeLinks() // the others; and the helpers stop
	if err := c.closeDeviceAllreducer(); err != nil {
		c.log.Warn("closing the device allreducer", "err", err)
	}
	if kept == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for r, l := range s.links {
		if l == nil {
			continue
		}
		done := make(chan error, 1)
		s.done[r] = done
		if seen[r] {
			done <- nil
			continue
		}
		go func() { done <- drainToAbort(ctx, l) }()
	}
	return s
}

// drainToAbort reads l's frames up to and including the peer's abort
// frame, discarding them; any other kind of frame, or a failure, is an
// error (the link is then not kept). The link's I/O timeout bounds each
// wait, and ctx the whole.
func drainToAbort(ctx context.Context, l transport.Link) error {
	var h transport.Header
	var scratch []byte
	for {
		if err := l.RecvHeader(ctx, &h); err != nil {
			return err
		}
		if h.Kind != transport.FrameData && h.Kind != transport.FrameAbort {
			return fmt.Errorf("collective: a %v frame from rank %d where its abort frame was due", h.Kind, l.Peer())
		}
		if h.Length > maxDrainFrame {
			return fmt.Errorf("collective: a frame of %d bytes from rank %d in a failed world (at most %d are read past)", h.Length, l.Peer(), maxDrainFrame)
		}
		if cap(scratch) < int(h.Length) {
			scratch = make([]byte, h.Length)
		}
		if err := l.RecvPayload(ctx, scratch[:h.Length]); err != nil {
			return err
		}
		if h.Kind == transport.FrameAbort {
			return nil
		}
	}
}

// Take returns, by rank, the salvaged links to the ranks r with keep(r)
// whose peers' abort frames have come, waiting for them until ctx ends;
// the failed world's ranks are the indexes. Every other link closes: those
// not kept at once, those whose drain failed or had not finished. It
// returns nil when none is left. Take may be called once.
func (s *Salvaged) Take(ctx context.Context, keep func(rank int) bool) []transport.Link {
	if s == nil {
		return nil
	}
	defer s.cancel()
	for r, l := range s.links {
		if l != nil && !keep(r) {
			l.Close()
			s.links[r] = nil
		}
	}
	var out []transport.Link
	for r, l := range s.links {
		if l == nil {
			continue
		}
		s.links[r] = nil
		var err error
		select {
		case err = <-s.done[r]:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		if err != nil {
			l.Close()
			continue
		}
		if out == nil {
			out = make([]transport.Link, len(s.done))
		}
		out[r] = l
	}
	return out
}

// Close closes every link not taken and stops their drains.
func (s *Salvaged) Close() {
	if s == nil {
		return
	}
	s.cancel()
	for r, l := range s.links {
		if l != nil {
			l.Close()
			s.links[r] = nil
		}
	}
}
