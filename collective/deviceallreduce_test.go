package collective

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingAllreducer is a DeviceAllreducer that counts its calls and closes
// and runs each allreduce on the staged path, as a real one's fallback does.
type countingAllreducer struct {
	calls, closes *atomic.Int64
	// scale is the prescale and postscale each call was given, summed.
	scales *atomic.Int64
}

func (a countingAllreducer) AllreduceDevice(ctx context.Context, c *Communicator, send, recv Buffer, op ReduceOp, prescale, postscale float64) error {
	a.calls.Add(1)
	a.scales.Add(int64(prescale*10 + postscale))
	return c.Allreduce(ctx, send, recv, op, Prescale(prescale), Postscale(postscale), Staged())
}

func (a countingAllreducer) Close() error {
	a.closes.Add(1)
	return nil
}

// TestDeviceAllreducerTakesDeviceAllreduces: a communicator hands its
// allreduces of device buffers, and only those, to Config.NewDeviceAllreducer's
// allreducer (with their scale factors), the results are the collective's,
// and the allreducer is closed once with the communicator.
func TestDeviceAllreducerTakesDeviceAllreduces(t *testing.T) {
	const p, n = 4, 301 // a power of two, for Adasum
	dt := Float32
	tests := []struct {
		name      string
		device    bool
		op        ReduceOp
		opts      func(tag *uint64) []Option
		wantCalls int64
	}{
		{"device", true, Sum, func(*uint64) []Option { return nil }, p},
		{"device scaled", true, Average, func(*uint64) []Option { return []Option{Prescale(2), Postscale(3)} }, p},
		{"device staged", true, Sum, func(*uint64) []Option { return []Option{Staged()} }, 0},
		{"device max-tag", true, Sum, func(tag *uint64) []Option { return []Option{MaxTag(tag)} }, p},
		{"device staged max-tag", true, Sum, func(tag *uint64) []Option { return []Option{MaxTag(tag), Staged()} }, 0},
		{"device adasum", true, Adasum, func(*uint64) []Option { return nil }, 0},
		{"host", false, Sum, func(*uint64) []Option { return nil }, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls, closes, scales, devOps atomic.Int64
			cfg := DefaultConfig()
			cfg.NewDeviceAllreducer = func() DeviceAllreducer {
				return countingAllreducer{calls: &calls, closes: &closes, scales: &scales}
			}
			comms := newWorld(t, inprocMesh, p, cfg)
			in := inputs(dt, tc.op, p, n)
			out := make([][]byte, p)
			tags := make([]uint64, p)
			errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				r := c.Rank()
				tag := uint64(10*r + 7)
				defer func() { tags[r] = tag }()
				if tc.device {
					d := newFakeDevice(encode(dt, in[r]), &devOps)
					err := c.Allreduce(ctx, devBuffer(dt, d), devBuffer(dt, d), tc.op, tc.opts(&tag)...)
					out[r] = d.mem
					return err
				}
				b := encode(dt, in[r])
				buf := Buffer{DType: dt, Count: n, Host: b}
				err := c.Allreduce(ctx, buf, buf, tc.op, tc.opts(&tag)...)
				out[r] = b
				return err
			})
			noErrors(t, errs)
			if got := calls.Load(); got != tc.wantCalls {
				t.Fatalf("the device allreducer took %d calls, want %d", got, tc.wantCalls)
			}
			if strings.Contains(tc.name, "max-tag") {
				for r, tag := range tags {
					if want := uint64(10*(p-1) + 7); tag != want {
						t.Fatalf("rank %d: MaxTag came out as %d, want %d (the largest)", r, tag, want)
					}
				}
			}
			if tc.name == "device scaled" {
				if got, want := scales.Load(), int64(p*(2*10+3)); got != want {
					t.Fatalf("scale factors reached the allreducer as %d (sum of prescale*10+postscale), want %d", got, want)
				}
			}
			if tc.op != Adasum {
				pre, post := 1.0, 1.0
				if tc.name == "device scaled" {
					pre, post = 2, 3
				}
				want := referenceReduce(dt, tc.op, in, pre, post)
				for r := range p {
					if err := sameElems(dt, out[r], want); err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
			}
			for _, c := range comms {
				c.Close()
				c.Close()
			}
			if got := closes.Load(); got != p {
				t.Fatalf("the allreducers were closed %d times, want %d (once per communicator)", got, p)
			}
		})
	}
}

// TestDeviceAllreducerClosedOnRelease: a released communicator closes its
// allreducer too.
func TestDeviceAllreducerClosedOnRelease(t *testing.T) {
	var closes atomic.Int64
	cfg := DefaultConfig()
	cfg.NewDeviceAllreducer = func() DeviceAllreducer {
		return countingAllreducer{calls: new(atomic.Int64), closes: &closes, scales: new(atomic.Int64)}
	}
	comms := newWorld(t, inprocMesh, 2, cfg)
	for i, c := range comms {
		c.Release(func(int) bool { return true })
		c.Close()
		if got := closes.Load(); got != int64(i+1) {
			t.Fatalf("after releasing %d communicators: %d closes", i+1, got)
		}
	}
}
