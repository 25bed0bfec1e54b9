package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// anyPayload is sender from's k-th message with tag, n bytes.
func anyPayload(from, k int, tag uint64, n int) []byte {
	return p2pPayload(from*8+k, tag, n)
}

// waitPostedAll polls until rank c has n[peer] receives posted from each
// peer.
func waitPostedAll(ctx context.Context, c *Communicator, n map[int]int) error {
	for peer, k := range n {
		if err := waitPosted(ctx, c, peer, k); err != nil {
			return err
		}
	}
	return nil
}

// TestP2PRecvAny: ranks 1..3 each send rank 0 two messages with tag 7 and
// one with tag 9; rank 0 takes the first of rank 2's with a Recv posted
// before its any-source receives, then the others with RecvAny: each
// message is received once, from the sender RecvAny names, and one
// sender's messages in the order sent. Small (eager) and large
// (rendezvous) messages, received as they come ("racing"), or posted
// before any is sent (the first RecvAny is posted to every peer, and a
// barrier runs meanwhile: the pumps pause for it), or all kept before
// rank 0 receives (eager messages an alltoall took off the links).
func TestP2PRecvAny(t *testing.T) {
	for _, m := range p2pMeshes {
		for _, tc := range []struct {
			mode string // "racing", "posted" or "kept"
			n    int
		}{
			{"racing", 100},
			{"racing", 40000},
			{"posted", 100},
			{"posted", 40000},
			{"kept", 100},
		} {
			t.Run(fmt.Sprintf("%s/%s/%dB", m.name, tc.mode, tc.n), func(t *testing.T) {
				const p = 4
				comms := newWorld(t, m.mk, p, p2pConfig())
				errs := onAll(t, comms, 60*time.Second, func(ctx context.Context, c *Communicator) error {
					r := c.Rank()
					if r != 0 {
						if tc.mode == "posted" {
							if err := c.Barrier(ctx); err != nil {
								return err
							}
						}
						for k := range 2 {
							if err := c.Send(ctx, 0, 7, anyPayload(r, k, 7, tc.n)); err != nil {
								return err
							}
						}
						if err := c.Send(ctx, 0, 9, anyPayload(r, 0, 9, tc.n)); err != nil {
							return err
						}
						if tc.mode == "kept" {
							if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
								return err
							}
						}
						return c.Barrier(ctx)
					}
					// Rank 0: the Recv from rank 2 comes first.
					var wg sync.WaitGroup
					var fromTwoErr error
					fromTwo := make([]byte, tc.n)
					switch tc.mode {
					case "posted":
						wg.Go(func() { fromTwoErr = c.Recv(ctx, 2, 7, fromTwo) })
						if err := waitPosted(ctx, c, 2, 1); err != nil {
							return err
						}
					case "kept":
						// An alltoall reads every link: it keeps the
						// messages sent before it.
						if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
							return err
						}
						c.p2p.mu.Lock()
						kept := len(c.p2p.peers[1].kept) + len(c.p2p.peers[2].kept) + len(c.p2p.peers[3].kept)
						c.p2p.mu.Unlock()
						if kept != 9 {
							return fmt.Errorf("%d messages kept after the barrier, want 9", kept)
						}
						fallthrough
					default:
						fromTwoErr = c.Recv(ctx, 2, 7, fromTwo)
					}
					got := map[int]int{} // messages with tag 7 per sender, by RecvAny
					check := func(from int, buf []byte, tag uint64) error {
						k := got[from]
						if tag == 7 && from == 2 {
							k++ // the first went to the Recv
						}
						if tag == 9 {
							k = 0
						}
						if !bytes.Equal(buf, anyPayload(from, k, tag, tc.n)) {
							return fmt.Errorf("RecvAny with tag %d named rank %d, but the bytes are not its message %d", tag, from, k)
						}
						if tag == 7 {
							got[from]++
						}
						return nil
					}
					first := make([]byte, tc.n)
					var firstFrom int
					var firstErr error
					if tc.mode == "posted" {
						var late sync.WaitGroup
						late.Go(func() { firstFrom, firstErr = c.RecvAny(ctx, 7, first) })
						if err := waitPostedAll(ctx, c, map[int]int{1: 1, 2: 2, 3: 1}); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						late.Wait()
					} else {
						firstFrom, firstErr = c.RecvAny(ctx, 7, first)
					}
					if firstErr != nil {
						return firstErr
					}
					if err := check(firstFrom, first, 7); err != nil {
						return err
					}
					for range 4 {
						buf := make([]byte, tc.n)
						from, err := c.RecvAny(ctx, 7, buf)
						if err != nil {
							return err
						}
						if err := check(from, buf, 7); err != nil {
							return err
						}
					}
					seen9 := map[int]bool{}
					for range 3 {
						buf := make([]byte, tc.n)
						from, err := c.RecvAny(ctx, 9, buf)
						if err != nil {
							return err
						}
						if seen9[from] {
							return fmt.Errorf("RecvAny with tag 9 named rank %d twice", from)
						}
						seen9[from] = true
						if err := check(from, buf, 9); err != nil {
							return err
						}
					}
					wg.Wait()
					if fromTwoErr != nil {
						return fromTwoErr
					}
					if !bytes.Equal(fromTwo, anyPayload(2, 0, 7, tc.n)) {
						return errors.New("the Recv from rank 2 did not get its first message")
					}
					if want := map[int]int{1: 2, 2: 1, 3: 2}; fmt.Sprint(got) != fmt.Sprint(want) {
						return fmt.Errorf("RecvAny got messages with tag 7 from %v, want %v", got, want)
					}
					return c.Barrier(ctx)
				})
				noErrors(t, errs)
			})
		}
	}
}

