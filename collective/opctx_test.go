package collective

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

type ctxKey struct{}

// TestOpContextBind: an opContext follows the context it is bound to —
// values, deadline, end and cause — and is reused from one binding to the
// next unless it was canceled.
func TestOpContextBind(t *testing.T) {
	errHalf := errors.New("the sending half failed")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, x *opContext)
	}{
		{"the parent's values and deadline", func(t *testing.T, x *opContext) {
			dl := time.Now().Add(time.Hour)
			parent, cancel := context.WithDeadline(context.WithValue(context.Background(), ctxKey{}, "v"), dl)
			defer cancel()
			x = x.bind(parent)
			if got := x.Value(ctxKey{}); got != "v" {
				t.Errorf("Value = %v, want v", got)
			}
			if got, ok := x.Deadline(); !ok || !got.Equal(dl) {
				t.Errorf("Deadline = %v, %v, want %v", got, ok, dl)
			}
			if x.Err() != nil {
				t.Errorf("Err = %v before anything ended", x.Err())
			}
		}},
		{"the parent ending ends it", func(t *testing.T, x *opContext) {
			cause := errors.New("step abandoned")
			parent, cancel := context.WithCancelCause(context.Background())
			x = x.bind(parent)
			cancel(cause)
			waitDone(t, x)
			if !errors.Is(x.Err(), context.Canceled) || x.Cause() != cause {
				t.Errorf("Err, Cause = %v, %v, want context.Canceled, %v", x.Err(), x.Cause(), cause)
			}
		}},
		{"the parent's deadline ends it", func(t *testing.T, x *opContext) {
			parent, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			defer cancel()
			x = x.bind(parent)
			waitDone(t, x)
			if !errors.Is(x.Err(), context.DeadlineExceeded) {
				t.Errorf("Err = %v, want context.DeadlineExceeded", x.Err())
			}
		}},
		{"a half's cancel ends it with its cause", func(t *testing.T, x *opContext) {
			x = x.bind(context.Background())
			x.cancel(errHalf)
			x.cancel(errors.New("later"))
			waitDone(t, x)
			if !errors.Is(x.Err(), context.Canceled) || x.Cause() != errHalf {
				t.Errorf("Err, Cause = %v, %v, want context.Canceled, %v", x.Err(), x.Cause(), errHalf)
			}
		}},
		{"the same parent again: the same opContext", func(t *testing.T, x *opContext) {
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			y := x.bind(parent)
			if z := y.bind(parent); z != y {
				t.Error("rebinding to the same context made a new opContext")
			}
		}},
		{"another live parent: the same opContext, no longer following the first", func(t *testing.T, x *opContext) {
			first, cancelFirst := context.WithCancel(context.Background())
			y := x.bind(first)
			second, cancelSecond := context.WithCancel(context.Background())
			defer cancelSecond()
			if z := y.bind(second); z != y {
				t.Error("switching to another live context made a new opContext")
			}
			cancelFirst()
			if y.Err() != nil {
				t.Errorf("the first context's end reached the opContext bound to the second: %v", y.Err())
			}
			cancelSecond()
			waitDone(t, y)
		}},
		{"the parent ended between collectives: a fresh opContext", func(t *testing.T, x *opContext) {
			first, cancelFirst := context.WithCancel(context.Background())
			y := x.bind(first)
			cancelFirst()
			z := y.bind(context.Background())
			if z == y {
				t.Fatal("an opContext whose parent ended was reused")
			}
			if z.Err() != nil {
				t.Errorf("fresh opContext: Err = %v", z.Err())
			}
		}},
		{"context.AfterFunc on it: runs once it ends, unless stopped", func(t *testing.T, x *opContext) {
			parent, cancel := context.WithCancel(context.Background())
			x = x.bind(parent)
			ran := make(chan string, 3)
			context.AfterFunc(x, func() { ran <- "kept" })
			stop := context.AfterFunc(x, func() { ran <- "stopped" })
			x.mu.Lock()
			registered := len(x.after)
			x.mu.Unlock()
			if registered != 2 {
				t.Fatalf("%d functions registered with the opContext, want 2 (context.AfterFunc did not use its AfterFunc method)", registered)
			}
			if !stop() {
				t.Fatal("stop before the end returned false")
			}
			cancel()
			waitDone(t, x)
			if got := <-ran; got != "kept" {
				t.Errorf("ran %q, want kept", got)
			}
			context.AfterFunc(x, func() { ran <- "late" })
			if got := <-ran; got != "late" {
				t.Errorf("ran %q, want late (registered after the end)", got)
			}
			select {
			case got := <-ran:
				t.Errorf("%q ran too", got)
			default:
			}
		}},
		{"canceled by a half: never reused", func(t *testing.T, x *opContext) {
			y := x.bind(context.Background())
			y.cancel(errHalf)
			if z := y.bind(context.Background()); z == y || z.Err() != nil {
				t.Errorf("after a cancel, bind returned the same (%v) or a spent (%v) opContext", z == y, z.Err())
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newOpContext()) })
	}
}

func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the opContext did not end")
	}
}

