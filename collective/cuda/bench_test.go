//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// benchSizes are the message sizes of the device benchmark: 4 KiB to
// 256 MiB, including the two the targets name (64 and 256 MiB).
var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

// BenchmarkAllreduceDevice is an in-place Average allreduce of device
// buffers by two ranks in this process sharing the one GPU, over the
// in-process transport (so the figure is the device path's own cost:
// device-to-host, host-to-device and the reduce kernels). SetBytes is the
// message size; the bus bandwidth of a 2-rank allreduce equals it
// (2(p-1)/p = 1).
func BenchmarkAllreduceDevice(b *testing.B) {
	benchAllreduce(b, true)
}

// BenchmarkAllreduceHost is the same allreduce on host buffers, for the
// ratio in the same run.
func BenchmarkAllreduceHost(b *testing.B) {
	benchAllreduce(b, false)
}

func benchAllreduce(b *testing.B, device bool) {
	var d *Device
	if device {
		var err error
		if d, err = NewDevice(context.Background(), 0); err != nil {
			b.Skipf("no GPU: %v", err)
		}
		defer d.Close()
	}
	const p = 2
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("%v/%s", dt, sizeName(size)), func(b *testing.B) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				w := transport.World{JobID: "cuda-bench", Epoch: 1, Addrs: make([]string, p)}
				mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch}, p)
				comms := make([]*collective.Communicator, p)
				bufs := make([]collective.Buffer, p)
				count := size / dt.Size()
				for r := range p {
					w.Rank = r
					c, err := collective.NewFromLinks(w, mesh[r], collective.DefaultConfig())
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					comms[r] = c
					bufs[r] = collective.Buffer{DType: dt, Count: count}
					if device {
						m, err := d.Alloc(ctx, size)
						if err != nil {
							b.Fatal(err)
						}
						defer m.Free()
						if err := m.CopyFromHost(ctx, 0, make([]byte, size)); err != nil {
							b.Fatal(err)
						}
						bufs[r].Device = m
					} else {
						bufs[r].Host = make([]byte, size)
					}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for b.Loop() {
					var wg sync.WaitGroup
					errs := make([]error, p)
					for r := range p {
						wg.Add(1)
						go func() {
							defer wg.Done()
							errs[r] = comms[r].Allreduce(ctx, bufs[r], bufs[r], collective.Average)
						}()
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							b.Fatalf("rank %d: %v", r, err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkCopyDevice is a device-to-device copy (CopyFrom) of each size:
// the GPU's own copy bandwidth through this backend, the yardstick for the
// allreduce's bus bandwidth. SetBytes counts the bytes copied once.
func BenchmarkCopyDevice(b *testing.B) {
	benchCopy(b, func(sb *testing.B, ctx context.Context, d *Device, src *Memory, size int) (func() error, error) {
		dst, err := d.Alloc(ctx, size)
		if err != nil {
			return nil, err
		}
		sb.Cleanup(func() { dst.Free() })
		return func() error { return dst.CopyFrom(ctx, 0, src, 0, size) }, nil
	})
}

// BenchmarkCopyToHost is a device-to-host copy into ordinary Go memory of
// each size, the step the device path adds per chunk.
func BenchmarkCopyToHost(b *testing.B) {
	benchCopy(b, func(_ *testing.B, ctx context.Context, d *Device, src *Memory, size int) (func() error, error) {
		host := make([]byte, size)
		return func() error { return src.CopyToHost(ctx, host, 0) }, nil
	})
}

// benchCopy times, for each size, the copy that prepare returns out of a
// device allocation of that size (what prepare allocates it frees with the
// sub-benchmark sb).
func benchCopy(b *testing.B, prepare func(sb *testing.B, ctx context.Context, d *Device, src *Memory, size int) (func() error, error)) {
	d, err := NewDevice(context.Background(), 0)
	if err != nil {
		b.Skipf("no GPU: %v", err)
	}
	defer d.Close()
	ctx := context.Background()
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			src, err := d.Alloc(ctx, size)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Free()
			copyOnce, err := prepare(b, ctx, d, src, size)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := copyOnce(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
