package collective

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// TestRelease: a healthy communicator hands over the links Release asks
// for, open and working, and closes the others; one that has failed hands
// over nothing. Either way it runs no collective afterwards.
func TestRelease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failed bool
	}{
		{"healthy", false},
		{"failed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, inprocMesh, 3, Config{})
			noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
				v := []float32{1}
				return Allreduce(ctx, c, v, v, Sum)
			}))
			if tc.failed {
				comms[0].Abort(errors.New("test"))
			}
			out := comms[0].Release(func(r int) bool { return r == 1 })
			if tc.failed {
				if out != nil {
					t.Fatalf("a failed communicator handed over %v", out)
				}
			} else {
				if out == nil || out[1] == nil || out[2] != nil {
					t.Fatalf("handed over %v, want the link to rank 1 alone", out)
				}
				// The link to rank 1 still carries frames; the one to rank 2 is closed.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				h := transport.Header{Kind: transport.FrameData, Length: 1}
				if err := out[1].Send(ctx, &h, []byte{7}); err != nil {
					t.Fatalf("the handed-over link: %v", err)
				}
				var got transport.Header
				if err := comms[1].links[0].RecvHeader(ctx, &got); err != nil || got.Length != 1 {
					t.Fatalf("rank 1 receiving on the handed-over link: %+v, %v", got, err)
				}
				if err := comms[2].links[0].RecvHeader(ctx, &got); !errors.Is(err, transport.ErrPeerClosed) {
					t.Fatalf("rank 2's link to a released rank 0: %v, want ErrPeerClosed", err)
				}
				out[1].Close()
			}
			v := []float32{1}
			if err := Allreduce(context.Background(), comms[0], v, v, Sum); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrAborted) {
				t.Fatalf("a collective after Release: %v, want ErrClosed or ErrAborted", err)
			}
		})
	}
}

// TestReleaseKeepsNoLinkWithMessages: a link that point-to-point traffic is
// on is not handed over, since the next world's first reader of it would
// meet this world's frames; the others are, and the waiting receive ends
// with the communicator.
func TestReleaseKeepsNoLinkWithMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy func(t *testing.T, comms []*Communicator) <-chan error
	}{
		{"receive posted", func(t *testing.T, comms []*Communicator) <-chan error {
			done := make(chan error, 1)
			go func() { done <- comms[0].Recv(context.Background(), 1, 9, make([]byte, 4)) }()
			waitFor(t, "the receive's pump", func() bool {
				comms[0].p2p.mu.Lock()
				defer comms[0].p2p.mu.Unlock()
				return comms[0].p2p.peers[1].pumping
			})
			return done
		}},
		{"message kept", func(t *testing.T, comms []*Communicator) <-chan error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := comms[1].Send(ctx, 0, 9, []byte{1, 2, 3, 4}); err != nil {
				t.Fatal(err)
			}
			// A collective on rank 0 meets the message first and keeps it.
			noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
				v := []float32{1}
				return Allreduce(ctx, c, v, v, Sum)
			}))
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, inprocMesh, 3, Config{})
			done := tc.busy(t, comms)
			out := comms[0].Release(func(int) bool { return true })
			if out == nil || out[1] != nil || out[2] == nil {
				t.Fatalf("handed over %v, want the link to rank 2 alone", out)
			}
			out[2].Close()
			if done != nil {
				if err := <-done; !errors.Is(err, ErrClosed) {
					t.Fatalf("the receive waiting at the release: %v, want ErrClosed", err)
				}
			}
		})
	}
}

// TestReleaseSubsets: subset communicators (Subset) run on their parent's
// links, so only the parent hands links over. Releasing a subset closes it
// alone; a released parent's subsets stop and leave the handed links open
// (closing or aborting them then closes nothing); and a parent whose
// subset has a collective running on the shared links hands nothing over.
func TestReleaseSubsets(t *testing.T) {
	allreduce := func(ctx context.Context, c *Communicator) error {
		v := []float32{1}
		return Allreduce(ctx, c, v, v, Sum)
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, comms []*Communicator, subs [][]*Communicator)
	}{
		{"subset released", func(t *testing.T, comms []*Communicator, subs [][]*Communicator) {
			if out := subs[0][0].Release(func(int) bool { return true }); out != nil {
				t.Fatalf("a subset handed over %v", out)
			}
			if err := allreduce(context.Background(), subs[0][0]); !errors.Is(err, ErrClosed) {
				t.Fatalf("the released subset's collective: %v, want ErrClosed", err)
			}
			// The parent's links are untouched: the world still reduces.
			noErrors(t, onAll(t, comms, 5*time.Second, allreduce))
		}},
		{"parent released", func(t *testing.T, comms []*Communicator, subs [][]*Communicator) {
			out := comms[0].Release(func(int) bool { return true })
			if out == nil || out[1] == nil || out[2] == nil {
				t.Fatalf("handed over %v, want the links to ranks 1 and 2", out)
			}
			defer out[1].Close()
			defer out[2].Close()
			if err := allreduce(context.Background(), subs[0][0]); !errors.Is(err, ErrClosed) {
				t.Fatalf("a released parent's subset: %v, want ErrClosed", err)
			}
			subs[0][0].Abort(errors.New("test"))
			subs[0][0].Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h := transport.Header{Kind: transport.FrameData, Length: 1}
			if err := out[1].Send(ctx, &h, []byte{7}); err != nil {
				t.Fatalf("the handed-over link after the subset closed: %v", err)
			}
			var got transport.Header
			if err := comms[1].links[0].RecvHeader(ctx, &got); err != nil || got.Length != 1 {
				t.Fatalf("rank 1 receiving on the handed-over link: %+v, %v", got, err)
			}
		}},
		{"subset collective running", func(t *testing.T, comms []*Communicator, subs [][]*Communicator) {
			// Rank 0 starts a subset allreduce that rank 1 never joins: its
			// frames are on the shared link when the parent is released.
			done := make(chan error, 1)
			go func() { done <- allreduce(context.Background(), subs[0][0]) }()
			deadline := time.Now().Add(5 * time.Second)
			for !subs[0][0].Progress().InFlight {
				if time.Now().After(deadline) {
					t.Fatal("the subset's collective never started")
				}
				runtime.Gosched()
			}
			if out := comms[0].Release(func(int) bool { return true }); out != nil {
				t.Fatalf("handed over %v while a subset's collective ran on the links", out)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the subset's collective succeeded without its peer")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the subset's collective still runs after its parent closed")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, inprocMesh, 3, Config{})
			subs := subsetsOf(t, comms, [][]int{{0, 1}})
			tc.run(t, comms, subs)
		})
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}
