package collective

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/gorovod/gorovod/internal/reduce"
)

// memory is the view of a Buffer the algorithms work through. On the host every
// method is a slice operation or a direct kernel call; on a device each one stages
// through host bytes, so the algorithms never touch device memory themselves.
type memory struct {
	host []byte
	dev  DeviceMemory
}

func memOf(b Buffer) memory { return memory{host: b.Host, dev: b.Device} }

// readable returns the n bytes at off for sending: the memory itself on the
// host, a copy in staging otherwise.
func (m memory) readable(ctx context.Context, off, n int, staging []byte) ([]byte, error) {
	if m.dev == nil {
		return m.host[off : off+n : off+n], nil
	}
	b := staging[:n]
	return b, m.dev.CopyToHost(ctx, b, off)
}

// writable returns where n received bytes destined for off should land: the
// memory itself on the host, staging otherwise (then commit moves them).
func (m memory) writable(off, n int, staging []byte) []byte {
	if m.dev == nil {
		return m.host[off : off+n : off+n]
	}
	return staging[:n]
}

// commit finishes a receive into writable's bytes.
func (m memory) commit(ctx context.Context, off int, b []byte) error {
	if m.dev == nil {
		return nil
	}
	return m.dev.CopyFromHost(ctx, off, b)
}

// reduceFrom sets m[off:] = a[aOff:] op src for the elements in src.
func (m memory) reduceFrom(ctx context.Context, off int, a memory, aOff int, src []byte, dt DType, op ReduceOp) error {
	if m.dev == nil {
		n := len(src)
		return reduceHost(dt, op, m.host[off:off+n], a.host[aOff:aOff+n], src)
	}
	return m.dev.ReduceFromHost(ctx, off, a.dev, aOff, src, dt, op)
}

// alloc returns scratch memory of n bytes in the same space as m; host scratch
// comes from spare, which the caller owns.
func (m memory) alloc(ctx context.Context, n int, spare *[]byte) (memory, func(), error) {
	if m.dev == nil {
		if cap(*spare) < n {
			*spare = make([]byte, n)
		}
		return memory{host: (*spare)[:n]}, func() {}, nil
	}
	d, err := m.dev.Alloc(ctx, n)
	if err != nil {
		return memory{}, nil, err
	}
	return memory{dev: d}, func() { _ = d.Free() }, nil
}

// copyFrom copies n bytes at srcOff of src to off of m.
func (m memory) copyFrom(ctx context.Context, off int, src memory, srcOff, n int) error {
	if n == 0 {
		return nil
	}
	if m.dev == nil {
		copy(m.host[off:off+n], src.host[srcOff:srcOff+n])
		return nil
	}
	return m.dev.CopyFrom(ctx, off, src.dev, srcOff, n)
}

// scale applies the pre/post-scale factor and the integer divisor of Average to
// n bytes at off. divisor is the number of members averaged over, 1 for no
// division.
func (m memory) scale(ctx context.Context, off, n int, dt DType, factor float64, divisor int) error {
	if divisor < 1 {
		return fmt.Errorf("collective: integer average over %d members", divisor)
	}
	if n == 0 || (factor == 1 && divisor == 1) {
		return nil
	}
	if m.dev == nil {
		return scaleHost(dt, m.host[off:off+n], factor, divisor)
	}
	return m.dev.Scale(ctx, off, n, dt, factor, divisor)
}

// kernelOp maps an element-wise op to the host kernels' op; Average sums
// (the division comes with the final scale). An op with no element-wise
// kernel (Adasum, or none of ours) maps to noKernel, which the kernels
// refuse with reduce.ErrUnknownOp: that refusal is the one check of the op
// here (reduceHost names the caller's op in it).
func kernelOp(op ReduceOp) reduce.Op {
	switch op {
	case Sum, Average:
		return reduce.Sum
	case Min:
		return reduce.Min
	case Max:
		return reduce.Max
	case Product:
		return reduce.Prod
	}
	return noKernel
}

// noKernel is a reduce.Op the host kernels do not know.
const noKernel = ^reduce.Op(0)

func view[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// reduceHost sets dst = a op b element-wise; all three hold the same byte count.
// The collectives check op and dt before anything is sent, so an error here
// means a caller inside this package passed what they had not checked.
func reduceHost(dt DType, op ReduceOp, dst, a, b []byte) error {
	k := kernelOp(op)
	var err error
	switch dt {
	case Float32:
		err = reduce.Float32(k, view[float32](dst), view[float32](a), view[float32](b))
	case Float64:
		err = reduce.Float64(k, view[float64](dst), view[float64](a), view[float64](b))
	case Float16:
		err = reduce.Float16(k, view[uint16](dst), view[uint16](a), view[uint16](b))
	case BFloat16:
		err = reduce.BFloat16(k, view[uint16](dst), view[uint16](a), view[uint16](b))
	case Int32:
		err = reduce.Int32(k, view[int32](dst), view[int32](a), view[int32](b))
	case Int64:
		err = reduce.Int64(k, view[int64](dst), view[int64](a), view[int64](b))
	case Uint8:
		err = reduce.Uint8(k, dst, a, b)
	default:
		return fmt.Errorf("collective: cannot reduce %v", dt)
	}
	if errors.Is(err, reduce.ErrUnknownOp) {
		if op == Adasum {
			return fmt.Errorf("collective: %v combines whole tensors, not elements: %w", op, reduce.ErrUnknownOp)
		}
		return fmt.Errorf("%w: %w", unknownOp(op), reduce.ErrUnknownOp)
	}
	return err
}

// scaleHost multiplies b's elements by factor and then, for integer types,
// divides them by divisor (when > 1), in place.
func scaleHost(dt DType, b []byte, factor float64, divisor int) error {
	switch dt {
	case Float32:
		reduce.ScaleFloat32(view[float32](b), view[float32](b), factor)
	case Float64:
		reduce.ScaleFloat64(view[float64](b), view[float64](b), factor)
	case Float16:
		reduce.ScaleFloat16(view[uint16](b), view[uint16](b), factor)
	case BFloat16:
		reduce.ScaleBFloat16(view[uint16](b), view[uint16](b), factor)
	case Int32:
		if divisor > 1 {
			if err := reduce.DivInt32(view[int32](b), view[int32](b), int64(divisor)); err != nil {
				return err
			}
		}
		if factor != 1 {
			reduce.ScaleInt32(view[int32](b), view[int32](b), factor)
		}
	case Int64:
		if divisor > 1 {
			if err := reduce.DivInt64(view[int64](b), view[int64](b), int64(divisor)); err != nil {
				return err
			}
		}
		if factor != 1 {
			reduce.ScaleInt64(view[int64](b), view[int64](b), factor)
		}
	case Uint8:
		if divisor > 1 {
			if err := reduce.DivUint8(b, b, int64(divisor)); err != nil {
				return err
			}
		}
		if factor != 1 {
			reduce.ScaleUint8(b, b, factor)
		}
	default:
		return fmt.Errorf("collective: cannot scale %v", dt)
	}
	return nil
}
