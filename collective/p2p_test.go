package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/shm"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// p2pPayload is a recognizable message: its bytes name sender, tag and
// position.
func p2pPayload(from int, tag uint64, n int) []byte {
	b := make([]byte, n)
	for i := range min(n, 256) {
		b[i] = byte(from*31 + int(tag)*7 + i)
	}
	// The pattern repeats every 256 bytes: copy it on (fast under -race).
	for done := min(n, 256); done < n; done *= 2 {
		copy(b[done:], b[:done])
	}
	return b
}

var p2pMeshes = []struct {
	name string
	mk   meshFunc
}{
	{"tcp", tcpMesh},
	{"shm", shmMesh},
}

// A small ChunkBytes makes most messages several frames long.
func p2pConfig() Config {
	cfg := DefaultConfig()
	cfg.ChunkBytes = 1024
	return cfg
}

func TestP2PRing(t *testing.T) {
	for _, m := range p2pMeshes {
		for _, n := range []int{0, 1, 1000, 1024, 5000} {
			t.Run(fmt.Sprintf("%s/%dB", m.name, n), func(t *testing.T) {
				const p = 4
				comms := newWorld(t, m.mk, p, p2pConfig())
				errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
					r := c.Rank()
					next, prev := (r+1)%p, (r+p-1)%p
					got := make([]byte, n)
					var sendErr error
					var wg sync.WaitGroup
					wg.Go(func() { sendErr = c.Send(ctx, next, 5, p2pPayload(r, 5, n)) })
					err := c.Recv(ctx, prev, 5, got)
					wg.Wait()
					if err = errors.Join(err, sendErr); err != nil {
						return err
					}
					if !bytes.Equal(got, p2pPayload(prev, 5, n)) {
						return fmt.Errorf("rank %d got the wrong bytes from %d", r, prev)
					}
					// The collectives are in step after the messages.
					v := []int64{int64(r)}
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return err
					}
					if v[0] != p*(p-1)/2 {
						return fmt.Errorf("allreduce after the ring gave %d", v[0])
					}
					return nil
				})
				noErrors(t, errs)
			})
		}
	}
}

// TestP2PTagsOutOfOrder: receives match by tag, not by arrival; messages
// with one tag come in the order sent.
func TestP2PTagsOutOfOrder(t *testing.T) {
	for _, m := range p2pMeshes {
		t.Run(m.name, func(t *testing.T) {
			comms := newWorld(t, m.mk, 2, p2pConfig())
			errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				if c.Rank() == 0 {
					for _, s := range []struct {
						tag uint64
						n   int
					}{{1, 3000}, {2, 100}, {1, 50}, {3, 2048}} {
						if err := c.Send(ctx, 1, s.tag, p2pPayload(s.n, s.tag, s.n)); err != nil {
							return err
						}
					}
					return nil
				}
				for _, s := range []struct {
					tag uint64
					n   int
				}{{3, 2048}, {2, 100}, {1, 3000}, {1, 50}} {
					got := make([]byte, s.n)
					if err := c.Recv(ctx, 0, s.tag, got); err != nil {
						return err
					}
					if !bytes.Equal(got, p2pPayload(s.n, s.tag, s.n)) {
						return fmt.Errorf("tag %d: wrong bytes", s.tag)
					}
				}
				return nil
			})
			noErrors(t, errs)
		})
	}
}

// TestP2PSizeMismatch: a message of another length than the receive's
// buffer fails that receive, whether the message came before it or after;
// the world goes on.
func TestP2PSizeMismatch(t *testing.T) {
	for _, m := range p2pMeshes {
		for _, early := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/message_first=%v", m.name, early), func(t *testing.T) {
				comms := newWorld(t, m.mk, 2, p2pConfig())
				errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
					if c.Rank() == 0 {
						if !early {
							// Wait until rank 1 posted its receive.
							if err := c.Barrier(ctx); err != nil {
								return err
							}
						}
						if err := c.Send(ctx, 1, 9, p2pPayload(0, 9, 3000)); err != nil {
							return err
						}
						if err := c.Send(ctx, 1, 9, p2pPayload(0, 9, 10)); err != nil {
							return err
						}
						if early {
							// Rank 1 receives after this one.
							if err := c.Barrier(ctx); err != nil {
								return err
							}
						}
						return c.Barrier(ctx)
					}
					var mismatch error
					var wg sync.WaitGroup
					if early {
						// The barrier takes the message off the link first.
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						mismatch = c.Recv(ctx, 0, 9, make([]byte, 2000))
					} else {
						wg.Go(func() { mismatch = c.Recv(ctx, 0, 9, make([]byte, 2000)) })
						if err := waitPosted(ctx, c, 0, 1); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						wg.Wait()
					}
					var sm *SizeMismatchError
					if !errors.As(mismatch, &sm) || sm.Peer != 0 || sm.Tag != 9 || sm.Sent != 3000 || sm.Receiving != 2000 {
						return fmt.Errorf("mismatched receive: got %v, want a SizeMismatchError of 3000 against 2000 bytes", mismatch)
					}
					got := make([]byte, 10)
					if err := c.Recv(ctx, 0, 9, got); err != nil {
						return fmt.Errorf("the next message after a mismatch: %w", err)
					}
					if !bytes.Equal(got, p2pPayload(0, 9, 10)) {
						return errors.New("the next message after a mismatch has the wrong bytes")
					}
					return c.Barrier(ctx)
				})
				noErrors(t, errs)
			})
		}
	}
}

