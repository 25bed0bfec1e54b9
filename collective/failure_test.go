package collective

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// failureTypes are the errors a rank may legitimately see when a collective is
// broken by someone: its own detection, a peer telling it, or a peer vanishing.
func isTypedFailure(err error) bool {
	var mm *MismatchError
	var ra *RemoteAbortError
	var pe *PeerError
	return errors.As(err, &mm) || errors.As(err, &ra) || errors.As(err, &pe)
}

func TestMismatchedCollectivesAllFail(t *testing.T) {
	f32 := func(n int) Buffer { return HostBuffer(Float32, make([]byte, 4*n)) }
	cases := []struct {
		name  string
		call  func(ctx context.Context, c *Communicator) error // run by ranks != odd
		odd   func(ctx context.Context, c *Communicator) error // run by the odd rank
		field string
	}{
		{"count", func(ctx context.Context, c *Communicator) error { b := f32(100); return c.Allreduce(ctx, b, b, Sum) },
			func(ctx context.Context, c *Communicator) error { b := f32(101); return c.Allreduce(ctx, b, b, Sum) }, "element count"},
		{"count ring", func(ctx context.Context, c *Communicator) error { b := f32(100000); return c.Allreduce(ctx, b, b, Sum) },
			func(ctx context.Context, c *Communicator) error { b := f32(100001); return c.Allreduce(ctx, b, b, Sum) }, "element count"},
		{"dtype", func(ctx context.Context, c *Communicator) error { b := f32(10); return c.Allreduce(ctx, b, b, Sum) },
			func(ctx context.Context, c *Communicator) error {
				b := HostBuffer(Int32, make([]byte, 40))
				return c.Allreduce(ctx, b, b, Sum)
			}, "dtype"},
		{"op", func(ctx context.Context, c *Communicator) error { b := f32(10); return c.Allreduce(ctx, b, b, Sum) },
			func(ctx context.Context, c *Communicator) error { b := f32(10); return c.Allreduce(ctx, b, b, Max) }, "reduce op"},
		{"collective", func(ctx context.Context, c *Communicator) error { b := f32(10); return c.Allreduce(ctx, b, b, Sum) },
			func(ctx context.Context, c *Communicator) error { return c.Broadcast(ctx, f32(10), 0) }, "collective"},
		{"root", func(ctx context.Context, c *Communicator) error { return c.Broadcast(ctx, f32(10), 0) },
			func(ctx context.Context, c *Communicator) error { return c.Broadcast(ctx, f32(10), 1) }, ""},
		{"extra collective", func(ctx context.Context, c *Communicator) error { return c.Barrier(ctx) },
			func(ctx context.Context, c *Communicator) error {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				return c.Barrier(ctx)
			}, ""},
	}
	for _, m := range testMeshes {
		for _, tc := range cases {
			for _, p := range []int{2, 3, 5} {
				t.Run(fmt.Sprintf("%s/%s/p=%d", m.name, tc.name, p), func(t *testing.T) {
					comms := newWorld(t, m.mk, p, DefaultConfig())
					start := time.Now()
					// A disagreement that no frame of the call itself reveals (two
					// ranks both acting as a broadcast root, one rank running an
					// extra collective) shows at the next collective.
					errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
						call := tc.call
						if c.Rank() == 1 {
							call = tc.odd
						}
						if err := call(ctx, c); err != nil {
							return err
						}
						b := f32(3)
						return c.Allreduce(ctx, b, b, Min)
					})
					if el := time.Since(start); el > 5*time.Second {
						t.Errorf("ranks took %v to fail", el)
					}
					sawMismatch := false
					for r, err := range errs {
						if err == nil {
							t.Fatalf("rank %d: no error", r)
						}
						if !isTypedFailure(err) {
							t.Fatalf("rank %d: untyped error %v", r, err)
						}
						if errors.Is(err, context.DeadlineExceeded) {
							t.Fatalf("rank %d: only the deadline stopped it: %v", r, err)
						}
						var mm *MismatchError
						if errors.As(err, &mm) {
							sawMismatch = true
							if tc.field != "" && mm.Field != tc.field {
								t.Errorf("rank %d: mismatch in %q, want %q", r, mm.Field, tc.field)
							}
						}
					}
					if !sawMismatch {
						t.Fatalf("no rank reported the mismatch: %v", errs)
					}
					for r, c := range comms {
						if c.Err() == nil {
							t.Fatalf("rank %d: communicator still usable after a mismatch", r)
						}
					}
				})
			}
		}
	}
}

func TestSilentPeerTimesOutNamingIt(t *testing.T) {
	comms := newWorld(t, inprocMesh, 3, DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// Rank 2 never joins the collective.
	errs := make(chan error, 2)
	for _, c := range comms[:2] {
		go func() {
			b := HostBuffer(Float32, make([]byte, 4000))
			errs <- c.Allreduce(ctx, b, b, Sum)
		}()
	}
	for range 2 {
		select {
		case err := <-errs:
			var pe *PeerError
			var ra *RemoteAbortError
			switch {
			case errors.As(err, &pe):
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("want a deadline error, got %v", err)
				}
			case errors.As(err, &ra):
			default:
				t.Fatalf("want a typed error, got %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("collective did not return after its deadline")
		}
	}
}

func TestAbortWakesBlockedCollective(t *testing.T) {
	comms := newWorld(t, inprocMesh, 2, DefaultConfig())
	done := make(chan error, 1)
	go func() {
		b := HostBuffer(Float32, make([]byte, 1<<20))
		done <- comms[0].Allreduce(context.Background(), b, b, Sum)
	}()
	comms[0].Abort(errors.New("membership changed"))
	select {
	case err := <-done:
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("want ErrAborted, got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not wake the collective")
	}
	b := HostBuffer(Float32, make([]byte, 4))
	if err := comms[0].Allreduce(context.Background(), b, b, Sum); !errors.Is(err, ErrAborted) {
		t.Fatalf("after Abort: want ErrAborted, got %v", err)
	}
	// The peer learns through its links closing.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := comms[1].Allreduce(ctx, b, b, Sum)
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 || !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("peer of an aborted rank: want PeerError(rank 0, closed), got %v", err)
	}
}

func TestPeerClosingMidCollective(t *testing.T) {
	for _, m := range testMeshes {
		for _, p := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s/p=%d", m.name, p), func(t *testing.T) {
				comms := newWorld(t, m.mk, p, Config{SmallMessageBytes: -1, ChunkBytes: 4096, AbortTimeout: time.Second})
				victim := p - 1
				errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
					b := HostBuffer(Float32, make([]byte, 4<<20))
					if c.Rank() == victim {
						// Take part in the first collective, then vanish mid-way
						// through the second.
						if err := c.Allreduce(ctx, b, b, Sum); err != nil {
							return err
						}
						c.Close()
						return nil
					}
					if err := c.Allreduce(ctx, b, b, Sum); err != nil {
						return fmt.Errorf("first allreduce: %w", err)
					}
					return c.Allreduce(ctx, b, b, Sum)
				})
				for r, err := range errs {
					if r == victim {
						continue
					}
					if err == nil || !isTypedFailure(err) || errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("rank %d: want a typed failure, got %v", r, err)
					}
				}
			})
		}
	}
}

func TestCancelledContextBeforeStartKeepsWorld(t *testing.T) {
	comms := newWorld(t, inprocMesh, 2, DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := HostBuffer(Float32, make([]byte, 4))
	if err := comms[0].Allreduce(ctx, b, b, Sum); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
		return c.Allreduce(ctx, b, HostBuffer(Float32, make([]byte, 4)), Sum)
	}))
}
