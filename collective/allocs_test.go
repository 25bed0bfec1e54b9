package collective

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

// shmMesh connects a world over the shared-memory transport, one transport
// per rank, all in this process.
func shmMesh(t testing.TB, w transport.World) [][]transport.Link {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport is Linux-only")
	}
	return connectMesh(t, w, func() (transport.Transport, string, error) {
		cfg := shm.DefaultConfig()
		cfg.Secret = []byte("collective-test-secret")
		cfg.IOTimeout = 10 * time.Second
		cfg.RingBytes = 1 << 20 // keep /dev/shm use low
		tr, err := shm.Listen(cfg)
		if err != nil {
			return nil, "", err
		}
		return tr, tr.Addr(), nil
	})
}

// TestSteadyStateAllocations: once a communicator has run a collective of a
// shape, more of them allocate nothing, on every transport: allreduce on the
// small-message path and on the pipelined ring (plain, and averaging with
// prescale and postscale), broadcast down the tree and the chain, allgather,
// reduce-scatter, alltoall and barrier.
func TestSteadyStateAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("connects real transports")
	}
	for _, tc := range []struct {
		name string
		mesh meshFunc
	}{
		{"inproc", inprocMesh},
		{"tcp", tcpMesh},
		{"shm", shmMesh},
	} {
		for _, p := range []int{2, 3} {
			for _, size := range []int{4 << 10, 1 << 20} {
				for _, coll := range steadyCollectives {
					t.Run(fmt.Sprintf("%s/p=%d/%dKiB/%s", tc.name, p, size>>10, coll.name), func(t *testing.T) {
						checkSteadyAllocs(t, newWorld(t, tc.mesh, p, DefaultConfig()), size, coll.run)
					})
				}
			}
		}
	}
}

// steadyCollectives are the collectives TestSteadyStateAllocations runs:
// run does one on rank c.Rank() with buffers made for size bytes.
var steadyCollectives = []struct {
	name string
	run  func(size int) func(ctx context.Context, c *Communicator) error
}{
	{"allreduce", func(size int) func(ctx context.Context, c *Communicator) error {
		buf := make([]float32, size/4)
		return func(ctx context.Context, c *Communicator) error { return Allreduce(ctx, c, buf, buf, Sum) }
	}},
	{"allreduce-scaled", func(size int) func(ctx context.Context, c *Communicator) error {
		send, recv := make([]float32, size/4), make([]float32, size/4)
		return func(ctx context.Context, c *Communicator) error {
			return Allreduce(ctx, c, send, recv, Average, Prescale(0.5), Postscale(2))
		}
	}},
	{"broadcast", func(size int) func(ctx context.Context, c *Communicator) error {
		buf := make([]float32, size/4)
		return func(ctx context.Context, c *Communicator) error { return Broadcast(ctx, c, buf, 1) }
	}},
	{"allgather", func(size int) func(ctx context.Context, c *Communicator) error {
		var send, recv []float32
		return func(ctx context.Context, c *Communicator) error {
			if send == nil {
				n := size / 4 / c.Size()
				send, recv = make([]float32, n), make([]float32, n*c.Size())
			}
			return Allgather(ctx, c, send, recv)
		}
	}},
	{"reducescatter", func(size int) func(ctx context.Context, c *Communicator) error {
		var send, recv []float32
		return func(ctx context.Context, c *Communicator) error {
			if send == nil {
				send = make([]float32, size/4)
				recv = make([]float32, evenCounts(len(send), c.Size())[c.Rank()])
			}
			return ReduceScatter(ctx, c, send, recv, Sum, Postscale(0.5))
		}
	}},
	{"alltoall", func(size int) func(ctx context.Context, c *Communicator) error {
		var send, recv []float32
		return func(ctx context.Context, c *Communicator) error {
			if send == nil {
				n := size / 4 / c.Size() * c.Size()
				send, recv = make([]float32, n), make([]float32, n)
			}
			return Alltoall(ctx, c, send, recv)
		}
	}},
	{"barrier", func(int) func(ctx context.Context, c *Communicator) error {
		return func(ctx context.Context, c *Communicator) error { return c.Barrier(ctx) }
	}},
}

// checkSteadyAllocs measures rank 0's collectives (newRun(size) for each
// rank) with testing.AllocsPerRun (which counts the whole process's
// allocations, the other ranks' included) while the other ranks run theirs
// in step. A rank that sends and returns (a broadcast's root) may run ahead
// of peers the scheduler holds back, further than in any earlier call, and
// the frames it queues further ahead need buffers once (the in-process
// transport's copies): so it measures up to steadyAttempts times and wants
// one run of calls that allocates nothing; an allocation per call fails
// every attempt.
func checkSteadyAllocs(t *testing.T, comms []*Communicator, size int, newRun func(size int) func(ctx context.Context, c *Communicator) error) {
	const calls = 50
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runs := make([]func(ctx context.Context, c *Communicator) error, len(comms))
	for r := range runs {
		runs[r] = newRun(size)
	}
	var seen []float64
	for range steadyAttempts {
		// AllocsPerRun calls its function once more, to warm up.
		errs := make(chan error, len(comms)-1)
		for r := 1; r < len(comms); r++ {
			go func() {
				for range calls + 1 {
					if err := runs[r](ctx, comms[r]); err != nil {
						errs <- fmt.Errorf("rank %d: %w", r, err)
						return
					}
				}
				errs <- nil
			}()
		}
		var failed error
		allocs := testing.AllocsPerRun(calls, func() {
			if failed != nil {
				return
			}
			failed = runs[0](ctx, comms[0])
		})
		if failed != nil {
			cancel()
		}
		for range len(comms) - 1 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if failed != nil {
			t.Fatalf("rank 0: %v", failed)
		}
		if t.Failed() {
			return
		}
		if allocs == 0 {
			return
		}
		seen = append(seen, allocs)
	}
	t.Errorf("%d bytes among %d ranks: %v allocations per call in %d runs of %d calls, want 0 in one", size, len(comms), seen, steadyAttempts, calls)
}

// steadyAttempts is how many runs of calls checkSteadyAllocs measures at
// most.
const steadyAttempts = 3
