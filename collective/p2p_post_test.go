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

// TestP2PPostedSendsKeepTheirOrder: rank 1 posts sends to rank 0 with one
// tag and waits for them on goroutines started in the opposite order (as
// an engine's goroutines may run): rank 0 receives them in the order they
// were posted. A posted send whose wait gives up (its context ended
// before the sends posted earlier took the link) is not sent, and those
// posted after it are still received in order. Small (eager) and large
// (rendezvous) messages.
func TestP2PPostedSendsKeepTheirOrder(t *testing.T) {
	const tag = 5
	for _, m := range p2pMeshes {
		for _, n := range []int{100, 40000} {
			for _, giveUp := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%dB/give_up=%v", m.name, n, giveUp), func(t *testing.T) {
					const sends = 6
					const abandoned = 2 // the send that gives up, when giveUp
					comms := newWorld(t, m.mk, 2, p2pConfig())
					errs := onAll(t, comms, 60*time.Second, func(ctx context.Context, c *Communicator) error {
						want := []int{}
						for k := range sends {
							if !giveUp || k != abandoned {
								want = append(want, k)
							}
						}
						if c.Rank() == 0 {
							for _, k := range want {
								buf := make([]byte, n)
								if err := c.Recv(ctx, 1, tag, buf); err != nil {
									return err
								}
								if !bytes.Equal(buf, p2pPayload(k, tag, n)) {
									return fmt.Errorf("message %d received where message %d was posted", payloadIndex(buf, tag, n, sends), k)
								}
							}
							return c.Barrier(ctx)
						}
						posted := make([]*PostedSend, sends)
						for k := range posted {
							posted[k] = c.PostSend(0, tag, p2pPayload(k, tag, n))
						}
						if giveUp {
							// Before the earlier sends have their turn: it gives its place up.
							gone, cancel := context.WithCancel(ctx)
							cancel()
							if err := posted[abandoned].Wait(gone); !errors.Is(err, context.Canceled) {
								return fmt.Errorf("the send whose context ended: %v", err)
							}
						}
						var wg sync.WaitGroup
						errs := make([]error, sends)
						for k := sends - 1; k >= 0; k-- {
							if giveUp && k == abandoned {
								continue
							}
							wg.Go(func() { errs[k] = posted[k].Wait(ctx) })
						}
						wg.Wait()
						if err := errors.Join(errs...); err != nil {
							return err
						}
						return c.Barrier(ctx)
					})
					for r, err := range errs {
						if err != nil {
							t.Errorf("rank %d: %v", r, err)
						}
					}
				})
			}
		}
	}
}

// payloadIndex says which of the first n messages p2pPayload made buf is
// (-1: none).
func payloadIndex(buf []byte, tag uint64, size, n int) int {
	for k := range n {
		if bytes.Equal(buf, p2pPayload(k, tag, size)) {
			return k
		}
	}
	return -1
}
