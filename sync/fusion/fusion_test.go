package fusion

import (
	"context"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

func world(t *testing.T, p int) []*collective.Communicator {
	t.Helper()
	mesh := inproc.Mesh(inproc.Config{JobID: "fusion", Epoch: 1, IOTimeout: 5 * time.Second}, p)
	comms := make([]*collective.Communicator, p)
	for r := range comms {
		c, err := collective.NewFromLinks(transport.World{JobID: "fusion", Epoch: 1, Rank: r, Addrs: make([]string, p)}, mesh[r], collective.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = c
		t.Cleanup(func() { c.Close() })
	}
	return comms
}

func onEach(t *testing.T, comms []*collective.Communicator, fn func(ctx context.Context, c *collective.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(comms))
	var wg stdsync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(ctx, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// layers returns tensors of the given sizes filled with rank-dependent values.
func layers(rank int, sizes []int) [][]float32 {
	ts := make([][]float32, len(sizes))
	for i, n := range sizes {
		ts[i] = make([]float32, n)
		for j := range ts[i] {
			ts[i][j] = float32(rank + i + j%5)
		}
	}
	return ts
}

func TestFuserMatchesPerTensorAllreduce(t *testing.T) {
	sizes := []int{1, 3, 100, 7, 0, 40, 2, 500, 16, 16, 16, 1}
	for _, threshold := range []int{4, 64, 256, 1 << 20} {
		for _, p := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("threshold=%d/p=%d", threshold, p), func(t *testing.T) {
				comms := world(t, p)
				onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
					got := layers(c.Rank(), sizes)
					if err := NewFuser(threshold).Allreduce(ctx, c, got, collective.Average); err != nil {
						return err
					}
					for i, n := range sizes {
						for j := range n {
							var want float32
							for r := range p {
								want += float32(r + i + j%5)
							}
							want *= float32(1.0 / float64(p))
							if got[i][j] != want {
								return fmt.Errorf("tensor %d[%d] = %v, want %v", i, j, got[i][j], want)
							}
						}
					}
					return nil
				})
			})
		}
	}
}

func TestAsyncReducerOverlapsSubmissions(t *testing.T) {
	comms := world(t, 3)
	onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
		a := NewAsyncReducer(c, 256, collective.Sum)
		defer a.Close()
		sizes := []int{10, 300, 5, 64}
		ts := layers(c.Rank(), sizes)
		var pend []*Pending
		// Backward order: the last layer's gradient is ready first.
		for i := len(ts) - 1; i >= 0; i-- {
			pend = append(pend, a.Submit(ctx, ts[i]))
		}
		for _, p := range pend {
			if err := p.Wait(ctx); err != nil {
				return err
			}
		}
		for i, n := range sizes {
			for j := range n {
				want := float32(0+1+2) + 3*float32(i+j%5)
				if ts[i][j] != want {
					return fmt.Errorf("tensor %d[%d] = %v, want %v", i, j, ts[i][j], want)
				}
			}
		}
		return nil
	})
}

func TestAsyncReducerFailsQueueAfterError(t *testing.T) {
	comms := world(t, 2)
	c := comms[0]
	c.Abort(fmt.Errorf("test"))
	a := NewAsyncReducer(c, 0, collective.Sum)
	ctx := context.Background()
	first := a.Submit(ctx, []float32{1})
	second := a.Submit(ctx, []float32{2})
	if err := first.Wait(ctx); err == nil {
		t.Fatal("submission on an aborted communicator succeeded")
	}
	if err := second.Wait(ctx); err == nil {
		t.Fatal("submission after a failure succeeded")
	}
	a.Close()
	if err := a.Submit(ctx, []float32{3}).Wait(ctx); err != ErrQueueClosed {
		t.Fatalf("after Close: %v", err)
	}
}
