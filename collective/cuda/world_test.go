package cuda

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// runWorld runs fn on p in-process ranks and returns each rank's bytes.
func runWorld(t *testing.T, p int, cfg collective.Config, fn func(ctx context.Context, c *collective.Communicator) ([]byte, error)) [][]byte {
	t.Helper()
	w := transport.World{JobID: "cuda-test", Epoch: 1, Addrs: make([]string, p)}
	mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch}, p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][]byte, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		w.Rank = r
		c, err := collective.NewFromLinks(w, mesh[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[c.Rank()], errs[c.Rank()] = fn(ctx, c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// hostAllreduce is the allreduce of every rank's bytes in on host memory, at
// p in-process ranks: what the device's must give, bit for bit.
func hostAllreduce(t *testing.T, p int, cfg collective.Config, dt collective.DType, in [][]byte, op collective.ReduceOp, opts ...collective.Option) [][]byte {
	t.Helper()
	return runWorld(t, p, cfg, func(ctx context.Context, c *collective.Communicator) ([]byte, error) {
		b := append([]byte(nil), in[c.Rank()]...)
		buf := collective.Buffer{DType: dt, Count: len(b) / dt.Size(), Host: b}
		return b, c.Allreduce(ctx, buf, buf, op, opts...)
	})
}

// uploadRank is new memory of d holding b, for a rank's goroutine (no
// t.Fatal there); the caller frees it.
func uploadRank(ctx context.Context, d *Device, b []byte) (*Memory, error) {
	m, err := d.Alloc(ctx, len(b))
	if err != nil {
		return nil, err
	}
	if err := m.CopyFromHost(ctx, 0, b); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}