// waitPosted polls until rank c has n receives posted from peer.
func waitPosted(ctx context.Context, c *Communicator, peer, n int) error {
	for {
		c.p2p.mu.Lock()
		posted := len(c.p2p.peers[peer].posted)
		c.p2p.mu.Unlock()
		if posted >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d receives posted from rank %d: %w", n, peer, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestP2PRecvBeforeSend: a receive posted long before its message, with
// collectives run meanwhile on both sides (the pump stops for them and the
// collective takes the frames it read), still gets it.
func TestP2PRecvBeforeSend(t *testing.T) {
	for _, m := range p2pMeshes {
		t.Run(m.name, func(t *testing.T) {
			const p = 3
			comms := newWorld(t, m.mk, p, p2pConfig())
			errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				r := c.Rank()
				v := make([]float32, 3000) // several frames: a ring allreduce
				for i := range v {
					v[i] = float32(r)
				}
				switch r {
				case 1:
					got := make([]byte, 4000)
					var recvErr error
					var wg sync.WaitGroup
					wg.Go(func() { recvErr = c.Recv(ctx, 0, 4, got) })
					if err := waitPosted(ctx, c, 0, 1); err != nil {
						return err
					}
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return err
					}
					wg.Wait()
					if recvErr != nil {
						return recvErr
					}
					if !bytes.Equal(got, p2pPayload(0, 4, 4000)) {
						return errors.New("wrong bytes")
					}
				case 0:
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return err
					}
					if err := c.Send(ctx, 1, 4, p2pPayload(0, 4, 4000)); err != nil {
						return err
					}
				default:
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return err
					}
				}
				if v[0] != 3 || v[len(v)-1] != 3 {
					return fmt.Errorf("allreduce gave %v", v[0])
				}
				return c.Barrier(ctx)
			})
			noErrors(t, errs)
		})
	}
}

// TestP2PDeadPeer: a receive from a peer that goes away fails with a
// *transport.PeerError naming it, and the communicator stops.
func TestP2PDeadPeer(t *testing.T) {
	comms := newWorld(t, tcpMesh, 2, p2pConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- comms[1].Recv(ctx, 0, 1, make([]byte, 8)) }()
	if err := waitPosted(ctx, comms[1], 0, 1); err != nil {
		t.Fatal(err)
	}
	comms[0].Close()
	err := <-done
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("receive from a closed peer: %v, want a PeerError naming rank 0", err)
	}
	if comms[1].Err() == nil {
		t.Fatal("the communicator goes on after its peer went away")
	}
	if err := comms[1].Send(ctx, 0, 1, nil); err == nil {
		t.Fatal("a send on the failed communicator succeeded")
	}
}

// TestP2PKeptBound: messages nobody receives yet are kept only up to
// P2PBufferBytes; more fails the communicator with an error that says so.
func TestP2PKeptBound(t *testing.T) {
	cfg := p2pConfig()
	cfg.P2PBufferBytes = 4096
	comms := newWorld(t, tcpMesh, 2, cfg)
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		if c.Rank() == 0 {
			if err := c.Send(ctx, 1, 1, make([]byte, 3000)); err != nil {
				return err
			}
			_ = c.Send(ctx, 1, 2, make([]byte, 3000))
			_ = c.Barrier(ctx)
			return nil
		}
		err := c.Barrier(ctx)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("P2PBufferBytes")) {
			return fmt.Errorf("barrier behind 6000 kept bytes: %v, want an error naming P2PBufferBytes", err)
		}
		return nil
	})
	noErrors(t, errs)
}

