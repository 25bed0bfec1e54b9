package collective_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// Average a gradient across three ranks. Each rank is a goroutine here, on
// the in-process transport; across processes and hosts each rank's process
// listens with tcp.Listen (or multi.Listen) instead, and the world's
// addresses come from the launcher. Every rank ends with bit-identical values.
func ExampleAllreduce() {
	const ranks = 3
	network := inproc.NewNetwork()
	secret := []byte("the job's secret, shared by its ranks")
	trs := make([]*inproc.Transport, ranks)
	addrs := make([]string, ranks)
	for r := range trs {
		t, err := network.Listen(inproc.Config{Secret: secret})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer t.Close()
		trs[r], addrs[r] = t, t.Addr()
	}

	grads := make([][]float32, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r, t := range trs {
		wg.Go(func() {
			ctx := context.Background()
			world := transport.World{JobID: "example", Epoch: 1, Rank: r, Addrs: addrs}
			comm, err := collective.New(ctx, t, world, collective.Config{}) // zero fields: defaults
			if err != nil {
				errs[r] = err
				return
			}
			defer comm.Close()
			g := []float32{float32(r), 1, 10 * float32(r)} // this rank's gradient
			errs[r] = collective.Allreduce(ctx, comm, g, g, collective.Average)
			grads[r] = g
		})
	}
	wg.Wait()
	for r := range ranks {
		fmt.Println("rank", r, grads[r], errs[r])
	}
	// Output:
	// rank 0 [1 1 10] <nil>
	// rank 1 [1 1 10] <nil>
	// rank 2 [1 1 10] <nil>
}
