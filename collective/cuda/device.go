package cuda

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/cuda/kernels"
)

// lanes is how many calls may have work queued on the GPU at once: the ring's
// sender and receiver, a recursive-doubling exchange's two sides, and slack
// for a caller running two collectives on one device.
const lanes = 4

// minStaging is the smallest device staging buffer allocated, so that the
// ring's chunks (256 KiB by default) do not allocate per call.
const minStaging = 256 << 10

// lane is one stream and the event that marks the end of a call's work on it.
type lane struct {
	stream uintptr // CUstream
	done   uintptr // CUevent
}

// Device is one GPU opened for the collectives. It is safe for concurrent
// use; Close it when done.
type Device struct {
	ordinal int
	drv     *driver
	dev     int                // CUdevice
	ctx     uintptr            // CUcontext: the primary context, shared with the CUDA runtime
	module  uintptr            // CUmodule
	fns     map[string]uintptr // CUfunction of every kernel, loaded once; read-only after NewDevice
	lanes   chan lane          // idle lanes

	// life guards closed: calls hold it shared for their duration, Close
	// exclusively, so Close waits for calls in flight.
	life   sync.RWMutex
	closed bool

	mu         sync.Mutex   // guards the staging buffers
	staging    []stagingBuf // idle, smallest first
	quarantine []uint64     // staging a cancelled call may still be reading; freed by Close
}

type stagingBuf struct {
	ptr  uint64 // CUdeviceptr
	size int
}

// DeviceConfig is how NewDeviceConfig opens a GPU.
type DeviceConfig struct {
	// Driver is the CUDA driver library to load (dlopen): a name the dynamic
	// loader looks for on its path, or a file's path.
	Driver string
}

// DefaultDeviceConfig loads the NVIDIA driver's libcuda.so.1 from the
// loader's path, where the driver installs it.
func DefaultDeviceConfig() DeviceConfig {
	return DeviceConfig{Driver: "libcuda.so.1"}
}

// NewDevice opens the GPU with the given CUDA ordinal with
// DefaultDeviceConfig; see NewDeviceConfig.
func NewDevice(ctx context.Context, ordinal int) (*Device, error) {
	return NewDeviceConfig(ctx, ordinal, DefaultDeviceConfig())
}

// NewDeviceConfig opens the GPU with the given CUDA ordinal (0 is the first
// device CUDA_VISIBLE_DEVICES leaves visible): it loads the CUDA driver
// (cfg.Driver; a *DriverLoadError when there is none, as on a host without
// NVIDIA's driver), retains the device's primary context, loads the kernels
// (the driver JIT-compiles kernels.ptx, which takes a moment the first time
// and is then cached by the driver) and creates its streams. The GPU must be
// Volta (sm_70) or newer and the driver R520 (CUDA 11.8) or newer.
func NewDeviceConfig(ctx context.Context, ordinal int, cfg DeviceConfig) (*Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	drv, err := loadDriver(cfg.Driver)
	if err != nil {
		return nil, err
	}
	d, err := openWith(drv, ordinal)
	if err != nil {
		drv.close()
		return nil, err
	}
	return d, nil
}

