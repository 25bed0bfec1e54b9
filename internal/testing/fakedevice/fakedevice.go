package fakedevice

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/gorovod/gorovod/collective"
)

// Counters counts what devices sharing them were asked to do.
type Counters struct {
	Allocs, Frees, Copies, Kernels atomic.Int64
}

// Memory is one allocation of the fake device.
type Memory struct {
	mem   []byte
	count *Counters
}

var _ collective.DeviceMemory = (*Memory)(nil)

// New returns device memory holding a copy of b; c (which may be shared by
// several memories, or nil) counts the calls.
func New(b []byte, c *Counters) *Memory {
	if c == nil {
		c = &Counters{}
	}
	return &Memory{mem: append([]byte(nil), b...), count: c}
}

// Adopt returns device memory that is b itself (not a copy), for a stand-in
// device whose "device memory" is memory the caller allocated; c as for New.
func Adopt(b []byte, c *Counters) *Memory {
	if c == nil {
		c = &Counters{}
	}
	return &Memory{mem: b, count: c}
}

// Buffer wraps m as a collective buffer of dt elements filling it.
func (m *Memory) Buffer(dt collective.DType) collective.Buffer {
	return collective.Buffer{DType: dt, Count: len(m.mem) / dt.Size(), Device: m}
}

// Bytes is the memory's content, for the test to inspect.
func (m *Memory) Bytes() []byte { return m.mem }

// Size is the allocation's length in bytes.
func (m *Memory) Size() int { return len(m.mem) }

// CopyToHost copies len(dst) bytes at off into dst.
func (m *Memory) CopyToHost(ctx context.Context, dst []byte, off int) error {
	copy(dst, m.mem[off:off+len(dst)])
	return nil
}

// CopyFromHost copies src into the memory at off.
func (m *Memory) CopyFromHost(ctx context.Context, off int, src []byte) error {
	copy(m.mem[off:], src)
	return nil
}

// CopyFrom copies n bytes at srcOff of src, another Memory, to off.
func (m *Memory) CopyFrom(ctx context.Context, off int, src collective.DeviceMemory, srcOff, n int) error {
	s, ok := src.(*Memory)
	if !ok {
		return fmt.Errorf("fakedevice: %T is not memory of this device", src)
	}
	m.count.Copies.Add(1)
	copy(m.mem[off:off+n], s.mem[srcOff:srcOff+n])
	return nil
}

// ReduceFromHost sets m[off+i] = a[aOff+i] op src[i].
func (m *Memory) ReduceFromHost(ctx context.Context, off int, a collective.DeviceMemory, aOff int, src []byte, dt collective.DType, op collective.ReduceOp) error {
	am, ok := a.(*Memory)
	if !ok {
		return fmt.Errorf("fakedevice: %T is not memory of this device", a)
	}
	m.count.Kernels.Add(1)
	n := len(src)
	x, y := Decode(dt, am.mem[aOff:aOff+n]), Decode(dt, src)
	for j := range x {
		switch op {
		case collective.Sum:
			x[j] += y[j]
		case collective.Product:
			x[j] *= y[j]
		case collective.Min:
			x[j] = min(x[j], y[j])
		case collective.Max:
			x[j] = max(x[j], y[j])
		default:
			return fmt.Errorf("fakedevice: reduce op %v", op)
		}
	}
	copy(m.mem[off:off+n], Encode(dt, x))
	return nil
}

// Scale divides integers by divisor (> 1, truncating) and multiplies by factor.
func (m *Memory) Scale(ctx context.Context, off, n int, dt collective.DType, factor float64, divisor int) error {
	m.count.Kernels.Add(1)
	x := Decode(dt, m.mem[off:off+n])
	for j := range x {
		if divisor > 1 && !dt.IsFloat() {
			x[j] = math.Trunc(x[j] / float64(divisor))
		}
		x[j] *= factor
		if !dt.IsFloat() {
			x[j] = math.RoundToEven(x[j])
		}
	}
	copy(m.mem[off:off+n], Encode(dt, x))
	return nil
}

// Alloc returns new zeroed memory sharing m's counters.
func (m *Memory) Alloc(ctx context.Context, size int) (collective.DeviceMemory, error) {
	m.count.Allocs.Add(1)
	return &Memory{mem: make([]byte, size), count: m.count}, nil
}

// Free counts the release.
func (m *Memory) Free() error {
	m.count.Frees.Add(1)
	return nil
}

// Encode writes vals as little-endian elements of dt (integers converted,
// floats rounded to nearest even).
func Encode(dt collective.DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for j, v := range vals {
		switch dt {
		case collective.Float32:
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(float32(v)))
		case collective.Float64:
			binary.LittleEndian.PutUint64(b[8*j:], math.Float64bits(v))
		case collective.Float16:
			binary.LittleEndian.PutUint16(b[2*j:], uint16(collective.NewF16(float32(v))))
		case collective.BFloat16:
			binary.LittleEndian.PutUint16(b[2*j:], uint16(collective.NewBF16(float32(v))))
		case collective.Int32:
			binary.LittleEndian.PutUint32(b[4*j:], uint32(int32(v)))
		case collective.Int64:
			binary.LittleEndian.PutUint64(b[8*j:], uint64(int64(v)))
		case collective.Uint8:
			b[j] = uint8(v)
		}
	}
	return b
}

// Decode reads little-endian elements of dt as float64s.
func Decode(dt collective.DType, b []byte) []float64 {
	vals := make([]float64, len(b)/dt.Size())
	for j := range vals {
		switch dt {
		case collective.Float32:
			vals[j] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:])))
		case collective.Float64:
			vals[j] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*j:]))
		case collective.Float16:
			vals[j] = float64(collective.F16(binary.LittleEndian.Uint16(b[2*j:])).Float32())
		case collective.BFloat16:
			vals[j] = float64(collective.BF16(binary.LittleEndian.Uint16(b[2*j:])).Float32())
		case collective.Int32:
			vals[j] = float64(int32(binary.LittleEndian.Uint32(b[4*j:])))
		case collective.Int64:
			vals[j] = float64(int64(binary.LittleEndian.Uint64(b[8*j:])))
		case collective.Uint8:
			vals[j] = float64(b[j])
		}
	}
	return vals
}
