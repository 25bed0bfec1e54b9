package collective

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDevice is memory the collectives may reach only through DeviceMemory, as
// with CUDA: a test that passes with it shows the algorithms never touch device
// bytes directly. It counts calls so the test can see the staging happen.
type fakeDevice struct {
	mem   []byte
	calls *atomic.Int64
}

func newFakeDevice(b []byte, calls *atomic.Int64) *fakeDevice {
	return &fakeDevice{mem: append([]byte(nil), b...), calls: calls}
}

func (d *fakeDevice) Size() int { return len(d.mem) }

func (d *fakeDevice) CopyToHost(ctx context.Context, dst []byte, off int) error {
	d.calls.Add(1)
	copy(dst, d.mem[off:off+len(dst)])
	return nil
}

func (d *fakeDevice) CopyFromHost(ctx context.Context, off int, src []byte) error {
	d.calls.Add(1)
	copy(d.mem[off:], src)
	return nil
}

func (d *fakeDevice) CopyFrom(ctx context.Context, off int, src DeviceMemory, srcOff, n int) error {
	d.calls.Add(1)
	copy(d.mem[off:off+n], src.(*fakeDevice).mem[srcOff:srcOff+n])
	return nil
}

func (d *fakeDevice) ReduceFromHost(ctx context.Context, off int, a DeviceMemory, aOff int, src []byte, dt DType, op ReduceOp) error {
	d.calls.Add(1)
	n := len(src)
	// A kernel reads its operands before writing, so aliasing is fine.
	return reduceHost(dt, op, d.mem[off:off+n], a.(*fakeDevice).mem[aOff:aOff+n], src)
}

func (d *fakeDevice) Scale(ctx context.Context, off, n int, dt DType, factor float64, divisor int) error {
	d.calls.Add(1)
	return scaleHost(dt, d.mem[off:off+n], factor, divisor)
}

func (d *fakeDevice) Alloc(ctx context.Context, size int) (DeviceMemory, error) {
	return &fakeDevice{mem: make([]byte, size), calls: d.calls}, nil
}

func (d *fakeDevice) Free() error { return nil }

func devBuffer(dt DType, d *fakeDevice) Buffer {
	return Buffer{DType: dt, Count: len(d.mem) / dt.Size(), Device: d}
}

func TestDeviceMemoryMatchesHost(t *testing.T) {
	for _, tc := range testConfigs {
		for _, p := range []int{1, 2, 3, 5} {
			comms := newWorld(t, inprocMesh, p, tc.cfg)
			t.Run(fmt.Sprintf("%s/p=%d", tc.name, p), func(t *testing.T) {
				for _, dt := range []DType{Float32, Float16, Int64} {
					for _, op := range []ReduceOp{Sum, Average, Max} {
						for _, n := range []int{0, 5, 301} {
							checkDeviceCollectives(t, comms, dt, op, n)
						}
					}
				}
			})
		}
	}
}

func checkDeviceCollectives(t *testing.T, comms []*Communicator, dt DType, op ReduceOp, n int) {
	t.Helper()
	p := len(comms)
	in := inputs(dt, op, p, n)
	want := referenceReduce(dt, op, in, 2, 1)
	var calls atomic.Int64
	counts := evenCounts(n, p)
	type result struct{ ar, arOut, rs, bc, ag []byte }
	res := make([]result, p)
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		src := encode(dt, in[r])
		inPlace := newFakeDevice(src, &calls)
		if err := c.Allreduce(ctx, devBuffer(dt, inPlace), devBuffer(dt, inPlace), op, Prescale(2)); err != nil {
			return err
		}
		res[r].ar = inPlace.mem
		out := newFakeDevice(make([]byte, len(src)), &calls)
		if err := c.Allreduce(ctx, devBuffer(dt, newFakeDevice(src, &calls)), devBuffer(dt, out), op, Prescale(2)); err != nil {
			return err
		}
		res[r].arOut = out.mem
		seg := newFakeDevice(make([]byte, counts[r]*dt.Size()), &calls)
		if err := c.ReduceScatter(ctx, devBuffer(dt, newFakeDevice(src, &calls)), devBuffer(dt, seg), op, Prescale(2)); err != nil {
			return err
		}
		res[r].rs = seg.mem
		bc := newFakeDevice(src, &calls)
		if err := c.Broadcast(ctx, devBuffer(dt, bc), p-1); err != nil {
			return err
		}
		res[r].bc = bc.mem
		all := newFakeDevice(make([]byte, p*len(src)), &calls)
		if err := c.Allgather(ctx, devBuffer(dt, newFakeDevice(src, &calls)), devBuffer(dt, all)); err != nil {
			return err
		}
		res[r].ag = all.mem
		return nil
	})
	noErrors(t, errs)
	var gathered []byte
	for r := range p {
		gathered = append(gathered, encode(dt, in[r])...)
	}
	off := 0
	for r := range p {
		what := fmt.Sprintf("device %v %v n=%d rank %d", dt, op, n, r)
		if err := sameElems(dt, res[r].ar, want); err != nil {
			t.Fatalf("%s: in-place allreduce: %v", what, err)
		}
		if err := sameElems(dt, res[r].arOut, want); err != nil {
			t.Fatalf("%s: allreduce: %v", what, err)
		}
		if err := sameElems(dt, res[r].rs, want[off:off+counts[r]]); err != nil {
			t.Fatalf("%s: reducescatter: %v", what, err)
		}
		off += counts[r]
		if !bytes.Equal(res[r].bc, encode(dt, in[p-1])) {
			t.Fatalf("%s: broadcast differs", what)
		}
		if !bytes.Equal(res[r].ag, gathered) {
			t.Fatalf("%s: allgather differs", what)
		}
	}
	if n > 0 && calls.Load() == 0 {
		t.Fatal("no device operation was used")
	}
}

// TestDeviceMemoryHierarchical: the hierarchical allreduce and allgather
// (and the host-ordered ring) on device memory, on uneven and interleaved
// declared hosts.
func TestDeviceMemoryHierarchical(t *testing.T) {
	for _, l := range []hostLayout{blocked(2, 2), interleaved(1, 3), interleaved(2, 2, 2)} {
		for _, fc := range forcedConfigs[2:4] {
			t.Run(l.name+"/"+fc.name, func(t *testing.T) {
				cfg := fc.cfg
				cfg.AllgatherAlgorithm = AlgorithmHierarchical
				comms := newHostWorld(t, inprocMesh, l, cfg)
				for _, dt := range []DType{Float32, Float16, Int64} {
					for _, op := range []ReduceOp{Sum, Average, Max} {
						for _, n := range []int{0, 5, 301} {
							checkDeviceCollectives(t, comms, dt, op, n)
						}
					}
				}
			})
		}
	}
}
