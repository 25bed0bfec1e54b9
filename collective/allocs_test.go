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

// TestAllreduceSteadyStateAllocations: once a communicator has run an
// allreduce of a size, more of them allocate nothing, on every transport,
// on the small-message path and on the pipelined ring.
func TestAllreduceSteadyStateAllocations(t *testing.T) {
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
				t.Run(fmt.Sprintf("%s/p=%d/%dKiB", tc.name, p, size>>10), func(t *testing.T) {
					checkSteadyAllocs(t, newWorld(t, tc.mesh, p, DefaultConfig()), size)
				})
			}
		}
	}
}

// checkSteadyAllocs measures rank 0's allreduces with testing.AllocsPerRun
// (which counts the whole process's allocations, the other ranks' included)
// while the other ranks run theirs in step.
func checkSteadyAllocs(t *testing.T, comms []*Communicator, size int) {
	const runs = 50
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bufs := make([][]float32, len(comms))
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
	}
	// AllocsPerRun calls its function once more, to warm up.
	errs := make(chan error, len(comms)-1)
	for r := 1; r < len(comms); r++ {
		go func() {
			for range runs + 1 {
				if err := Allreduce(ctx, comms[r], bufs[r], bufs[r], Sum); err != nil {
					errs <- fmt.Errorf("rank %d: %w", r, err)
					return
				}
			}
			errs <- nil
		}()
	}
	var failed error
	allocs := testing.AllocsPerRun(runs, func() {
		if failed != nil {
			return
		}
		failed = Allreduce(ctx, comms[0], bufs[0], bufs[0], Sum)
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
	if allocs != 0 {
		t.Errorf("%d-byte allreduce among %d ranks: %v allocations per call, want 0", size, len(comms), allocs)
	}
}
