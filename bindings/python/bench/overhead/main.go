// Command overhead is overhead.py's counterpart in Go: the same in-place
// float32 Sum allreduces (1 K, 1 M and 16 M elements) in the same two loop
// shapes, through the engine the C ABI wraps (bindings/internal/engine:
// submit, then wait for the handle), so that overhead.py minus this is what
// ctypes, cgo and Python add. Run it under `gorovod run`:
//
//	go build -o /tmp/overhead-go ./bindings/python/bench/overhead
//	gorovod run --np 2 --min-np 2 -- /tmp/overhead-go
//
// Shapes: "alone" times one call after a barrier (the median of many);
// "back-to-back" times a run of calls, each started when the previous one
// returned (the median per call over several runs). Rank 0 prints one
// RESULT line per shape and size.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

// sizes are overhead.py's: elements, calls timed alone, back-to-back runs of
// calls.
var sizes = []struct{ n, alone, runs, perRun int }{
	{1 << 10, 200, 5, 200},
	{1 << 20, 20, 5, 10},
	{1 << 24, 8, 3, 3},
}

func run() error {
	ctx := context.Background()
	e, err := engine.Start(ctx, engine.DefaultConfig())
	if err != nil {
		return err
	}
	finished := false
	defer func() { _ = e.Close(ctx, finished) }()
	wait := func(h engine.Handle, err error) error {
		if err != nil {
			return err
		}
		return e.Wait(h, -1)
	}
	sum := gsync.Reduction{Op: collective.Sum}
	for _, sz := range sizes {
		data := make([]float32, sz.n)
		for i := range data {
			data[i] = 1
		}
		buf := []collective.Buffer{collective.HostBuffer(collective.Float32, unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), 4*sz.n))}
		call := func() error { return wait(e.Allreduce(nil, buf, sum)) }
		for range 3 {
			if err := call(); err != nil {
				return err
			}
		}
		var alone []time.Duration
		for range sz.alone {
			if err := wait(e.Barrier()); err != nil {
				return err
			}
			start := time.Now()
			if err := call(); err != nil {
				return err
			}
			alone = append(alone, time.Since(start))
		}
		var b2b []time.Duration
		for range sz.runs {
			if err := wait(e.Barrier()); err != nil {
				return err
			}
			start := time.Now()
			for range sz.perRun {
				if err := call(); err != nil {
					return err
				}
			}
			b2b = append(b2b, time.Since(start)/time.Duration(sz.perRun))
		}
		if e.Topology().Rank == 0 {
			report("alone", sz.n, alone)
			report("back-to-back", sz.n, b2b)
		}
	}
	finished = true
	return nil
}

func report(shape string, n int, samples []time.Duration) {
	slices.Sort(samples)
	fmt.Printf("RESULT go %s %d elements (%d bytes): median %.1f us, min %.1f us\n", shape, n, 4*n,
		float64(samples[len(samples)/2].Nanoseconds())/1e3, float64(samples[0].Nanoseconds())/1e3)
}
