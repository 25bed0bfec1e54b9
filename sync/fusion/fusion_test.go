package fusion

import (
	"context"
	"fmt"
	"math"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
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

var allDTypes = []collective.DType{collective.Float32, collective.Float64, collective.Float16, collective.BFloat16, collective.Int32, collective.Int64, collective.Uint8}

// The tests use small integers, which every dtype holds exactly, so sums
// and maxima are exact whatever the order of reduction.
var encode, decode = fakedevice.Encode, fakedevice.Decode

// contribution is rank's value of element j of tensor i.
func contribution(rank, i, j int) float64 { return float64((rank + i + j%5) % 7) }

// tensorSpec is one tensor of a test's list.
type tensorSpec struct {
	dt     collective.DType
	n      int
	device bool
}

// mixed is a list that exercises the buckets: dtypes interleaved, host and
// device tensors of one dtype, empty and single-element tensors, and a run of
// equal small ones.
var mixed = []tensorSpec{
	{collective.Float32, 1, false}, {collective.Float16, 3, false}, {collective.Float32, 100, false},
	{collective.Int64, 7, false}, {collective.Float32, 0, false}, {collective.BFloat16, 40, false},
	{collective.Float32, 2, true}, {collective.Uint8, 500, false}, {collective.Float64, 16, false},
	{collective.Float32, 16, true}, {collective.Int32, 16, false}, {collective.Float16, 1, true},
	{collective.Float16, 33, false}, {collective.Float32, 9, true}, {collective.Int32, 300, false},
}

// makeTensors builds rank's tensors for specs: host buffers, or fake device
// memory counting its calls in calls.
func makeTensors(rank int, specs []tensorSpec, calls *fakedevice.Counters) []collective.Buffer {
	ts := make([]collective.Buffer, len(specs))
	for i, s := range specs {
		vals := make([]float64, s.n)
		for j := range vals {
			vals[j] = contribution(rank, i, j)
		}
		b := encode(s.dt, vals)
		if s.device {
			ts[i] = fakedevice.New(b, calls).Buffer(s.dt)
		} else {
			ts[i] = collective.HostBuffer(s.dt, b)
		}
	}
	return ts
}

func bytesOf(t collective.Buffer) []byte {
	if t.Device != nil {
		return t.Device.(*fakedevice.Memory).Bytes()[:t.Bytes()]
	}
	return t.Host
}

// checkReduced compares every element with the reduction of the ranks'
// contributions.
func checkReduced(ts []collective.Buffer, p int, op collective.ReduceOp, scale float64) error {
	for i, t := range ts {
		for j, got := range decode(t.DType, bytesOf(t)) {
			want := 0.0
			for r := range p {
				c := contribution(r, i, j)
				switch op {
				case collective.Max:
					want = max(want, c)
				default:
					want += c
				}
			}
			if op == collective.Average {
				want /= float64(p)
				if !t.DType.IsFloat() {
					want = math.Trunc(want)
				}
			}
			want *= scale
			if got != want {
				return fmt.Errorf("tensor %d (%v) element %d = %v, want %v", i, t.DType, j, got, want)
			}
		}
	}
	return nil
}

func TestFuserMatchesPerTensorReduction(t *testing.T) {
	var sizes []tensorSpec
	for _, n := range []int{1, 3, 100, 7, 0, 40, 2, 500, 16, 16, 16, 1} {
		sizes = append(sizes, tensorSpec{collective.Float32, n, false})
	}
	lists := map[string][]tensorSpec{"float32": sizes, "mixed": mixed}
	for _, dt := range allDTypes {
		var l []tensorSpec
		for _, s := range mixed {
			l = append(l, tensorSpec{dt, s.n, s.device})
		}
		lists[dt.String()+"-host-and-device"] = l
	}
	for name, specs := range lists {
		for _, threshold := range []int{4, 64, 256, 1 << 20} {
			for _, p := range []int{1, 2, 3} {
				ops := []collective.ReduceOp{collective.Sum, collective.Max}
				if p != 3 { // Average exactly: 1/p is exact for p = 1, 2
					ops = append(ops, collective.Average)
				}
				for _, op := range ops {
					t.Run(fmt.Sprintf("%s/threshold=%d/p=%d/%v", name, threshold, p, op), func(t *testing.T) {
						comms := world(t, p)
						var calls fakedevice.Counters
						onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
							ts := makeTensors(c.Rank(), specs, &calls)
							f := NewFuser(threshold)
							defer f.Close()
							if err := f.Allreduce(ctx, c, ts, op); err != nil {
								return err
							}
							return checkReduced(ts, p, op, 1)
						})
					})
				}
			}
		}
	}
}

// Prescale and postscale pass through to the collectives, for every bucket.
func TestFuserScales(t *testing.T) {
	comms := world(t, 2)
	var calls fakedevice.Counters
	onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
		ts := makeTensors(c.Rank(), mixed, &calls)
		f := NewFuser(256)
		defer f.Close()
		// Integers round the scaled values: 2 and 0.5 keep them exact.
		if err := f.Allreduce(ctx, c, ts, collective.Sum, collective.Prescale(2), collective.Postscale(0.5)); err != nil {
			return err
		}
		return checkReduced(ts, 2, collective.Sum, 1)
	})
	onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
		ts := makeTensors(c.Rank(), mixed, &calls)
		if err := NewFuser(64).Allreduce(ctx, c, ts, collective.Sum, collective.Postscale(2)); err != nil {
			return err
		}
		return checkReduced(ts, 2, collective.Sum, 2)
	})
}