// TestP2PRecvAnyWithdrawn: an any-source receive whose context ends before
// a message comes is withdrawn, and the communicator goes on; one that a
// message took stops the other peers' pumps, so a peer that stays silent
// past the links' I/O timeout meanwhile does not fail the communicator
// (the pump's header wait is stopped, not timed out).
func TestP2PRecvAnyWithdrawn(t *testing.T) {
	const ioTimeout = time.Second
	for _, m := range p2pShortTimeoutMeshes(ioTimeout) {
		t.Run(m.name, func(t *testing.T) {
			const p = 3
			comms := newWorld(t, m.mk, p, p2pConfig())
			errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
				r := c.Rank()
				if r == 0 {
					short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					_, err := c.RecvAny(short, 3, make([]byte, 8))
					cancel()
					if !errors.Is(err, context.DeadlineExceeded) {
						return fmt.Errorf("RecvAny with nothing sent returned %v, want a deadline error", err)
					}
					if err := c.Err(); err != nil {
						return fmt.Errorf("the withdrawn RecvAny failed the communicator: %w", err)
					}
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				switch r {
				case 0:
					buf := make([]byte, 8)
					from, err := c.RecvAny(ctx, 3, buf)
					if err != nil {
						return err
					}
					if from != 1 || !bytes.Equal(buf, anyPayload(1, 0, 3, 8)) {
						return fmt.Errorf("RecvAny named rank %d", from)
					}
				case 1:
					if err := c.Send(ctx, 0, 3, anyPayload(1, 0, 3, 8)); err != nil {
						return err
					}
				}
				// Rank 2 sends nothing to rank 0 for over the I/O timeout.
				select {
				case <-time.After(3 * ioTimeout):
				case <-ctx.Done():
					return ctx.Err()
				}
				if err := c.Err(); err != nil {
					return fmt.Errorf("after a silence past the I/O timeout: %w", err)
				}
				return c.Barrier(ctx)
			})
			noErrors(t, errs)
		})
	}
}

// TestP2PRecvAnySizeMismatch: a message of another length than the
// any-source receive's buffer fails it with a *SizeMismatchError naming the
// sender; the communicator goes on.
func TestP2PRecvAnySizeMismatch(t *testing.T) {
	for _, m := range p2pMeshes {
		t.Run(m.name, func(t *testing.T) {
			comms := newWorld(t, m.mk, 3, p2pConfig())
			errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				switch c.Rank() {
				case 0:
					from, err := c.RecvAny(ctx, 1, make([]byte, 10))
					var size *SizeMismatchError
					if !errors.As(err, &size) || size.Peer != 2 || from != 2 {
						return fmt.Errorf("RecvAny of 10 bytes got %v from rank %d, want a size mismatch from rank 2", err, from)
					}
				case 2:
					if err := c.Send(ctx, 0, 1, make([]byte, 20)); err != nil {
						return err
					}
				}
				return c.Barrier(ctx)
			})
			noErrors(t, errs)
		})
	}
}

// TestP2PRecvAnyArgs: an any-source receive on a world of one rank is
// refused at once.
func TestP2PRecvAnyArgs(t *testing.T) {
	comms := newWorld(t, tcpMesh, 1, p2pConfig())
	if _, err := comms[0].RecvAny(context.Background(), 0, nil); err == nil {
		t.Fatal("RecvAny on a world of one rank returned no error")
	}
}