// openWith is NewDeviceConfig once the driver is loaded; the caller
// unloads it when this fails.
func openWith(drv *driver, ordinal int) (*Device, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := drv.init(); err != nil {
		return nil, initError(ordinal, err)
	}
	if v, err := drv.version(); err == nil && v < minDriverVersion {
		return nil, &UsageError{Device: ordinal, Op: "NewDevice", Reason: fmt.Sprintf(
			"the NVIDIA driver supports CUDA %d.%d; gorovod's kernels need CUDA 11.8 or newer (driver R520+)", v/1000, v%1000/10)}
	}
	n, err := drv.deviceCount()
	if err != nil {
		return nil, &DriverError{Device: ordinal, Op: "cuDeviceGetCount", Err: err}
	}
	if ordinal < 0 || ordinal >= n {
		return nil, &UsageError{Device: ordinal, Op: "NewDevice", Reason: fmt.Sprintf("no such device: CUDA sees %d (check CUDA_VISIBLE_DEVICES)", n)}
	}
	d := &Device{ordinal: ordinal, drv: drv, fns: make(map[string]uintptr), lanes: make(chan lane, lanes)}
	if d.dev, err = drv.device(ordinal); err != nil {
		return nil, d.driverErr("cuDeviceGet", err)
	}
	major, err := drv.attribute(attrComputeCapabilityMajor, d.dev)
	if err != nil {
		return nil, d.driverErr("cuDeviceGetAttribute", err)
	}
	minor, err := drv.attribute(attrComputeCapabilityMinor, d.dev)
	if err != nil {
		return nil, d.driverErr("cuDeviceGetAttribute", err)
	}
	if major < 7 {
		return nil, &UsageError{Device: ordinal, Op: "NewDevice", Reason: fmt.Sprintf("compute capability %d.%d: gorovod's kernels need 7.0 (Volta) or newer", major, minor)}
	}
	if d.ctx, err = drv.primaryCtxRetain(d.dev); err != nil {
		return nil, d.driverErr("cuDevicePrimaryCtxRetain", err)
	}
	if err := d.open(); err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

// minDriverVersion is CUDA 11.8 (cuDriverGetVersion's 1000*major + 10*minor):
// the PTX ISA of kernels.ptx and the versioned symbols loadDriver resolves.
const minDriverVersion = 11080

// initError explains a failed cuInit: the two failures users meet are a
// driver that finds no GPU and NVIDIA's link stub found in place of the
// driver.
func initError(ordinal int, err error) error {
	e := &DriverError{Device: ordinal, Op: "cuInit", Err: err}
	if r, ok := err.(Result); ok {
		switch r.Code {
		case resultStubLibrary:
			e.Hint = "the libcuda loaded is NVIDIA's link stub (from a CUDA toolkit), not the driver: put the driver's libcuda.so.1 first on the loader's path"
		case resultNoDevice:
			e.Hint = "the driver finds no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
		case resultInsufficient:
			e.Hint = "the NVIDIA driver is older than its CUDA library; gorovod needs R520 (CUDA 11.8) or newer"
		}
	}
	return e
}

// open loads the kernels and creates the lanes, on a locked thread.
func (d *Device) open() error {
	if err := d.drv.ctxSetCurrent(d.ctx); err != nil {
		return d.driverErr("cuCtxSetCurrent", err)
	}
	var err error
	if d.module, err = d.drv.moduleLoadData(kernels.PTX); err != nil {
		return &DriverError{Device: d.ordinal, Op: "cuModuleLoadData(kernels.ptx)", Err: err,
			Hint: "the driver could not JIT-compile the kernels' PTX (ISA 7.8, " + kernels.PTXArch + "); it needs driver R520 or newer"}
	}
	for _, k := range kernels.All() {
		fn, err := d.drv.moduleFunction(d.module, k.Name)
		if err != nil {
			return d.driverErr("cuModuleGetFunction("+k.Name+")", err)
		}
		d.fns[k.Name] = fn
	}
	for range lanes {
		s, err := d.drv.streamCreate(streamNonBlocking)
		if err != nil {
			return d.driverErr("cuStreamCreate", err)
		}
		e, err := d.drv.eventCreate(eventDisableTiming | eventBlockingSync)
		if err != nil {
			_ = d.drv.streamDestroy(s)
			return d.driverErr("cuEventCreate", err)
		}
		d.lanes <- lane{stream: s, done: e}
	}
	return nil
}

// release undoes open and NewDevice, on a locked thread with the context
// current; it keeps the first error and goes on.
func (d *Device) release() error {
	var first error
	keep := func(op string, err error) {
		if err != nil && first == nil {
			first = d.driverErr(op, err)
		}
	}
	if d.ctx != 0 {
		keep("cuCtxSetCurrent", d.drv.ctxSetCurrent(d.ctx))
		// All work must end before its buffers go.
		keep("cuCtxSynchronize", d.drv.ctxSynchronize())
	}
	// No call is in flight (Close holds life; NewDevice has not returned), so
	// every lane is idle in the channel.
	for len(d.lanes) > 0 {
		l := <-d.lanes
		keep("cuEventDestroy", d.drv.eventDestroy(l.done))
		keep("cuStreamDestroy", d.drv.streamDestroy(l.stream))
	}
	d.mu.Lock()
	for _, s := range d.staging {
		keep("cuMemFree", d.drv.memFree(s.ptr))
	}
	for _, p := range d.quarantine {
		keep("cuMemFree", d.drv.memFree(p))
	}
	d.staging, d.quarantine = nil, nil
	d.mu.Unlock()
	if d.module != 0 {
		keep("cuModuleUnload", d.drv.moduleUnload(d.module))
	}
	if d.ctx != 0 {
		keep("cuDevicePrimaryCtxRelease", d.drv.primaryCtxRelease(d.dev))
	}
	return first
}

// Close waits for calls in flight, then frees the device's streams, staging
// buffers and kernels and releases its primary context. Memory from Alloc
// should be freed before; a second Close returns nil.
func (d *Device) Close() error {
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := d.release()
	d.drv.close()
	return err
}

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the device's product name, e.g. "NVIDIA A100-SXM4-80GB".
func (d *Device) Name() (string, error) {
	name, err := d.drv.deviceName(d.dev)
	if err != nil {
		return "", d.driverErr("cuDeviceGetName", err)
	}
	return name, nil
}

// Alloc allocates size bytes of device memory (uninitialised), released by
// the Memory's Free.
func (d *Device) Alloc(ctx context.Context, size int) (*Memory, error) {
	if size < 0 {
		return nil, d.usage("Alloc", fmt.Sprintf("negative size %d", size))
	}
	m := &Memory{dev: d, size: size, owned: true}
	if size == 0 {
		// cuMemAlloc rejects 0 bytes; an empty Memory needs no pointer.
		return m, nil
	}
	err := d.withContext(ctx, func() error {
		p, err := d.drv.memAlloc(size)
		if err != nil {
			return &DriverError{Device: d.ordinal, Op: fmt.Sprintf("cuMemAlloc(%d)", size), Err: err}
		}
		m.ptr = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Wrap adopts size bytes of device memory at ptr that the caller allocated in
// this device's primary context (a PyTorch tensor's data_ptr(), for one). The
// pointer must be memory of this device, which is checked, as is (where the
// driver can tell) that the range lies inside one allocation. The
// caller keeps ownership: the Memory's Free does not free it, and the memory
// must outlive every collective that uses it.
func (d *Device) Wrap(ctx context.Context, ptr uintptr, size int) (*Memory, error) {
	if size < 0 {
		return nil, d.usage("Wrap", fmt.Sprintf("negative size %d", size))
	}
	m := &Memory{dev: d, ptr: uint64(ptr), size: size}
	if size == 0 {
		return m, nil
	}
	err := d.withContext(ctx, func() error {
		owner, err := d.drv.pointerDevice(uint64(ptr))
		if err != nil {
			return &DriverError{Device: d.ordinal, Op: "cuPointerGetAttribute(DEVICE_ORDINAL)", Err: err,
				Hint: fmt.Sprintf("0x%x is not CUDA device memory", ptr)}
		}
		if owner != d.ordinal {
			return d.usage("Wrap", fmt.Sprintf("0x%x is memory of device %d", ptr, owner))
		}
		// The extent check is best effort: memory mapped through the virtual
		// memory API (PyTorch's expandable segments) may not report a range.
		if base, allocSize, err := d.drv.addressRange(uint64(ptr)); err == nil &&
			uint64(ptr)+uint64(size) > base+uint64(allocSize) {
			return d.usage("Wrap", fmt.Sprintf("%d bytes at 0x%x run past the end of their allocation (0x%x, %d bytes)", size, ptr, uintptr(base), allocSize))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// withContext runs fn on a locked OS thread with the device's context
// current, for the synchronous driver calls that need no lane.
func (d *Device) withContext(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.ctxSetCurrent(d.ctx); err != nil {
		return d.driverErr("cuCtxSetCurrent", err)
	}
	return fn()
}

// call is one DeviceMemory operation: enqueue puts its copies and kernels on
// the lane's stream (given a staging buffer of stagingSize bytes when that is
// not 0), then call waits until the GPU has finished them.
func (d *Device) call(ctx context.Context, stagingSize int, enqueue func(s uintptr, staging uint64) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return ErrClosed
	}
	var l lane
	select {
	case l = <-d.lanes:
	case <-ctx.Done():
		return ctx.Err()
	}
	// A lane whose last call was cancelled may still have work queued; the
	// next call's work queues behind it and its wait covers both.
	defer func() { d.lanes <- l }()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.ctxSetCurrent(d.ctx); err != nil {
		return d.driverErr("cuCtxSetCurrent", err)
	}
	var staging stagingBuf
	if stagingSize > 0 {
		var err error
		if staging, err = d.getStaging(stagingSize); err != nil {
			return err
		}
	}
	err := enqueue(l.stream, staging.ptr)
	if err == nil {
		if rerr := d.drv.eventRecord(l.done, l.stream); rerr != nil {
			err = d.driverErr("cuEventRecord", rerr)
		} else {
			err = d.wait(ctx, l.done)
		}
	}
	if staging.size > 0 {
		if err != nil && ctx.Err() != nil {
			// The GPU may still read it: keep it out of use until Close.
			d.mu.Lock()
			d.quarantine = append(d.quarantine, staging.ptr)
			d.mu.Unlock()
		} else {
			d.putStaging(staging)
		}
	}
	return err
}

// wait returns when the GPU has passed ev or ctx ends. A context that can end
// is honoured by polling the event: first a spin of up to spinWait (yielding
// the processor between queries), since a small copy or kernel finishes in
// a few microseconds and a sleep costs tens of them (the first run on an
// H200 measured 42 µs for a 4 KiB device-to-device copy with sleeps after
// 64 queries); then sleeps of up to 100 µs, below a large chunk's copy time.
// A context that cannot end lets the driver block the thread instead.
func (d *Device) wait(ctx context.Context, ev uintptr) error {
	if ctx.Done() == nil {
		if err := d.drv.eventSynchronize(ev); err != nil {
			return d.driverErr("cuEventSynchronize", err)
		}
		return nil
	}
	return pollEvent(ctx, func() (bool, error) {
		err := d.drv.eventQuery(ev)
		switch {
		case err == nil:
			return true, nil
		case isResult(err, resultNotReady):
			return false, nil
		default:
			return false, d.driverErr("cuEventQuery", err)
		}
	})
}

// pollEvent calls query until it reports the event passed or fails, or ctx
// ends: a spin of up to spinWait, yielding the processor between queries,
// then sleeps doubling up to 100 µs.
func pollEvent(ctx context.Context, query func() (passed bool, err error)) error {
	start := time.Now()
	sleep := time.Microsecond
	spinning := true
	for spin := 0; ; spin++ {
		if passed, err := query(); passed || err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if spinning && spin%64 == 63 {
			// Reading the clock every 64 queries keeps it off the fast path.
			spinning = time.Since(start) < spinWait
		}
		if spinning {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, 100*time.Microsecond)
	}
}

// spinWait is how long wait polls without sleeping.
const spinWait = 200 * time.Microsecond

// getStaging returns an idle staging buffer of at least n bytes, allocating
// one (of the next power of two, at least minStaging) when none fits. At
// most one buffer per lane is ever in use, so the pool stays small.
func (d *Device) getStaging(n int) (stagingBuf, error) {
	d.mu.Lock()
	for i, s := range d.staging {
		if s.size >= n {
			d.staging = slices.Delete(d.staging, i, i+1)
			d.mu.Unlock()
			return s, nil
		}
	}
	d.mu.Unlock()
	size := minStaging
	for size < n {
		size *= 2
	}
	p, err := d.drv.memAlloc(size)
	if err != nil {
		return stagingBuf{}, &DriverError{Device: d.ordinal, Op: fmt.Sprintf("cuMemAlloc(%d) for staging", size), Err: err}
	}
	return stagingBuf{ptr: p, size: size}, nil
}

// putStaging returns s to the pool, dropping the smallest idle buffer when
// the pool already holds one per lane.
func (d *Device) putStaging(s stagingBuf) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, _ := slices.BinarySearchFunc(d.staging, s.size, func(b stagingBuf, size int) int { return b.size - size })
	d.staging = slices.Insert(d.staging, i, s)
	if len(d.staging) > lanes {
		// Freeing synchronizes with the device; rare once the sizes settle.
		_ = d.drv.memFree(d.staging[0].ptr)
		d.staging = d.staging[1:]
	}
}

// launch queues kernel name on s over n elements with the given 8-byte
// parameters (see kernels.cu: every parameter is 8 bytes wide).
func (d *Device) launch(s uintptr, name string, n int, params ...uint64) error {
	fn, ok := d.fns[name]
	if !ok {
		return d.usage("launch", "no kernel "+name)
	}
	if err := d.drv.launch(fn, kernels.Grid(n), kernels.BlockThreads, s, params); err != nil {
		return d.driverErr("cuLaunchKernel("+name+")", err)
	}
	return nil
}

func (d *Device) driverErr(op string, err error) error {
	return &DriverError{Device: d.ordinal, Op: op, Err: err}
}

func (d *Device) usage(op, reason string) error {
	return &UsageError{Device: d.ordinal, Op: op, Reason: reason}
}
