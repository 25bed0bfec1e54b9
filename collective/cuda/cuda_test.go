//go:build cuda

package cuda

// These tests need a GPU (compute capability 7.0+) and its driver
// (libcuda.so.1, which NewDevice loads), so they build only with the tag
// cuda: CI without a GPU compiles them (go test -tags cuda -c) and runs
// driver_test.go's, which need none. GOROVOD_CUDA_DEVICE picks the ordinal
// (default 0).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/reduce"
)

func openDevice(t *testing.T) *Device {
	t.Helper()
	ordinal := 0
	if v := os.Getenv("GOROVOD_CUDA_DEVICE"); v != "" {
		var err error
		if ordinal, err = strconv.Atoi(v); err != nil {
			t.Fatalf("GOROVOD_CUDA_DEVICE=%q: %v", v, err)
		}
	}
	d, err := NewDevice(context.Background(), ordinal)
	if err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			t.Skipf("no usable GPU for the CUDA backend tests: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func upload(t *testing.T, d *Device, b []byte) *Memory {
	t.Helper()
	ctx := context.Background()
	m, err := d.Alloc(ctx, len(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Free() })
	if err := m.CopyFromHost(ctx, 0, b); err != nil {
		t.Fatal(err)
	}
	return m
}

func download(t *testing.T, m *Memory) []byte {
	t.Helper()
	b := make([]byte, m.Size())
	if err := m.CopyToHost(context.Background(), b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

var allDTypes = []collective.DType{collective.Float32, collective.Float64, collective.Float16, collective.BFloat16,
	collective.Int32, collective.Int64, collective.Uint8}

func view[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// hostReduce is internal/reduce's result for dst = a op b.
func hostReduce(dt collective.DType, op collective.ReduceOp, a, b []byte) []byte {
	k := map[collective.ReduceOp]reduce.Op{collective.Sum: reduce.Sum, collective.Product: reduce.Prod,
		collective.Min: reduce.Min, collective.Max: reduce.Max}[op]
	dst := make([]byte, len(a))
	switch dt {
	case collective.Float32:
		reduce.Float32(k, view[float32](dst), view[float32](a), view[float32](b))
	case collective.Float64:
		reduce.Float64(k, view[float64](dst), view[float64](a), view[float64](b))
	case collective.Float16:
		reduce.Float16(k, view[uint16](dst), view[uint16](a), view[uint16](b))
	case collective.BFloat16:
		reduce.BFloat16(k, view[uint16](dst), view[uint16](a), view[uint16](b))
	case collective.Int32:
		reduce.Int32(k, view[int32](dst), view[int32](a), view[int32](b))
	case collective.Int64:
		reduce.Int64(k, view[int64](dst), view[int64](a), view[int64](b))
	case collective.Uint8:
		reduce.Uint8(k, dst, a, b)
	}
	return dst
}

// hostScale is internal/reduce's result for Scale(factor, divisor), in the
// order collective applies them.
func hostScale(dt collective.DType, x []byte, factor float64, divisor int) []byte {
	b := append([]byte(nil), x...)
	switch dt {
	case collective.Float32:
		reduce.ScaleFloat32(view[float32](b), view[float32](b), factor)
	case collective.Float64:
		reduce.ScaleFloat64(view[float64](b), view[float64](b), factor)
	case collective.Float16:
		reduce.ScaleFloat16(view[uint16](b), view[uint16](b), factor)
	case collective.BFloat16:
		reduce.ScaleBFloat16(view[uint16](b), view[uint16](b), factor)
	case collective.Int32:
		if divisor > 1 {
			reduce.DivInt32(view[int32](b), view[int32](b), int64(divisor))
		}
		if factor != 1 {
			reduce.ScaleInt32(view[int32](b), view[int32](b), factor)
		}
	case collective.Int64:
		if divisor > 1 {
			reduce.DivInt64(view[int64](b), view[int64](b), int64(divisor))
		}
		if factor != 1 {
			reduce.ScaleInt64(view[int64](b), view[int64](b), factor)
		}
	case collective.Uint8:
		if divisor > 1 {
			reduce.DivUint8(b, b, int64(divisor))
		}
		if factor != 1 {
			reduce.ScaleUint8(b, b, factor)
		}
	}
	return b
}

func isNaN(dt collective.DType, e []byte) bool {
	switch dt {
	case collective.Float32:
		return binary.LittleEndian.Uint32(e)&0x7fffffff > 0x7f800000
	case collective.Float64:
		return binary.LittleEndian.Uint64(e)&(1<<63-1) > 0x7ff0000000000000
	case collective.Float16:
		return binary.LittleEndian.Uint16(e)&0x7fff > 0x7c00
	case collective.BFloat16:
		return binary.LittleEndian.Uint16(e)&0x7fff > 0x7f80
	}
	return false
}

// sameBits compares element-wise; with nanPayloads, two NaNs match whatever
// their payloads (Sum, Product and Scale: see the kernels package doc).
func sameBits(dt collective.DType, got, want []byte, nanPayloads bool) error {
	s := dt.Size()
	if len(got) != len(want) {
		return fmt.Errorf("%d bytes, want %d", len(got), len(want))
	}
	for i := 0; i < len(want); i += s {
		g, w := got[i:i+s], want[i:i+s]
		if bytes.Equal(g, w) || nanPayloads && isNaN(dt, g) && isNaN(dt, w) {
			continue
		}
		return fmt.Errorf("element %d: got % x, want % x", i/s, g, w)
	}
	return nil
}

// randomBits is n elements of random bit patterns: every class of value.
func randomBits(rng *rand.Rand, dt collective.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// randomFinite is n elements of moderate values (no NaN, no overflow in a
// sum of a few ranks), for comparing whole collectives.
func randomFinite(rng *rand.Rand, dt collective.DType, n int) []byte {
	var b []byte
	for range n {
		v := rng.Float64()*200 - 100
		switch dt {
		case collective.Float32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
		case collective.Float64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		case collective.Float16:
			b = binary.LittleEndian.AppendUint16(b, uint16(collective.NewF16(float32(v/10))))
		case collective.BFloat16:
			b = binary.LittleEndian.AppendUint16(b, uint16(collective.NewBF16(float32(v))))
		case collective.Int32:
			b = binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
		case collective.Int64:
			b = binary.LittleEndian.AppendUint64(b, uint64(int64(v*1e6)))
		case collective.Uint8:
			b = append(b, byte(rng.IntN(256)))
		}
	}
	return b
}

func TestReduceFromHostMatchesHost(t *testing.T) {
	d := openDevice(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range allDTypes {
		for _, op := range []collective.ReduceOp{collective.Sum, collective.Product, collective.Min, collective.Max} {
			// 1 element, an odd count, and more than one staging buffer's worth.
			for _, n := range []int{1, 1001, (minStaging/dt.Size())*3 + 7} {
				t.Run(fmt.Sprintf("%v/%v/%d", dt, op, n), func(t *testing.T) {
					a, b := randomBits(rng, dt, n), randomBits(rng, dt, n)
					want := hostReduce(dt, op, a, b)
					nanOK := op == collective.Sum || op == collective.Product

					// In place, at an offset: the ring's usual call.
					pad := 8 * dt.Size()
					m := upload(t, d, append(make([]byte, pad), a...))
					if err := m.ReduceFromHost(ctx, pad, m, pad, b, dt, op); err != nil {
						t.Fatal(err)
					}
					if err := sameBits(dt, download(t, m)[pad:], want, nanOK); err != nil {
						t.Fatalf("in place: %v", err)
					}
					// Into other memory.
					src := upload(t, d, a)
					out := upload(t, d, make([]byte, len(a)))
					if err := out.ReduceFromHost(ctx, 0, src, 0, b, dt, op); err != nil {
						t.Fatal(err)
					}
					if err := sameBits(dt, download(t, out), want, nanOK); err != nil {
						t.Fatalf("out of place: %v", err)
					}
					if !bytes.Equal(download(t, src), a) {
						t.Fatal("the operand changed")
					}
				})
			}
		}
	}
}

func TestScaleMatchesHost(t *testing.T) {
	d := openDevice(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	tests := []struct {
		factor  float64
		divisor int
	}{
		{0.5, 1}, {1.0 / 3, 1}, {2.5, 1}, {-1, 1}, {1e10, 1}, {math.NaN(), 1}, {math.Inf(1), 1},
		{1, 3}, {1, 4}, {0.25, 7}, // Average on integers: divide, then postscale
	}
	for _, dt := range allDTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%v/f=%v/d=%d", dt, tc.factor, tc.divisor), func(t *testing.T) {
				x := randomBits(rng, dt, 4099)
				m := upload(t, d, x)
				if err := m.Scale(ctx, 0, len(x), dt, tc.factor, tc.divisor); err != nil {
					t.Fatal(err)
				}
				if err := sameBits(dt, download(t, m), hostScale(dt, x, tc.factor, tc.divisor), true); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestCopies(t *testing.T) {
	d := openDevice(t)
	ctx := context.Background()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	tests := []struct {
		name             string
		off, srcOff, n   int
		sameMemory, want bool
	}{
		{"disjoint memory", 16, 32, 4096, false, true},
		{"same memory, disjoint ranges", 0, 1 << 19, 1 << 19, true, true},
		{"overlap forward", 100, 0, 1 << 19, true, true},
		{"overlap backward", 0, 100, 1 << 19, true, true},
		{"same range", 64, 64, 1000, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := upload(t, d, data)
			dst := src
			if !tc.sameMemory {
				dst = upload(t, d, make([]byte, len(data)))
			}
			want := download(t, dst)
			copy(want[tc.off:tc.off+tc.n], data[tc.srcOff:tc.srcOff+tc.n])
			if err := dst.CopyFrom(ctx, tc.off, src, tc.srcOff, tc.n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(download(t, dst), want) {
				t.Fatal("wrong bytes after CopyFrom")
			}
		})
	}
	// Partial copies to and from the host.
	m := upload(t, d, data)
	part := make([]byte, 333)
	if err := m.CopyToHost(ctx, part, 1000); err != nil || !bytes.Equal(part, data[1000:1333]) {
		t.Fatalf("CopyToHost at an offset: %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	d := openDevice(t)
	ctx := context.Background()
	m := upload(t, d, make([]byte, 64))
	tests := []struct {
		name string
		call func() error
	}{
		{"copy past the end", func() error { return m.CopyToHost(ctx, make([]byte, 8), 60) }},
		{"negative offset", func() error { return m.CopyFromHost(ctx, -1, []byte{1}) }},
		{"reduce Average", func() error {
			return m.ReduceFromHost(ctx, 0, m, 0, make([]byte, 8), collective.Float32, collective.Average)
		}},
		{"misaligned", func() error {
			return m.ReduceFromHost(ctx, 2, m, 2, make([]byte, 8), collective.Float32, collective.Sum)
		}},
		{"partial element", func() error { return m.Scale(ctx, 0, 6, collective.Float32, 2, 1) }},
		{"partial overlap", func() error {
			return m.ReduceFromHost(ctx, 0, m, 8, make([]byte, 16), collective.Int32, collective.Sum)
		}},
		{"foreign memory", func() error { return m.CopyFrom(ctx, 0, fakeMemory{}, 0, 8) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ue *UsageError
			if err := tc.call(); !errors.As(err, &ue) {
				t.Fatalf("got %v, want a *UsageError", err)
			}
		})
	}
}

// fakeMemory is DeviceMemory of some other backend.
type fakeMemory struct{ collective.DeviceMemory }

func (fakeMemory) Size() int { return 64 }

func TestWrap(t *testing.T) {
	d := openDevice(t)
	ctx := context.Background()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i)
	}
	owner := upload(t, d, data)
	w, err := d.Wrap(ctx, owner.Ptr()+1024, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(download(t, w), data[1024:2048]) {
		t.Fatal("wrapped memory reads the wrong bytes")
	}
	if err := w.Free(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(download(t, owner), data) {
		t.Fatal("Free of wrapped memory touched the owner's memory")
	}
	var ue *UsageError
	if _, err := d.Wrap(ctx, owner.Ptr()+4000, 1024); !errors.As(err, &ue) {
		t.Errorf("wrapping past the allocation: got %v, want a *UsageError", err)
	}
	host := make([]byte, 64)
	if _, err := d.Wrap(ctx, uintptr(unsafe.Pointer(&host[0])), 64); err == nil {
		t.Error("wrapping host memory succeeded")
	}
}

func TestCanceledCall(t *testing.T) {
	d := openDevice(t)
	m := upload(t, d, make([]byte, 1<<20))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.ReduceFromHost(ctx, 0, m, 0, make([]byte, 1<<20), collective.Float32, collective.Sum); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// The device is still usable.
	if err := m.Scale(context.Background(), 0, 1<<20, collective.Float32, 2, 1); err != nil {
		t.Fatal(err)
	}
}

func TestClosedDevice(t *testing.T) {
	d := openDevice(t)
	m, err := d.Alloc(context.Background(), 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if err := m.CopyToHost(context.Background(), make([]byte, 8), 0); !errors.Is(err, ErrFreed) {
		t.Errorf("after Free: got %v, want ErrFreed", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(context.Background(), 64); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: got %v, want ErrClosed", err)
	}
}

// TestCollectivesOnDevice runs whole collectives on device buffers, several
// ranks in one process sharing the GPU, and holds them to the same
// collectives on host buffers: same algorithm, same order of reduction, so
// the same bits.
func TestCollectivesOnDevice(t *testing.T) {
	d := openDevice(t)
	rng := rand.New(rand.NewPCG(7, 8))
	cfg := collective.DefaultConfig()
	for _, p := range []int{2, 3} {
		for _, dt := range allDTypes {
			for _, op := range []collective.ReduceOp{collective.Sum, collective.Average, collective.Min, collective.Max, collective.Product} {
				// Below SmallMessageBytes: recursive doubling; above: the ring.
				for _, count := range []int{37, cfg.SmallMessageBytes/dt.Size() + 1001} {
					t.Run(fmt.Sprintf("p=%d/%v/%v/%d", p, dt, op, count), func(t *testing.T) {
						in := make([][]byte, p)
						for r := range in {
							in[r] = randomFinite(rng, dt, count)
						}
						host := hostAllreduce(t, p, cfg, dt, in, op, collective.Postscale(0.5))
						dev := runWorld(t, p, cfg, func(ctx context.Context, c *collective.Communicator) ([]byte, error) {
							m, err := uploadRank(ctx, d, in[c.Rank()])
							if err != nil {
								return nil, err
							}
							defer m.Free()
							send := collective.Buffer{DType: dt, Count: count, Device: m}
							recv := send
							if c.Rank()%2 == 1 {
								// Odd ranks reduce out of place, from send into other memory.
								o, err := d.Alloc(ctx, m.Size())
								if err != nil {
									return nil, err
								}
								defer o.Free()
								recv.Device, m = o, o
							}
							if err := c.Allreduce(ctx, send, recv, op, collective.Postscale(0.5)); err != nil {
								return nil, err
							}
							out := make([]byte, m.Size())
							return out, m.CopyToHost(ctx, out, 0)
						})
						for r := range p {
							if err := sameBits(dt, dev[r], host[r], false); err != nil {
								t.Fatalf("rank %d: device allreduce differs from host: %v", r, err)
							}
						}
					})
				}
			}
		}
	}
}
