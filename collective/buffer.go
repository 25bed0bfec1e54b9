package collective

import (
	"context"
	"fmt"
	"unsafe"
)

// Buffer is one argument of a collective: Count elements of DType, either in host
// memory (Host) or in memory the host cannot address directly (Device).
//
// Exactly one of Host and Device is set. The collectives never read or write a
// Device buffer's bytes themselves: they stage through host memory and ask the
// device to reduce, so CUDA memory plugs in through DeviceMemory.
type Buffer struct {
	DType  DType
	Count  int
	Host   []byte
	Device DeviceMemory
}

// HostBuffer wraps host bytes holding len(b)/dt.Size() elements of dt.
func HostBuffer(dt DType, b []byte) Buffer {
	n := 0
	if s := dt.Size(); s > 0 {
		n = len(b) / s
	}
	return Buffer{DType: dt, Count: n, Host: b}
}

// SliceBuffer wraps a typed Go slice without copying.
func SliceBuffer[T Element](s []T) Buffer {
	return Buffer{DType: DTypeOf[T](), Count: len(s), Host: asBytes(s)}
}

func asBytes[T Element](s []T) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// Bytes is the buffer's size in bytes.
func (b Buffer) Bytes() int { return b.Count * b.DType.Size() }

func (b Buffer) validate(what string) error {
	if !b.DType.Valid() {
		return fmt.Errorf("collective: %s buffer has invalid dtype %v", what, b.DType)
	}
	if b.Count < 0 {
		return fmt.Errorf("collective: %s buffer has negative count %d", what, b.Count)
	}
	switch {
	case b.Device != nil && b.Host != nil:
		return fmt.Errorf("collective: %s buffer sets both Host and Device memory", what)
	case b.Device != nil:
		if b.Device.Size() < b.Bytes() {
			return fmt.Errorf("collective: %s buffer: device memory of %d bytes cannot hold %d %v elements", what, b.Device.Size(), b.Count, b.DType)
		}
	default:
		if len(b.Host) != b.Bytes() {
			return fmt.Errorf("collective: %s buffer: %d host bytes for %d %v elements (want %d bytes)", what, len(b.Host), b.Count, b.DType, b.Bytes())
		}
	}
	return nil
}

// sameMemory reports whether two buffers are the same memory (an in-place call).
func sameMemory(a, b Buffer) bool {
	if a.Device != nil || b.Device != nil {
		return a.Device == b.Device
	}
	if len(a.Host) == 0 || len(b.Host) == 0 {
		return len(a.Host) == len(b.Host)
	}
	return &a.Host[0] == &b.Host[0] && len(a.Host) == len(b.Host)
}

// overlaps reports whether host buffers share bytes without being the same memory,
// which no collective accepts.
func overlaps(a, b Buffer) bool {
	if a.Host == nil || b.Host == nil || len(a.Host) == 0 || len(b.Host) == 0 || sameMemory(a, b) {
		return false
	}
	a0 := uintptr(unsafe.Pointer(&a.Host[0]))
	b0 := uintptr(unsafe.Pointer(&b.Host[0]))
	return a0 < b0+uintptr(len(b.Host)) && b0 < a0+uintptr(len(a.Host))
}

// DeviceMemory is memory the collectives move and reduce without touching it from
// Go: accelerator memory, typically. Offsets and sizes are in bytes. Each method
// returns once its effect is complete (an implementation may queue work on a
// stream internally, but must synchronize before returning).
type DeviceMemory interface {
	// Size is the allocation's length in bytes.
	Size() int
	// CopyToHost copies len(dst) bytes starting at off into dst.
	CopyToHost(ctx context.Context, dst []byte, off int) error
	// CopyFromHost copies src into the memory starting at off.
	CopyFromHost(ctx context.Context, off int, src []byte) error
	// CopyFrom copies n bytes at srcOff of src (memory of the same device) to off.
	CopyFrom(ctx context.Context, off int, src DeviceMemory, srcOff, n int) error
	// ReduceFromHost sets this[off+i] = a[aOff+i] op src[i] element-wise for the
	// elements in src; a is this memory or another of the same device. op is
	// Sum, Min, Max or Product.
	ReduceFromHost(ctx context.Context, off int, a DeviceMemory, aOff int, src []byte, dt DType, op ReduceOp) error
	// Scale multiplies n bytes of elements at off by factor (integers: rounded to
	// nearest, saturated); divisor > 1 instead divides integers truncating
	// toward zero (Average on integer types), and factor is then 1.
	Scale(ctx context.Context, off, n int, dt DType, factor float64, divisor int) error
	// Alloc returns new scratch memory of size bytes on the same device.
	Alloc(ctx context.Context, size int) (DeviceMemory, error)
	// Free releases memory obtained from Alloc.
	Free() error
}