// TestCollectivesAcrossContexts: a communicator serves collectives under
// contexts that change, end between collectives, or stay the same, and a
// context ending during one still stops it.
func TestCollectivesAcrossContexts(t *testing.T) {
	for _, tc := range []struct {
		name string
		mesh meshFunc
	}{
		{"inproc", inprocMesh},
		{"tcp", tcpMesh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const p = 3
			comms := newWorld(t, tc.mesh, p, DefaultConfig())
			bufs := make([][]float32, p)
			for r := range bufs {
				bufs[r] = make([]float32, 64<<10) // the pipelined ring: both halves run
			}
			shared, cancelShared := context.WithTimeout(context.Background(), time.Minute)
			defer cancelShared()
			for i, pick := range []string{"shared", "own-then-canceled", "shared", "background", "own-then-canceled", "own-then-canceled", "shared"} {
				errs := onAll(t, comms, time.Minute, func(_ context.Context, c *Communicator) error {
					ctx := shared
					switch pick {
					case "own-then-canceled":
						own, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, i), time.Minute)
						defer cancel()
						ctx = own
					case "background":
						ctx = context.Background()
					}
					buf := bufs[c.Rank()]
					for j := range buf {
						buf[j] = float32(c.Rank() + i)
					}
					if err := Allreduce(ctx, c, buf, buf, Sum); err != nil {
						return err
					}
					if want := float32(p*i + p*(p-1)/2); buf[0] != want || buf[len(buf)-1] != want {
						t.Errorf("collective %d (%s): rank %d has %v…%v, want %v", i, pick, c.Rank(), buf[0], buf[len(buf)-1], want)
					}
					return nil
				})
				noErrors(t, errs)
			}
			// A context that ends while the collective waits stops it: rank 0
			// waits for peers that never come.
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := Allreduce(ctx, comms[0], bufs[0], bufs[0], Sum)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a collective whose context ended returned %v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// TestDroppedCommunicatorStopsItsHelper: a communicator that is dropped
// without Close does not leak its helper goroutine: the goroutine exits once
// the communicator is garbage.
func TestDroppedCommunicatorStopsItsHelper(t *testing.T) {
	const p = 2
	w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, p)}
	mesh := inprocMesh(t, w)
	helpers := make([]*helper, p)
	func() {
		comms := make([]*Communicator, p)
		for r := range comms {
			w.Rank = r
			c, err := NewFromLinks(w, mesh[r], DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			comms[r], helpers[r] = c, c.helper
		}
		errs := onAll(t, comms, time.Minute, func(ctx context.Context, c *Communicator) error {
			buf := make([]float32, 256<<10) // the pipelined ring: the helper starts
			return Allreduce(ctx, c, buf, buf, Sum)
		})
		noErrors(t, errs)
		for _, h := range helpers {
			if !h.started {
				t.Fatal("the ring ran without the helper goroutine")
			}
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for _, h := range helpers {
		for stopped := false; !stopped; {
			runtime.GC()
			select {
			case <-h.quit:
				stopped = true
			case <-time.After(10 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatal("a dropped communicator's helper goroutine was not stopped")
				}
			}
		}
	}
}

// A communicator that is closed, or spent by a failed collective, stops
// watching its caller's context: a trainer's context lives as long as the
// process while a job under churn spends a communicator per world, and
// each registration left on it would keep its communicator's opContext
// (and the context it was bound to before) alive. Measured as the live
// heap after many worlds of two ranks, each running an allreduce under one
// long-lived context and then closed or aborted.
func TestSpentCommunicatorsReleaseTheContext(t *testing.T) {
	const worlds = 2000
	for _, tc := range []struct {
		name string
		end  func(c *Communicator)
	}{
		{"closed", func(c *Communicator) { c.Close() }},
		{"aborted", func(c *Communicator) { c.Abort(errors.New("the world changed")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			world := func() {
				w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, 2)}
				mesh := inprocMesh(t, w)
				comms := make([]*Communicator, 2)
				for r := range comms {
					w.Rank = r
					c, err := NewFromLinks(w, mesh[r], Config{})
					if err != nil {
						t.Fatal(err)
					}
					comms[r] = c
				}
				errs := make(chan error, 2)
				for _, c := range comms {
					go func() {
						f := make([]byte, 16)
						errs <- c.Allreduce(parent, HostBuffer(Float32, f), HostBuffer(Float32, f), Sum)
					}()
				}
				for range comms {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				for _, c := range comms {
					tc.end(c)
				}
			}
			// The live heap wanders by a hundred KiB or so from one
			// reading to the next (pools, goroutine stacks, the race
			// detector's shadow), as much as 2000 worlds of a 64 B leak.
			// So it is read as the least of several readings, before and
			// after 4 batches of worlds (the least of the last two
			// batches' readings), and the growth is spread over them all.
			for range 100 { // warm-up
				world()
			}
			before := leastLiveHeap(3)
			var after []uint64
			for range 4 {
				for range worlds {
					world()
				}
				after = append(after, leastLiveHeap(3))
			}
			last := min(after[2], after[3])
			if per := (float64(last) - float64(before)) / (4 * worlds); per > 64 {
				t.Errorf("the live heap grew by %.0f B per world of two closed communicators, want at most 64 (%d -> %v)", per, before, after)
			}
		})
	}
}

// leastLiveHeap is the least of n readings of liveHeap.
func leastLiveHeap(n int) uint64 {
	least := liveHeap()
	for range n - 1 {
		least = min(least, liveHeap())
	}
	return least
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
