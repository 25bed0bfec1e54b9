package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
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

// waitKept polls until rank c keeps n messages (or announcements) from
// peer that no receive took; or until check, when given, fails.
func waitKept(ctx context.Context, c *Communicator, peer, n int, check func() error) error {
	for {
		c.p2p.mu.Lock()
		kept := len(c.p2p.peers[peer].kept)
		c.p2p.mu.Unlock()
		if kept >= n {
			return nil
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d messages kept from rank %d: %w", n, peer, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// waitSentOrAnnounced polls until rank c's send to peer is on the link: sent
// closed (an eager message), or its announcement sent, the link let go
// (a rendezvous one, waiting for the clear-to-send).
func waitSentOrAnnounced(ctx context.Context, c *Communicator, peer int, sent <-chan struct{}) error {
	for {
		pp := &c.p2p.peers[peer]
		c.p2p.mu.Lock()
		announced := len(pp.awaiting) > 0 && len(pp.sending) == 0
		c.p2p.mu.Unlock()
		if announced {
			return nil
		}
		select {
		case <-sent:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for the send to rank %d: %w", peer, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestP2PRecvAnyOf: a receive from any of ranks 1 and 2 (a process set's
// members, to rank 0) never takes rank 3's message with the same tag, which
// came first: rank 3 sends it, an alltoall takes it off rank 0's link (kept) before ranks
// 1 and 2 send theirs (rank 1 two, rank 2 one). The three receives from any of 1
// and 2 take those three, each once, naming their senders, rank 1's in the
// order sent; then a receive from any rank takes rank 3's. The receives are
// posted before any message comes ("posted": rank 3's arrives while they
// wait on ranks 1 and 2), or after all are kept ("kept": rank 3's is the
// earliest kept; a second alltoall takes the others' off the links).
func TestP2PRecvAnyOf(t *testing.T) {
	for _, m := range p2pMeshes {
		for _, tc := range []struct {
			mode string // "posted" or "kept"
			n    int
		}{
			{"posted", 100},
			{"posted", 40000},
			{"kept", 100},
		} {
			t.Run(fmt.Sprintf("%s/%s/%dB", m.name, tc.mode, tc.n), func(t *testing.T) {
				const p, tag = 4, 7
				members := []int{1, 2}
				comms := newWorld(t, m.mk, p, p2pConfig())
				errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
					r := c.Rank()
					switch r {
					case 3:
						// A rendezvous Send waits for rank 0's receive, which
						// comes last; its announcement goes before the
						// alltoall, which takes it off rank 0's link.
						var sendErr error
						var wg sync.WaitGroup
						sent := make(chan struct{})
						wg.Go(func() {
							defer close(sent)
							sendErr = c.Send(ctx, 0, tag, anyPayload(3, 0, tag, tc.n))
						})
						if err := waitSentOrAnnounced(ctx, c, 0, sent); err != nil {
							return err
						}
						if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						if tc.mode == "kept" {
							if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
								return err
							}
						}
						wg.Wait()
						if sendErr != nil {
							return sendErr
						}
						return c.Barrier(ctx)
					case 1, 2:
						if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						for k := range 3 - r {
							if err := c.Send(ctx, 0, tag, anyPayload(r, k, tag, tc.n)); err != nil {
								return err
							}
						}
						if tc.mode == "kept" {
							// The alltoall takes the messages off rank 0's links.
							if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
								return err
							}
						}
						return c.Barrier(ctx)
					}
					// Rank 0.
					bufs := make([][]byte, 3)
					posted := make([]*PostedRecv, 3)
					post := func() {
						for i := range posted {
							bufs[i] = make([]byte, tc.n)
							posted[i] = c.PostRecvAnyOf(members, tag, bufs[i])
						}
					}
					if tc.mode == "posted" {
						post()
					}
					if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
						return err
					}
					// No posted receive finishes: only rank 3 has sent.
					untaken := func() error {
						for i, pr := range posted {
							if pr == nil {
								continue
							}
							select {
							case <-pr.r.done:
								from, err := pr.Wait(ctx)
								return fmt.Errorf("receive %d from any of ranks %v finished when only rank 3 had sent (from rank %d, err %v)", i, members, from, err)
							default:
							}
						}
						return nil
					}
					if err := waitKept(ctx, c, 3, 1, untaken); err != nil {
						return err
					}
					if err := untaken(); err != nil {
						return err
					}
					if err := c.Barrier(ctx); err != nil {
						return err
					}
					if tc.mode == "kept" {
						if err := Alltoall(ctx, c, make([]int32, p), make([]int32, p)); err != nil {
							return err
						}
						if err := waitKept(ctx, c, 1, 2, nil); err != nil {
							return err
						}
						if err := waitKept(ctx, c, 2, 1, nil); err != nil {
							return err
						}
						post()
					}
					got := map[int]int{}
					for i, pr := range posted {
						from, err := pr.Wait(ctx)
						if err != nil {
							return fmt.Errorf("receive %d from any of ranks %v: %w", i, members, err)
						}
						if from != 1 && from != 2 {
							return fmt.Errorf("receive %d from any of ranks %v named rank %d", i, members, from)
						}
						if !bytes.Equal(bufs[i], anyPayload(from, got[from], tag, tc.n)) {
							return fmt.Errorf("receive %d named rank %d, but the bytes are not its message %d", i, from, got[from])
						}
						got[from]++
					}
					if want := map[int]int{1: 2, 2: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
						return fmt.Errorf("the receives from any of ranks %v got messages from %v, want %v", members, got, want)
					}
					buf := make([]byte, tc.n)
					from, err := c.RecvAny(ctx, tag, buf)
					if err != nil {
						return err
					}
					if from != 3 || !bytes.Equal(buf, anyPayload(3, 0, tag, tc.n)) {
						return fmt.Errorf("the receive from any rank after them named rank %d, want rank 3's message", from)
					}
					return c.Barrier(ctx)
				})
				noErrors(t, errs)
			})
		}
	}
}

// TestP2PRecvAnyOfArgs: PostRecvAnyOf refuses ranks it cannot receive
// from, and on a subset communicator; one whose context ends before a
// message came is withdrawn, naming its ranks, and the communicator goes
// on.
func TestP2PRecvAnyOfArgs(t *testing.T) {
	comms := newWorld(t, tcpMesh, 3, p2pConfig())
	sub, err := comms[0].Subset(1, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		c     *Communicator
		ranks []int
		want  string
	}{
		{"none", comms[0], nil, "no ranks"},
		{"this rank", comms[0], []int{1, 0}, "that is this rank"},
		{"outside the world", comms[0], []int{1, 3}, "outside the world"},
		{"twice", comms[0], []int{2, 1, 2}, "twice"},
		{"on a subset", sub, []int{1}, "not on a subset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.PostRecvAnyOf(tc.ranks, 0, nil).Wait(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("PostRecvAnyOf(%v) returned %v, want an error saying %q", tc.ranks, err, tc.want)
			}
		})
	}
	t.Run("withdrawn", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		from, err := comms[0].PostRecvAnyOf([]int{2}, 5, make([]byte, 8)).Wait(ctx)
		if from != -1 || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "any of ranks [2]") {
			t.Fatalf("a receive from any of ranks [2] with nothing sent returned rank %d, %v; want -1 and a deadline error naming [2]", from, err)
		}
		if err := comms[0].Err(); err != nil {
			t.Fatalf("the withdrawn receive failed the communicator: %v", err)
		}
	})
}