// TestP2PArgs: calls that cannot run are refused without harm.
func TestP2PArgs(t *testing.T) {
	comms := newWorld(t, inprocMesh, 2, p2pConfig())
	ctx := context.Background()
	sub, err := comms[0].Subset(1, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"self", comms[0].Send(ctx, 0, 1, nil)},
		{"outside", comms[0].Recv(ctx, 2, 1, nil)},
		{"negative", comms[0].Send(ctx, -1, 1, nil)},
		{"subset", sub.Send(ctx, 1, 1, nil)},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := comms[0].Err(); err != nil {
		t.Fatalf("a refused call broke the communicator: %v", err)
	}
}

// TestP2PCollectiveWhileMessagesInFlight: both ranks send each other a
// message far larger than a link buffers, post its receive, and run small
// collectives (which send before they receive) while the messages are on
// the links: the collectives and the messages all complete, and the bytes
// are right.
func TestP2PCollectiveWhileMessagesInFlight(t *testing.T) {
	for _, m := range p2pMeshes {
		t.Run(m.name, func(t *testing.T) {
			comms := newWorld(t, m.mk, 2, DefaultConfig())
			const n = 16 << 20
			errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				r := c.Rank()
				got := make([]byte, n)
				var sendErr, recvErr error
				var wg sync.WaitGroup
				wg.Go(func() { recvErr = c.Recv(ctx, 1-r, 1, got) })
				if err := waitPosted(ctx, c, 1-r, 1); err != nil {
					return err
				}
				wg.Go(func() { sendErr = c.Send(ctx, 1-r, 1, p2pPayload(r, 1, n)) })
				for range 3 {
					v := []int64{1}
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return err
					}
					if err := c.Barrier(ctx); err != nil {
						return err
					}
				}
				wg.Wait()
				if err := errors.Join(sendErr, recvErr); err != nil {
					return err
				}
				if !bytes.Equal(got, p2pPayload(1-r, 1, n)) {
					return errors.New("wrong bytes")
				}
				return nil
			})
			noErrors(t, errs)
		})
	}
}

// p2pShortTimeoutMeshes are p2pMeshes with a short I/O timeout, so that a
// link whose reader stopped reading fails in seconds rather than in the
// default half minute.
func p2pShortTimeoutMeshes(timeout time.Duration) []struct {
	name string
	mk   meshFunc
} {
	return []struct {
		name string
		mk   meshFunc
	}{
		{"tcp", func(t testing.TB, w transport.World) [][]transport.Link {
			return connectMesh(t, w, func() (transport.Transport, string, error) {
				cfg := tcp.DefaultConfig()
				cfg.Secret = []byte("collective-test-secret")
				cfg.IOTimeout = timeout
				tr, err := tcp.Listen(cfg)
				if err != nil {
					return nil, "", err
				}
				return tr, tr.Addr(), nil
			})
		}},
		{"shm", func(t testing.TB, w transport.World) [][]transport.Link {
			if runtime.GOOS != "linux" {
				t.Skip("the shared-memory transport is Linux-only")
			}
			return connectMesh(t, w, func() (transport.Transport, string, error) {
				cfg := shm.DefaultConfig()
				cfg.Secret = []byte("collective-test-secret")
				cfg.IOTimeout = timeout
				cfg.RingBytes = 1 << 20
				tr, err := shm.Listen(cfg)
				if err != nil {
					return nil, "", err
				}
				return tr, tr.Addr(), nil
			})
		}},
	}
}

