package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
	gsync "github.com/gorovod/gorovod/sync"
)

// fakeGPU is an accelerator for the engine's device path without one: its
// memory is fakedevice memory at made-up addresses, which the engine reaches
// only through Wrap (as a CUDA tensor's data_ptr()), and its events are
// channels the test closes when "the stream" gets there.
type fakeGPU struct {
	ordinal int
	counts  fakedevice.Counters

	mu     stdsync.Mutex
	mem    map[uintptr]*fakedevice.Memory
	events map[uintptr]chan struct{}
	next   uintptr

	opens, closes atomic.Int64
	waited        atomic.Int64  // WaitEvent calls that saw their event
	ended         atomic.Int64  // WaitEvent calls that their context ended
	waiting       chan struct{} // receives each time a WaitEvent starts waiting
}

func newFakeGPU(ordinal int) *fakeGPU {
	return &fakeGPU{ordinal: ordinal, mem: map[uintptr]*fakedevice.Memory{}, events: map[uintptr]chan struct{}{},
		next: 0x7f0000000000, waiting: make(chan struct{}, 16)}
}

func (g *fakeGPU) open(ctx context.Context, ordinal int) (Device, error) {
	if ordinal != g.ordinal {
		return nil, fmt.Errorf("fake: no accelerator %d", ordinal)
	}
	g.opens.Add(1)
	return g, nil
}

// alloc puts vals of dt in the device's memory and returns their address.
func (g *fakeGPU) alloc(dt collective.DType, vals ...float64) uintptr {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.next
	g.next += 1 << 20
	g.mem[p] = fakedevice.New(fakedevice.Encode(dt, vals), &g.counts)
	return p
}

// read returns the n values of dt at p.
func (g *fakeGPU) read(p uintptr, dt collective.DType) []float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return fakedevice.Decode(dt, g.mem[p].Bytes())
}

// write stores vals at p, as a kernel on the framework's stream would.
func (g *fakeGPU) write(p uintptr, dt collective.DType, vals ...float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	copy(g.mem[p].Bytes(), fakedevice.Encode(dt, vals))
}

// event returns a new event's handle and what marks it passed.
func (g *fakeGPU) event() (uintptr, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.next
	g.next += 64
	ch := make(chan struct{})
	g.events[h] = ch
	return h, func() { close(ch) }
}

func (g *fakeGPU) Wrap(ctx context.Context, ptr uintptr, size int) (collective.DeviceMemory, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.mem[ptr]
	if !ok || size > m.Size() {
		return nil, fmt.Errorf("fake: %d bytes at 0x%x are not an allocation", size, ptr)
	}
	return m, nil
}

func (g *fakeGPU) WaitEvent(ctx context.Context, event uintptr) error {
	g.mu.Lock()
	ch, ok := g.events[event]
	g.mu.Unlock()
	if !ok {
		return fmt.Errorf("fake: no event 0x%x", event)
	}
	select {
	case g.waiting <- struct{}{}:
	default:
	}
	select {
	case <-ch:
		g.waited.Add(1)
		return nil
	case <-ctx.Done():
		g.ended.Add(1)
		return ctx.Err()
	}
}

func (g *fakeGPU) Close() error {
	g.closes.Add(1)
	return nil
}

func withFakeGPU(cfg *Config) { cfg.OpenDevice = newFakeGPU(0).open }

