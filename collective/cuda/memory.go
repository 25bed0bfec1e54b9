package cuda

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/cuda/kernels"
)

// Memory is a range of device memory of one Device, from Alloc or Wrap. It
// implements collective.DeviceMemory; offsets and sizes are in bytes. Its
// methods are safe for concurrent use on disjoint ranges.
type Memory struct {
	dev   *Device
	ptr   uint64 // CUdeviceptr
	size  int
	owned bool // from Alloc: Free releases it
	freed atomic.Bool
}

var _ collective.DeviceMemory = (*Memory)(nil)

// Ptr is the device address, for passing to other CUDA code.
func (m *Memory) Ptr() uintptr { return uintptr(m.ptr) }

// Device is the device the memory belongs to.
func (m *Memory) Device() *Device { return m.dev }

// Size is the memory's length in bytes.
func (m *Memory) Size() int { return m.size }

func (m *Memory) at(off int) uint64 { return uint64(m.ptr) + uint64(off) }

// check validates [off, off+n) of m for op.
func (m *Memory) check(op string, off, n int) error {
	if m.freed.Load() {
		return ErrFreed
	}
	if off < 0 || n < 0 || off > m.size-n {
		return m.dev.usage(op, fmt.Sprintf("%d bytes at offset %d do not fit in %d bytes", n, off, m.size))
	}
	return nil
}

// checkTyped also requires whole, aligned elements of dt.
func (m *Memory) checkTyped(op string, off, n int, dt collective.DType) error {
	if !dt.Valid() {
		return m.dev.usage(op, fmt.Sprintf("invalid dtype %v", dt))
	}
	if err := m.check(op, off, n); err != nil {
		return err
	}
	if s := dt.Size(); n%s != 0 || m.at(off)%uint64(s) != 0 {
		return m.dev.usage(op, fmt.Sprintf("%d bytes at device address 0x%x are not whole aligned %v elements", n, m.at(off), dt))
	}
	return nil
}

// peer returns other as memory of m's device.
func (m *Memory) peer(op string, other collective.DeviceMemory) (*Memory, error) {
	o, ok := other.(*Memory)
	if !ok || o == nil {
		return nil, m.dev.usage(op, fmt.Sprintf("%T is not CUDA memory of this backend", other))
	}
	if o.dev != m.dev {
		return nil, m.dev.usage(op, fmt.Sprintf("memory of device %d mixed with memory of device %d", o.dev.ordinal, m.dev.ordinal))
	}
	return o, nil
}

// overlap reports whether [a, a+n) and [b, b+n) share bytes.
func overlap(a, b uint64, n int) bool {
	return a < b+uint64(n) && b < a+uint64(n)
}