// TestP2PSendsBeforeReceivesThenCollective: both ranks send each other a
// message before either posts its receive, then both run a collective
// whose first move is a send, and only then post the receives — legal in
// torch.distributed (isend, all_reduce, irecv, wait). Messages larger than
// the links buffer must not stop the collective: it and the receives
// complete with the right bytes, well within the links' I/O timeout.
func TestP2PSendsBeforeReceivesThenCollective(t *testing.T) {
	const ioTimeout = 3 * time.Second
	for _, m := range p2pShortTimeoutMeshes(ioTimeout) {
		for _, tc := range []struct {
			name  string
			bytes int
			elems int // of the allreduce: 4 is recursive doubling, 256Ki the ring
		}{
			{"1KiB/doubling", 1 << 10, 4},
			{"16KiB/ring", 16 << 10, 256 << 10},
			{"4MiB/doubling", 4 << 20, 4},
			{"64MiB/ring", 64 << 20, 256 << 10},
			{"64MiB/doubling", 64 << 20, 4},
		} {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				if testing.Short() && tc.bytes > 4<<20 {
					t.Skip("64 MiB messages: skipped in -short")
				}
				comms := newWorld(t, m.mk, 2, DefaultConfig())
				errs := onAll(t, comms, 60*time.Second, func(ctx context.Context, c *Communicator) error {
					r := c.Rank()
					payload := p2pPayload(r, 7, tc.bytes)
					sent := make(chan error, 1)
					go func() { sent <- c.Send(ctx, 1-r, 7, payload) }()
					// The collective starts once the send went as far as
					// it goes without the peer's receive: a large one
					// would otherwise still be filling the link.
					if err := waitSendParked(ctx, c, 1-r, sent); err != nil {
						return err
					}
					v := make([]float32, tc.elems)
					for i := range v {
						v[i] = float32(r + 1)
					}
					if err := Allreduce(ctx, c, v, v, Sum); err != nil {
						return fmt.Errorf("allreduce with the messages unreceived: %w", err)
					}
					if v[0] != 3 || v[len(v)-1] != 3 {
						return fmt.Errorf("allreduce gave %v, want 3", v[0])
					}
					got := make([]byte, tc.bytes)
					if err := c.Recv(ctx, 1-r, 7, got); err != nil {
						return fmt.Errorf("receive posted after the allreduce: %w", err)
					}
					if err := <-sent; err != nil {
						return fmt.Errorf("send: %w", err)
					}
					if !bytes.Equal(got, p2pPayload(1-r, 7, tc.bytes)) {
						return errors.New("the message has the wrong bytes")
					}
					return c.Barrier(ctx)
				})
				noErrors(t, errs)
			})
		}
	}
}

// waitSendParked polls until the Send to peer whose result comes on sent
// has gone as far as it can while the peer posts no receive: returned (an
// eager message), or waiting for the peer's clear-to-send. A result that
// came is put back on sent.
func waitSendParked(ctx context.Context, c *Communicator, peer int, sent chan error) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		select {
		case err := <-sent:
			sent <- err
			return nil
		default:
		}
		c.p2p.mu.Lock()
		parked := len(c.p2p.peers[peer].awaiting) > 0
		c.p2p.mu.Unlock()
		if parked {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the send to rank %d neither returned nor waits for the peer's receive: %w", peer, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestP2PRendezvousRefused: a posted receive of another length than a
// message sent by rendezvous refuses it, whether the receive was posted
// before the announcement came or after: the Send and the Recv both fail
// with a *SizeMismatchError, and the next message and a collective go
// through.
func TestP2PRendezvousRefused(t *testing.T) {
	const sent, receiving = 100 << 10, 60 << 10
	for _, m := range p2pMeshes {
		for _, recvFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/receive_first=%v", m.name, recvFirst), func(t *testing.T) {
				comms := newWorld(t, m.mk, 2, p2pConfig())
				errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
					if c.Rank() == 0 {
						if recvFirst {
							if err := c.Barrier(ctx); err != nil { // rank 1 posted
								return err
							}
						}
						err := c.Send(ctx, 1, 3, p2pPayload(0, 3, sent))
						var sm *SizeMismatchError
						if !errors.As(err, &sm) || !sm.Refused || sm.Peer != 1 || sm.Sent != sent || sm.Receiving != receiving {
							return fmt.Errorf("refused send: got %v, want a refused SizeMismatchError of %d against %d bytes", err, sent, receiving)
						}
						if err := c.Send(ctx, 1, 3, p2pPayload(0, 4, sent)); err != nil {
							return fmt.Errorf("the next message after a refusal: %w", err)
						}
						if err := c.Send(ctx, 1, 99, make([]byte, 8)); err != nil {
							return err
						}
						return c.Barrier(ctx)
					}
					// A receive of another tag, posted first, has the pump
					// read the link.
					var last error
					var lastWG sync.WaitGroup
					lastWG.Go(func() { last = c.Recv(ctx, 0, 99, make([]byte, 8)) })
					if err := waitPosted(ctx, c, 0, 1); err != nil {
						return err
					}
					var mismatch error
					if recvFirst {
						var wg sync.WaitGroup
						wg.Go(func() { mismatch = c.Recv(ctx, 0, 3, make([]byte, receiving)) })
						if err := waitPosted(ctx, c, 0, 2); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						wg.Wait()
					} else {
						if err := waitAnnounced(ctx, c, 0); err != nil {
							return err
						}
						mismatch = c.Recv(ctx, 0, 3, make([]byte, receiving))
					}
					var sm *SizeMismatchError
					if !errors.As(mismatch, &sm) || sm.Refused || sm.Peer != 0 || sm.Sent != sent || sm.Receiving != receiving {
						return fmt.Errorf("mismatched receive: got %v, want a SizeMismatchError of %d against %d bytes", mismatch, sent, receiving)
					}
					got := make([]byte, sent)
					if err := c.Recv(ctx, 0, 3, got); err != nil {
						return fmt.Errorf("the next message after a refusal: %w", err)
					}
					if !bytes.Equal(got, p2pPayload(0, 4, sent)) {
						return errors.New("the next message after a refusal has the wrong bytes")
					}
					lastWG.Wait()
					if last != nil {
						return last
					}
					return c.Barrier(ctx)
				})
				noErrors(t, errs)
			})
		}
	}
}

