package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	stdsync "sync"

	"github.com/gorovod/gorovod/collective"
)

// Device memory: buffers a framework allocated on an accelerator (a
// PyTorch CUDA tensor's data_ptr()) that the collectives reach through
// collective.DeviceMemory. The engine opens each device the first time a
// call names it (one per ordinal for the engine's life) and closes them at
// Close, after the session has freed its fusion buffers on them.
//
// Ordering. The framework queues the work that produces a tensor on a
// stream of its own and returns at once, so when it submits the collective
// the tensor may not be written yet. It records an event on that stream
// behind the work and passes it (AfterEvent); the call waits for the event
// before it touches any of its buffers, on the engine's side, so neither
// the framework's thread nor its stream ever blocks. Every DeviceMemory
// operation returns when the GPU has finished it, so once the call's
// handle completes its results are in place for whatever the framework
// queues next.

// OpenDevice opens accelerator ordinal for the engine (Config.OpenDevice):
// it is the one seam between the engine and an accelerator's driver, so
// that the engine builds and is tested without one.
type OpenDevice func(ctx context.Context, ordinal int) (Device, error)

// Device is one opened accelerator.
type Device interface {
	// Wrap adopts size bytes of the device's memory at ptr, which the
	// caller owns and keeps valid while collectives use it (its Free does
	// not free it).
	Wrap(ctx context.Context, ptr uintptr, size int) (collective.DeviceMemory, error)
	// WaitEvent returns once the device has passed event, an event the
	// framework recorded on one of its streams (0: none), or when ctx
	// ends.
	WaitEvent(ctx context.Context, event uintptr) error
	// Close releases the device; nothing uses it afterwards.
	Close() error
}

// ErrNoDevices is wrapped by the error of a call given device memory by an
// engine that has no OpenDevice (a library built without accelerator
// support).
var ErrNoDevices = errors.New("gorovod: this build has no accelerator support")

// devices are the accelerators an engine opened, by ordinal.
type devices struct {
	open   OpenDevice // nil: none can be opened
	mu     stdsync.Mutex
	byOrd  map[int]Device
	closed bool
}

// get returns device ordinal, opening it the first time.
func (d *devices) get(ctx context.Context, ordinal int) (Device, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if dev, ok := d.byOrd[ordinal]; ok {
		return dev, nil
	}
	if d.open == nil {
		return nil, fmt.Errorf("%w: %w (device memory of accelerator %d)", ErrInvalid, ErrNoDevices, ordinal)
	}
	// Opening may take a while (a driver compiles kernels the first time);
	// it happens once per device, and no one else can use the device
	// meanwhile anyway.
	dev, err := d.open(ctx, ordinal)
	if err != nil {
		return nil, fmt.Errorf("gorovod: opening accelerator %d: %w", ordinal, err)
	}
	if d.byOrd == nil {
		d.byOrd = make(map[int]Device)
	}
	d.byOrd[ordinal] = dev
	return dev, nil
}

// close closes every device opened; nothing can be opened afterwards.
func (d *devices) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	var errs []error
	for ord, dev := range d.byOrd {
		if err := dev.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing accelerator %d: %w", ord, err))
		}
	}
	d.byOrd = nil
	return errors.Join(errs...)
}

// DeviceBuffer is count elements of dtype dt at ptr in the memory of
// accelerator ordinal (a CUDA ordinal), opening the device the first time:
// a buffer for the collectives, which the caller keeps valid and untouched
// until the handle of every call given it completes.
func (e *Engine) DeviceBuffer(ordinal int, ptr uintptr, dt collective.DType, count int) (collective.Buffer, error) {
	switch {
	case ordinal < 0:
		return collective.Buffer{}, fmt.Errorf("%w: accelerator ordinal %d", ErrInvalid, ordinal)
	case !dt.Valid():
		return collective.Buffer{}, fmt.Errorf("%w: dtype %d (want 1 to 7: float32, float64, float16, bfloat16, int32, int64, uint8)", ErrInvalid, dt)
	case count < 0 || count > math.MaxInt/dt.Size():
		return collective.Buffer{}, fmt.Errorf("%w: %d elements", ErrInvalid, count)
	case ptr == 0 && count > 0:
		return collective.Buffer{}, fmt.Errorf("%w: NULL device pointer for %d elements", ErrInvalid, count)
	}
	dev, err := e.devices.get(e.ctx, ordinal)
	if err != nil {
		return collective.Buffer{}, err
	}
	mem, err := dev.Wrap(e.ctx, ptr, count*dt.Size())
	if err != nil {
		return collective.Buffer{}, fmt.Errorf("%w: device memory at 0x%x (%d %v elements) on accelerator %d: %w", ErrInvalid, ptr, count, dt, ordinal, err)
	}
	return collective.Buffer{DType: dt, Count: count, Device: mem}, nil
}

// AfterEvent makes a call wait, before it touches its buffers, until
// accelerator ordinal has passed event (see the package's Device memory
// notes); event 0 is none. The event must stay alive until the call's
// handle completes. A device the engine has not opened (no DeviceBuffer of
// it yet) is opened here.
func (e *Engine) AfterEvent(ordinal int, event uintptr) CallOption {
	return func(c *call) {
		if event == 0 {
			return
		}
		c.ready = func(ctx context.Context) error {
			dev, err := e.devices.get(ctx, ordinal)
			if err != nil {
				return err
			}
			if err := dev.WaitEvent(ctx, event); err != nil {
				return fmt.Errorf("gorovod: waiting for the tensors' stream (event 0x%x on accelerator %d): %w", event, ordinal, err)
			}
			return nil
		}
	}
}
