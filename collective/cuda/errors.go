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
	Err    error  // the driver's result (a Result)
	Hint   string // what usually causes this failure here, if known
}

func (e *DriverError) Error() string {
	msg := fmt.Sprintf("cuda: device %d: %s: %v", e.Device, e.Op, e.Err)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

func (e *DriverError) Unwrap() error { return e.Err }

// DriverLoadError is a CUDA driver library that could not be loaded: none on
// this host (no NVIDIA driver), or one without a function gorovod calls (a
// driver older than CUDA 11.8). CPU memory needs no driver.
type DriverLoadError struct {
	Library string // what was loaded, e.g. "libcuda.so.1"
	Reason  string // the dynamic loader's message, when it could not load it
	Missing string // the first function the library lacks, when it loaded
}

func (e *DriverLoadError) Error() string {
	if e.Missing != "" {
		return fmt.Sprintf("cuda: the CUDA driver library %s has no function %s: gorovod needs an NVIDIA driver of CUDA 11.8 (R520) or newer", e.Library, e.Missing)
	}
	return fmt.Sprintf("cuda: cannot load the CUDA driver library %s (%s): CUDA device memory needs an NVIDIA driver (R520, CUDA 11.8, or newer) on this host; CPU memory does not", e.Library, e.Reason)
}

// isResult reports whether err is (or wraps) the driver's result code.
func isResult(err error, code int) bool {
	var r Result
	return errors.As(err, &r) && r.Code == code
}

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