// waitAnnounced polls until rank c keeps an announced (rendezvous) message
// from peer.
func waitAnnounced(ctx context.Context, c *Communicator, peer int) error {
	for {
		c.p2p.mu.Lock()
		announced := slices.ContainsFunc(c.p2p.peers[peer].kept, func(m *p2pMsg) bool { return m.rendezvous })
		c.p2p.mu.Unlock()
		if announced {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for an announcement from rank %d: %w", peer, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestP2PReceiveNeverPosted: a large message whose receive the peer never
// posts (the peer stays silent) fails its Send with a *transport.PeerError
// naming the peer: at the links' I/O timeout, or when the Send's context
// ends first. The peer, reading its link meanwhile, keeps the message's
// announcement, none of its bytes.
func TestP2PReceiveNeverPosted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ioTimeout time.Duration
		ctx       time.Duration
		want      []error // one of
	}{
		// Rank 1, reading with nothing coming either, may time out
		// first and close its links.
		{"io_timeout", time.Second, 30 * time.Second, []error{transport.ErrPeerTimeout, transport.ErrPeerClosed}},
		{"context", 30 * time.Second, 300 * time.Millisecond, []error{context.DeadlineExceeded}},
	} {
		for _, m := range p2pShortTimeoutMeshes(tc.ioTimeout) {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				comms := newWorld(t, m.mk, 2, DefaultConfig())
				ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
				defer cancel()
				// Rank 1 reads the link (a receive of another tag is
				// posted) but never posts the message's receive.
				go func() { _ = comms[1].Recv(ctx, 0, 6, make([]byte, 8)) }()
				sent := make(chan error, 1)
				go func() { sent <- comms[0].Send(ctx, 1, 5, make([]byte, 1<<20)) }()
				if err := waitAnnounced(ctx, comms[1], 0); err != nil {
					t.Fatal(err)
				}
				comms[1].p2p.mu.Lock()
				kept := comms[1].p2p.keptBytes
				comms[1].p2p.mu.Unlock()
				if kept != transport.HeaderSize {
					t.Errorf("the receiver keeps %d bytes for a message whose receive is not posted, want its announcement's %d", kept, transport.HeaderSize)
				}
				err := <-sent
				var pe *transport.PeerError
				if !errors.As(err, &pe) || pe.Rank != 1 || !slices.ContainsFunc(tc.want, func(w error) bool { return errors.Is(err, w) }) {
					t.Fatalf("send to a peer that never receives: %v, want a PeerError naming rank 1 wrapping %v", err, tc.want)
				}
				if comms[0].Err() == nil {
					t.Fatal("the communicator goes on after a send failed part-way")
				}
			})
		}
	}
}