// Device tensors are fused in device memory: one buffer per dtype, allocated
// from the tensors' own device and kept for the next call, and the
// collectives never read device bytes except through the device.
func TestFuserDeviceBuckets(t *testing.T) {
	specs := []tensorSpec{{collective.Float32, 10, true}, {collective.Float16, 4, true}, {collective.Float32, 6, true}, {collective.Float16, 8, true}}
	comms := world(t, 2)
	var calls fakedevice.Counters
	fusers := []*Fuser{NewFuser(1 << 20), NewFuser(1 << 20)}
	var allocs []int64 // after each call
	for range 3 {
		onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
			ts := makeTensors(c.Rank(), specs, &calls)
			if err := fusers[c.Rank()].Allreduce(ctx, c, ts, collective.Sum); err != nil {
				return err
			}
			return checkReduced(ts, 2, collective.Sum, 1)
		})
		allocs = append(allocs, calls.Allocs.Load())
	}
	// Two ranks, two dtypes: four fusion buffers in the first call, reused by
	// the later ones (whatever scratch the collectives allocate per call).
	first, second, third := allocs[0], allocs[1]-allocs[0], allocs[2]-allocs[1]
	if first-second != 4 || second != third {
		t.Errorf("device allocations per call %d, %d, %d: want 4 fusion buffers in the first call only", first, second, third)
	}
	for _, f := range fusers {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Frees.Load() != calls.Allocs.Load() {
		t.Errorf("%d of %d device allocations freed", calls.Frees.Load(), calls.Allocs.Load())
	}
	if calls.Copies.Load() == 0 {
		t.Error("no device copy packed the buckets")
	}
}

func TestFuserRefusesMalformedTensors(t *testing.T) {
	comms := world(t, 1)
	good := collective.SliceBuffer(make([]float32, 4))
	var calls fakedevice.Counters
	tests := []struct {
		name string
		bad  collective.Buffer
		want string
	}{
		{"invalid dtype", collective.Buffer{Count: 1, Host: make([]byte, 4)}, "invalid dtype"},
		{"negative count", collective.Buffer{DType: collective.Int32, Count: -1}, "negative count"},
		{"short host bytes", collective.Buffer{DType: collective.Float64, Count: 3, Host: make([]byte, 16)}, "16 host bytes for 3 float64"},
		{"small device memory", collective.Buffer{DType: collective.Float32, Count: 4, Device: fakedevice.New(make([]byte, 8), &calls)}, "cannot hold 4 float32"},
		{"both memories", collective.Buffer{DType: collective.Uint8, Count: 1, Host: []byte{1}, Device: fakedevice.New([]byte{1}, &calls)}, "both host and device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := NewFuser(0).Allreduce(context.Background(), comms[0], []collective.Buffer{good, tc.bad}, collective.Sum)
			if err == nil || !strings.Contains(err.Error(), "tensor 1") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming tensor 1 and %q", err, tc.want)
			}
			if comms[0].Err() != nil {
				t.Fatalf("a refused call broke the communicator: %v", comms[0].Err())
			}
		})
	}
}

func TestAsyncReducerOverlapsSubmissions(t *testing.T) {
	comms := world(t, 3)
	var calls fakedevice.Counters
	onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
		a := NewAsyncReducer(c, 256, collective.Sum)
		defer a.Close()
		ts := makeTensors(c.Rank(), mixed, &calls)
		var pend []*Pending
		// Backward order: the last layer's gradient is ready first.
		for i := len(ts) - 1; i >= 0; i -= 2 {
			pend = append(pend, a.Submit(ctx, ts[max(0, i-1):i+1]...))
		}
		for _, p := range pend {
			if err := p.Wait(ctx); err != nil {
				return err
			}
		}
		return checkReduced(ts, 3, collective.Sum, 1)
	})
}

func TestAsyncReducerFailsQueueAfterError(t *testing.T) {
	comms := world(t, 2)
	c := comms[0]
	c.Abort(fmt.Errorf("test"))
	a := NewAsyncReducer(c, 0, collective.Sum)
	ctx := context.Background()
	first := a.Submit(ctx, collective.SliceBuffer([]float32{1}))
	second := a.Submit(ctx, collective.SliceBuffer([]float32{2}))
	if err := first.Wait(ctx); err == nil {
		t.Fatal("submission on an aborted communicator succeeded")
	}
	if err := second.Wait(ctx); err == nil {
		t.Fatal("submission after a failure succeeded")
	}
	a.Close()
	if err := a.Submit(ctx, collective.SliceBuffer([]float32{3})).Wait(ctx); err != ErrQueueClosed {
		t.Fatalf("after Close: %v", err)
	}
}
