//go:build cuda

package cuda

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by every call on a Device (and its Memory) after Close.
	ErrClosed = errors.New("cuda: device closed")
	// ErrFreed is returned by calls on Memory after its Free.
	ErrFreed = errors.New("cuda: memory already freed")
)

// DriverError is a CUDA driver call that failed.
type DriverError struct {
	Device int    // the device ordinal
	Op     string // what gorovod was doing, e.g. "cuMemcpyDtoHAsync"
	Err    error  // the driver's error (gorgonia.org/cu's result type)
	Hint   string // what usually causes this failure here, if known
}

func (e *DriverError) Error() string {
	msg := fmt.Sprintf("cuda: device %d: %s: %v (CUDA error %d)", e.Device, e.Op, e.Err, e.Err)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

func (e *DriverError) Unwrap() error { return e.Err }

// UsageError is a call with arguments the backend rejects before touching the
// GPU: a range outside the memory, misaligned elements, memory of another
// device, an operation with no kernel.
type UsageError struct {
	Device int
	Op     string // the DeviceMemory method or Device call
	Reason string
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("cuda: device %d: %s: %s", e.Device, e.Op, e.Reason)
}
