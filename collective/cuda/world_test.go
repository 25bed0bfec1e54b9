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