// TestP2PManySmallSendsBeforeReceivesThenCollective: the pattern of
// TestP2PSendsBeforeReceivesThenCollective with many small messages, each
// eager by its size, together far more than the links buffer: beyond the
// eager window they wait for their receives, and the collective run
// before the receives are posted is not stuck behind them.
func TestP2PManySmallSendsBeforeReceivesThenCollective(t *testing.T) {
	const count, size = 4096, 8 << 10 // 32 MiB in all, more than loopback TCP buffers
	for _, m := range p2pShortTimeoutMeshes(3 * time.Second) {
		t.Run(m.name, func(t *testing.T) {
			comms := newWorld(t, m.mk, 2, DefaultConfig())
			errs := onAll(t, comms, 60*time.Second, func(ctx context.Context, c *Communicator) error {
				r := c.Rank()
				sent := make(chan error, 1)
				go func() {
					for k := range count {
						if err := c.Send(ctx, 1-r, 2, p2pPayload(r, uint64(k), size)); err != nil {
							sent <- err
							return
						}
					}
					sent <- nil
				}()
				if err := waitSendParked(ctx, c, 1-r, sent); err != nil {
					return err
				}
				v := []int64{int64(r) + 1}
				if err := Allreduce(ctx, c, v, v, Sum); err != nil {
					return fmt.Errorf("allreduce with the messages unreceived: %w", err)
				}
				if v[0] != 3 {
					return fmt.Errorf("allreduce gave %d, want 3", v[0])
				}
				got := make([]byte, size)
				for k := range count {
					if err := c.Recv(ctx, 1-r, 2, got); err != nil {
						return fmt.Errorf("receive %d: %w", k, err)
					}
					if !bytes.Equal(got, p2pPayload(1-r, uint64(k), size)) {
						return fmt.Errorf("message %d has the wrong bytes", k)
					}
				}
				if err := <-sent; err != nil {
					return fmt.Errorf("send: %w", err)
				}
				c.p2p.mu.Lock()
				kept := c.p2p.keptBytes
				c.p2p.mu.Unlock()
				if kept != 0 {
					return fmt.Errorf("%d bytes still kept after every message was received", kept)
				}
				return c.Barrier(ctx)
			})
			noErrors(t, errs)
		})
	}
}

// TestP2PLargeMessagesReceivedOutOfOrder: two large messages with
// different tags, the second sent while the first waits for its receive,
// received in the other order: the first one's wait does not hold up the
// second (which the receiver wants first).
func TestP2PLargeMessagesReceivedOutOfOrder(t *testing.T) {
	const n = 1 << 20
	for _, m := range p2pMeshes {
		t.Run(m.name, func(t *testing.T) {
			comms := newWorld(t, m.mk, 2, p2pConfig())
			errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
				if c.Rank() == 0 {
					first := make(chan error, 1)
					go func() { first <- c.Send(ctx, 1, 1, p2pPayload(0, 1, n)) }()
					if err := waitSendParked(ctx, c, 1, first); err != nil {
						return err
					}
					if err := c.Send(ctx, 1, 2, p2pPayload(0, 2, n)); err != nil {
						return fmt.Errorf("the second message: %w", err)
					}
					if err := <-first; err != nil {
						return fmt.Errorf("the first message: %w", err)
					}
					return c.Barrier(ctx)
				}
				for _, tag := range []uint64{2, 1} {
					got := make([]byte, n)
					if err := c.Recv(ctx, 0, tag, got); err != nil {
						return fmt.Errorf("tag %d: %w", tag, err)
					}
					if !bytes.Equal(got, p2pPayload(0, tag, n)) {
						return fmt.Errorf("tag %d: wrong bytes", tag)
					}
				}
				return c.Barrier(ctx)
			})
			noErrors(t, errs)
		})
	}
}

// BenchmarkP2PPingPong: rank 0 sends a message to rank 1, which sends it
// back, the receives posted before the sends (as a pipeline stage's irecv
// is): eager below 16 KiB, rendezvous above.
func BenchmarkP2PPingPong(b *testing.B) {
	for _, m := range p2pMeshes {
		for _, n := range []int{1 << 10, 64 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", m.name, n>>10), func(b *testing.B) {
				comms := newWorld(b, m.mk, 2, DefaultConfig())
				ctx := context.Background()
				bufs := [2][]byte{make([]byte, n), make([]byte, n)}
				b.SetBytes(int64(2 * n))
				b.ResetTimer()
				errs := make(chan error, 1)
				go func() {
					c := comms[1]
					for range b.N {
						if err := c.Recv(ctx, 0, 1, bufs[1]); err != nil {
							errs <- err
							return
						}
						if err := c.Send(ctx, 0, 2, bufs[1]); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
				c := comms[0]
				for range b.N {
					if err := c.Send(ctx, 1, 1, bufs[0]); err != nil {
						b.Fatal(err)
					}
					if err := c.Recv(ctx, 1, 2, bufs[0]); err != nil {
						b.Fatal(err)
					}
				}
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