// CopyToHost copies len(dst) bytes at off into dst.
func (m *Memory) CopyToHost(ctx context.Context, dst []byte, off int) error {
	if err := m.check("CopyToHost", off, len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return m.dev.call(ctx, 0, func(s uintptr, _ uint64) error {
		if err := m.dev.drv.memcpyDtoHAsync(dst, m.at(off), s); err != nil {
			return m.dev.driverErr("cuMemcpyDtoHAsync", err)
		}
		return nil
	})
}

// CopyFromHost copies src into the memory at off.
func (m *Memory) CopyFromHost(ctx context.Context, off int, src []byte) error {
	if err := m.check("CopyFromHost", off, len(src)); err != nil || len(src) == 0 {
		return err
	}
	return m.dev.call(ctx, 0, func(s uintptr, _ uint64) error {
		if err := m.dev.drv.memcpyHtoDAsync(m.at(off), src, s); err != nil {
			return m.dev.driverErr("cuMemcpyHtoDAsync", err)
		}
		return nil
	})
}

// CopyFrom copies n bytes at srcOff of src, memory of the same device, to off.
// Overlapping ranges are copied correctly, through a staging buffer.
func (m *Memory) CopyFrom(ctx context.Context, off int, src collective.DeviceMemory, srcOff, n int) error {
	o, err := m.peer("CopyFrom", src)
	if err != nil {
		return err
	}
	if err := m.check("CopyFrom", off, n); err != nil {
		return err
	}
	if err := o.check("CopyFrom", srcOff, n); err != nil {
		return err
	}
	to, from := m.at(off), o.at(srcOff)
	if n == 0 || to == from {
		return nil
	}
	staged := 0
	if overlap(to, from, n) {
		staged = n
	}
	return m.dev.call(ctx, staged, func(s uintptr, staging uint64) error {
		if staged > 0 {
			// Both copies go on one stream, so the second starts after the first.
			if err := m.dev.drv.memcpyDtoDAsync(staging, from, n, s); err != nil {
				return m.dev.driverErr("cuMemcpyDtoDAsync", err)
			}
			from = staging
		}
		if err := m.dev.drv.memcpyDtoDAsync(to, from, n, s); err != nil {
			return m.dev.driverErr("cuMemcpyDtoDAsync", err)
		}
		return nil
	})
}

// ReduceFromHost sets m[off+i] = a[aOff+i] op src[i] for the elements in src:
// src goes to a device staging buffer and a reduce kernel combines it, in one
// stream, so the copy of the next chunk can overlap this one's kernel. a is m
// itself or other memory of the same device; its range must be m's range or
// not overlap it.
func (m *Memory) ReduceFromHost(ctx context.Context, off int, a collective.DeviceMemory, aOff int, src []byte, dt collective.DType, op collective.ReduceOp) error {
	const what = "ReduceFromHost"
	am, err := m.peer(what, a)
	if err != nil {
		return err
	}
	name, err := kernels.ReduceKernel(dt, op)
	if err != nil {
		return m.dev.usage(what, err.Error())
	}
	n := len(src)
	if err := m.checkTyped(what, off, n, dt); err != nil {
		return err
	}
	if err := am.checkTyped(what, aOff, n, dt); err != nil {
		return err
	}
	dst, x := m.at(off), am.at(aOff)
	if dst != x && overlap(dst, x, n) {
		return m.dev.usage(what, "destination and operand overlap without being the same memory")
	}
	if n == 0 {
		return nil
	}
	count := n / dt.Size()
	return m.dev.call(ctx, n, func(s uintptr, staging uint64) error {
		if err := m.dev.drv.memcpyHtoDAsync(staging, src, s); err != nil {
			return m.dev.driverErr("cuMemcpyHtoDAsync", err)
		}
		return m.dev.launch(s, name, count, dst, x, staging, uint64(count))
	})
}

// Scale multiplies the n bytes of dt elements at off by factor (floats: in
// the element's arithmetic; integers: rounded to nearest even, saturated), or
// for integers with divisor > 1 first divides them, truncating toward zero;
// the same order as the host kernels.
func (m *Memory) Scale(ctx context.Context, off, n int, dt collective.DType, factor float64, divisor int) error {
	const what = "Scale"
	if err := m.checkTyped(what, off, n, dt); err != nil {
		return err
	}
	div := !dt.IsFloat() && divisor > 1
	scale := dt.IsFloat() || factor != 1
	if n == 0 || (!div && !scale) {
		return nil
	}
	count := n / dt.Size()
	x := m.at(off)
	return m.dev.call(ctx, 0, func(s uintptr, _ uint64) error {
		if div {
			name, err := kernels.DivKernel(dt)
			if err != nil {
				return m.dev.usage(what, err.Error())
			}
			if err := m.dev.launch(s, name, count, x, uint64(count), uint64(int64(divisor))); err != nil {
				return err
			}
		}
		if scale {
			name, err := kernels.ScaleKernel(dt)
			if err != nil {
				return m.dev.usage(what, err.Error())
			}
			return m.dev.launch(s, name, count, x, uint64(count), math.Float64bits(factor))
		}
		return nil
	})
}

// Alloc returns new memory of size bytes on the same device.
func (m *Memory) Alloc(ctx context.Context, size int) (collective.DeviceMemory, error) {
	mem, err := m.dev.Alloc(ctx, size)
	if err != nil {
		return nil, err
	}
	return mem, nil
}

// Free releases memory from Alloc; for memory from Wrap, whose owner frees
// it, it only marks the Memory unusable. A second Free returns nil.
func (m *Memory) Free() error {
	if m.freed.Swap(true) || !m.owned || m.size == 0 {
		return nil
	}
	return m.dev.withContext(context.Background(), func() error {
		if err := m.dev.drv.memFree(m.ptr); err != nil {
			return m.dev.driverErr("cuMemFree", err)
		}
		return nil
	})
}