// gpuOf is the fake accelerator an engine started withFakeGPU opens.
func gpuOf(t *testing.T, e *Engine) *fakeGPU {
	t.Helper()
	dev, err := e.devices.get(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return dev.(*fakeGPU)
}

// TestDeviceMemory: every collective on buffers of an accelerator, reached
// through OpenDevice and DeviceBuffer as the C ABI does, and a call that
// waits for its event before it reads its tensors: each rank writes its
// input only after submitting the call, then marks the event.
func TestDeviceMemory(t *testing.T) {
	d := startDriver(t, 3)
	es := startEngines(t, d, 3, withFakeGPU)
	each(t, es, func(e *Engine) error {
		g := gpuOf(t, e)
		w := waitOn(e)
		rank := e.Topology().Rank
		r := float64(rank)
		buf := func(p uintptr, dt collective.DType, n int) collective.Buffer {
			b, err := e.DeviceBuffer(0, p, dt, n)
			if err != nil {
				t.Error(err)
			}
			return b
		}

		// A grouped allreduce of two dtypes, fused on the device, submitted
		// before its inputs are written.
		a := g.alloc(collective.Float32, -1000, -1000, -1000)
		b := g.alloc(collective.Float16, -1000, -1000)
		ev, pass := g.event()
		h, err := e.AllreduceShapedOn(0, nil, []collective.Buffer{buf(a, collective.Float32, 3), buf(b, collective.Float16, 2)}, nil,
			gsync.Reduction{Op: collective.Sum}, e.AfterEvent(0, ev))
		if err != nil {
			return err
		}
		select {
		case <-g.waiting:
		case <-time.After(20 * time.Second):
			return errors.New("the allreduce never waited for its event")
		}
		g.write(a, collective.Float32, r+1, 2*r, 1)
		g.write(b, collective.Float16, r, 1)
		pass()
		if err := e.Wait(h, 30*time.Second); err != nil {
			return err
		}
		if got := g.read(a, collective.Float32); !slices.Equal(got, []float64{6, 6, 3}) {
			return fmt.Errorf("grouped allreduce float32: %v, want [6 6 3]", got)
		}
		if got := g.read(b, collective.Float16); !slices.Equal(got, []float64{3, 3}) {
			return fmt.Errorf("grouped allreduce float16: %v, want [3 3]", got)
		}
		if g.waited.Load() != 1 {
			return fmt.Errorf("%d event waits, want 1", g.waited.Load())
		}

		// Out of place, averaged, through the Now form (small: it runs on
		// this goroutine) with an event already passed.
		src, dst := g.alloc(collective.Float32, 3*r, 1), g.alloc(collective.Float32, 0, 0)
		ev, pass = g.event()
		pass()
		if err := w(e.AllreduceShapedNowOn(0, []collective.Buffer{buf(src, collective.Float32, 2)}, []collective.Buffer{buf(dst, collective.Float32, 2)},
			[][]int64{{2}}, gsync.Reduction{Op: collective.Average}, Caller{}, e.AfterEvent(0, ev))); err != nil {
			return err
		}
		if got, in := g.read(dst, collective.Float32), g.read(src, collective.Float32); !slices.Equal(got, []float64{3, 1}) || in[0] != 3*r {
			return fmt.Errorf("allreduce out of place: %v (input now %v), want [3 1]", got, in)
		}

		// Broadcast from rank 2.
		x := g.alloc(collective.Int64, 10*r, r)
		if err := w(e.Broadcast([]collective.Buffer{buf(x, collective.Int64, 2)}, 2)); err != nil {
			return err
		}
		if got := g.read(x, collective.Int64); !slices.Equal(got, []float64{20, 2}) {
			return fmt.Errorf("broadcast: %v", got)
		}

		// Allgather, rank r sending r+1 elements.
		send := make([]float64, rank+1)
		for i := range send {
			send[i] = r
		}
		sp, all := g.alloc(collective.Float32, send...), g.alloc(collective.Float32, make([]float64, 6)...)
		if err := w(e.Allgather(buf(sp, collective.Float32, rank+1), buf(all, collective.Float32, 6), []int{1, 2, 3})); err != nil {
			return err
		}
		if got := g.read(all, collective.Float32); fmt.Sprint(got) != "[0 1 1 2 2 2]" {
			return fmt.Errorf("allgather: %v", got)
		}

		// Alltoall: rank r sends j+1 copies of r*10+j to rank j.
		var sendA []float64
		sendCounts := []int{1, 2, 3}
		for j, n := range sendCounts {
			for range n {
				sendA = append(sendA, r*10+float64(j))
			}
		}
		n := rank + 1
		sa, ra := g.alloc(collective.Float32, sendA...), g.alloc(collective.Float32, make([]float64, 3*n)...)
		if err := w(e.Alltoall(buf(sa, collective.Float32, 6), sendCounts, buf(ra, collective.Float32, 3*n), []int{n, n, n})); err != nil {
			return err
		}
		got := g.read(ra, collective.Float32)
		for j := range 3 {
			for k := range n {
				if got[j*n+k] != float64(j*10+rank) {
					return fmt.Errorf("alltoall received %v", got)
				}
			}
		}

		// Reduce-scatter of 6 elements, 1, 2 and 3 per rank, averaged.
		rs, mine := g.alloc(collective.Float32, r, r, r, r, r, r), g.alloc(collective.Float32, make([]float64, n)...)
		if err := w(e.ReduceScatter(buf(rs, collective.Float32, 6), buf(mine, collective.Float32, n), []int{1, 2, 3}, gsync.Reduction{Op: collective.Average})); err != nil {
			return err
		}
		for _, v := range g.read(mine, collective.Float32) {
			if v != 1 {
				return fmt.Errorf("reducescatter: %v", g.read(mine, collective.Float32))
			}
		}

		if g.counts.Copies.Load() == 0 || g.counts.Kernels.Load() == 0 {
			return fmt.Errorf("the device did no copies (%d) or kernels (%d)", g.counts.Copies.Load(), g.counts.Kernels.Load())
		}
		if g.opens.Load() != 1 {
			return fmt.Errorf("the accelerator was opened %d times, want once", g.opens.Load())
		}
		return nil
	})
	for _, e := range es {
		g := gpuOf(t, e)
		if err := e.Close(context.Background(), true); err != nil {
			t.Fatal(err)
		}
		if g.closes.Load() != 1 {
			t.Errorf("rank's accelerator closed %d times at Close, want once", g.closes.Load())
		}
	}
}

// TestDeviceEventWaitEndsWithTheEngine: a call waiting for an event that
// never comes (a stream that hangs) ends when the engine closes, through
// the context the event wait was given, rather than holding Close.
func TestDeviceEventWaitEndsWithTheEngine(t *testing.T) {
	if gsync.UnderLauncher() {
		t.Skip("started by a launcher")
	}
	cfg := DefaultConfig()
	withFakeGPU(&cfg)
	e, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := gpuOf(t, e)
	p := g.alloc(collective.Float32, 1, 2)
	b, err := e.DeviceBuffer(0, p, collective.Float32, 2)
	if err != nil {
		t.Fatal(err)
	}
	ev, _ := g.event() // never passed
	h, err := e.Allreduce(nil, []collective.Buffer{b}, gsync.Reduction{Op: collective.Sum})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(h, 10*time.Second); err != nil { // no event: runs at once
		t.Fatal(err)
	}
	h, err = e.AllreduceShapedOn(0, nil, []collective.Buffer{b}, nil, gsync.Reduction{Op: collective.Sum}, e.AfterEvent(0, ev))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("the allreduce never waited for its event")
	}
	if err := e.Wait(h, 0); !errors.Is(err, ErrNotDone) {
		t.Fatalf("a call whose event has not passed: %v, want ErrNotDone", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Close(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(h, 10*time.Second); !errors.Is(err, ErrClosed) {
		t.Fatalf("the waiting call after Close: %v, want ErrClosed", err)
	}
	if g.ended.Load() != 1 || g.waited.Load() != 0 {
		t.Fatalf("event waits ended by the context %d, passed %d; want 1 and 0", g.ended.Load(), g.waited.Load())
	}
	if got := g.read(p, collective.Float32); !slices.Equal(got, []float64{1, 2}) {
		t.Fatalf("the call that never saw its event touched the tensor: %v", got)
	}
	if g.closes.Load() != 1 {
		t.Fatalf("accelerator closed %d times, want once", g.closes.Load())
	}
	if _, err := e.DeviceBuffer(0, p, collective.Float32, 2); !errors.Is(err, ErrClosed) {
		t.Fatalf("DeviceBuffer after Close: %v, want ErrClosed", err)
	}
}

// TestNoDevices: an engine without OpenDevice (a library built without
// accelerator support) refuses device memory with an error that says so,
// and host calls go on.
func TestNoDevices(t *testing.T) {
	if gsync.UnderLauncher() {
		t.Skip("started by a launcher")
	}
	e, err := Start(context.Background(), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background(), true)
	_, err = e.DeviceBuffer(0, 0x7f0000000000, collective.Float32, 4)
	if !errors.Is(err, ErrNoDevices) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("device memory without accelerator support: %v, want ErrNoDevices and ErrInvalid", err)
	}
	for _, bad := range []struct {
		ordinal int
		ptr     uintptr
		dt      collective.DType
		count   int
	}{{-1, 1, collective.Float32, 1}, {0, 0, collective.Float32, 1}, {0, 1, 0, 1}, {0, 1, collective.Float32, -1}} {
		if _, err := e.DeviceBuffer(bad.ordinal, bad.ptr, bad.dt, bad.count); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrNoDevices) {
			t.Errorf("DeviceBuffer%+v: %v, want ErrInvalid before any device is asked", bad, err)
		}
	}
	h := []float32{2}
	if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(h)}, gsync.Reduction{})); err != nil || h[0] != 2 {
		t.Fatalf("host allreduce: %v %v", h, err)
	}
}

// passAllreducer counts the allreduces a communicator hands it and runs
// them on the staged path (as collective/cuda's SameHostAllreducer falls
// back to); closes counts its closes.
type passAllreducer struct{ calls, closes *atomic.Int64 }

func (a passAllreducer) AllreduceDevice(ctx context.Context, c *collective.Communicator, send, recv collective.Buffer, op collective.ReduceOp, prescale, postscale float64) error {
	a.calls.Add(1)
	return c.Allreduce(ctx, send, recv, op, collective.Prescale(prescale), collective.Postscale(postscale), collective.Staged())
}

func (a passAllreducer) Close() error {
	a.closes.Add(1)
	return nil
}

// TestDeviceAllreducesReachTheDeviceAllreducer: the engine's allreduces of
// device memory (a fused group, a single tensor, averaged, out of place) go
// through the session's communicator to its collective.DeviceAllreducer,
// which is how the CUDA build reduces GPU to GPU on one host; the
// gradient allreduce's epoch tag must not keep them from it.
func TestDeviceAllreducesReachTheDeviceAllreducer(t *testing.T) {
	const p = 3
	d := startDriver(t, p)
	calls := make([]atomic.Int64, p)
	var closes atomic.Int64
	var next atomic.Int64
	es := startEngines(t, d, p, withFakeGPU, func(cfg *Config) {
		i := next.Add(1) - 1
		cfg.Worker.Session.Collective.NewDeviceAllreducer = func() collective.DeviceAllreducer {
			return passAllreducer{calls: &calls[i], closes: &closes}
		}
	})
	each(t, es, func(e *Engine) error {
		g := gpuOf(t, e)
		w := waitOn(e)
		r := float64(e.Topology().Rank)
		buf := func(ptr uintptr, dt collective.DType, n int) collective.Buffer {
			b, err := e.DeviceBuffer(0, ptr, dt, n)
			if err != nil {
				t.Error(err)
			}
			return b
		}
		a, b := g.alloc(collective.Float32, r, 1, 2), g.alloc(collective.Float16, 2*r, 1)
		if err := w(e.AllreduceShapedOn(0, nil, []collective.Buffer{buf(a, collective.Float32, 3), buf(b, collective.Float16, 2)}, nil,
			gsync.Reduction{Op: collective.Sum})); err != nil {
			return err
		}
		if got := g.read(a, collective.Float32); !slices.Equal(got, []float64{3, 3, 6}) {
			return fmt.Errorf("fused allreduce float32: %v, want [3 3 6]", got)
		}
		if got := g.read(b, collective.Float16); !slices.Equal(got, []float64{6, 3}) {
			return fmt.Errorf("fused allreduce float16: %v, want [6 3]", got)
		}
		src, dst := g.alloc(collective.Float32, 3*r, 1), g.alloc(collective.Float32, 0, 0)
		if err := w(e.AllreduceShapedNowOn(0, []collective.Buffer{buf(src, collective.Float32, 2)}, []collective.Buffer{buf(dst, collective.Float32, 2)},
			[][]int64{{2}}, gsync.Reduction{Op: collective.Average}, Caller{})); err != nil {
			return err
		}
		if got := g.read(dst, collective.Float32); !slices.Equal(got, []float64{3, 1}) {
			return fmt.Errorf("averaged allreduce out of place: %v, want [3 1]", got)
		}
		return nil
	})
	for i := range calls {
		if calls[i].Load() == 0 {
			t.Errorf("engine %d: no allreduce reached the device allreducer", i)
		}
	}
	for _, e := range es {
		if err := e.Close(context.Background(), true); err != nil {
			t.Fatal(err)
		}
	}
	if closes.Load() == 0 {
		t.Error("no device allreducer was closed with its communicator")
	}
}
