// Package cuda is gorovod's GPU backend: collective.DeviceMemory for CUDA
// device memory, so the collectives' ring, tree and chain algorithms run on
// gradients that live on a GPU. It is in every build and links no NVIDIA
// library: NewDevice loads the driver's libcuda.so.1 with dlopen and resolves
// the driver functions it calls by name (driver.go), so a program that
// imports it (libgorovod.so does) starts on any host, and only opening a
// device needs the NVIDIA driver (R520, CUDA 11.8, or newer); without one
// NewDevice returns a *DriverLoadError. Building needs no CUDA header either:
// driver.go declares the few types and values it passes from their ABI.
//
// # Use
//
//	dev, err := cuda.NewDevice(ctx, 0)        // one GPU per worker process
//	defer dev.Close()
//	grads, err := dev.Alloc(ctx, n*4)         // or dev.Wrap(ctx, ptr, n*4) for memory the caller owns
//	buf := collective.Buffer{DType: collective.Float32, Count: n, Device: grads}
//	err = comm.Allreduce(ctx, buf, buf, collective.Average)
//
// Wrap adopts memory someone else allocated in the device's primary context,
// such as a PyTorch CUDA tensor's data_ptr() (PyTorch uses the primary context
// too); the caller must make sure the work that produced the data has finished
// (synchronize the producing stream) before calling a collective. For an
// in-place collective pass the same *Memory as send and receive buffer.
//
// # How the ring runs on a GPU
//
// The collectives never touch device bytes: per chunk they ask for a copy to
// host memory to send (CopyToHost), and hand each received chunk to
// ReduceFromHost, which copies it into a device staging buffer and runs a
// reduce kernel that combines it with the local chunk in place; the final
// scale for Average and pre/postscale is another kernel. The kernels are
// gorovod's own (package kernels): CUDA C++ compiled ahead of time to PTX
// that the driver JIT-compiles for the GPU at hand.
//
// Overlap. The ring's sender and receiver goroutines call into the device
// concurrently, so the device keeps a small pool of lanes, each a
// non-blocking CUDA stream with an event; every call takes a free lane,
// queues its copies and kernels on that stream (cuMemcpy*Async,
// cuLaunchKernel), records the event and waits for it. A chunk going out
// (device to host) therefore overlaps a chunk coming in (host to device plus
// the reduce kernel), and both overlap the network transfers the goroutines
// run in between. Each call returns only when its work is complete, as
// collective.DeviceMemory requires, which also orders work across lanes.
// The wait polls the event so that a cancelled context ends it; with a
// context that cannot be cancelled it blocks in the driver instead.
//
// Pinned memory. The host side of every copy is ordinary Go memory, not
// page-locked memory from the driver. The driver
// then stages the bytes through its own pinned buffer: a copy from the device
// returns once the bytes are in Go memory, a copy to the device once they are
// out of it. That costs bandwidth (roughly half of a pinned copy) but it also
// means the driver never touches Go memory after a call returns, which the
// cgo rules require.
//
// Cancellation. When the context ends while a call waits, the call returns
// the context's error at once, but the GPU may still be running its work;
// the staging buffer involved is set aside (not reused) until Close, and the
// memory the call was writing has undefined contents, as for any failed
// collective.
//
// Threads. The CUDA driver keeps the current context per OS thread, so every
// call pins its goroutine to its thread (runtime.LockOSThread) and makes the
// device's primary context current for the duration of the call.
//
// # Processes sharing a host: GPU to GPU
//
// Between worker processes on one host, SameHostGroup allreduces device
// buffers without the host: the ranks exchange CUDA IPC handles of their
// buffers over the communicator, map each other's (cached across calls),
// and each reduces its share of the elements reading every rank's buffer
// directly and writes the result into every rank's buffer. Three small
// meetings of the ranks per call (two when the buffers are those of the
// previous call) order the steps: over the communicator, or with
// SameHostConfig.HostSync on a board of shared memory (ipcboard.go), which
// spares a network round trip per meeting. NewSameHostGroup decides with all
// ranks whether this works (one host, IPC handles that open and read back);
// where it does not, and for any call whose buffers cannot be exported, every
// rank takes the communicator's host-staged path instead.
//
//	g, err := cuda.NewSameHostGroup(ctx, comm, dev, cuda.DefaultSameHostConfig())
//	defer g.Close()
//	err = g.Allreduce(ctx, buf, buf, collective.Average)
//
// The IPC driver calls are in driver.go with the others; the decisions that
// need no GPU (records, verdicts, shares, the mapping cache) in ipcplan.go.
//
// # Testing
//
// Without a GPU (the default build, CI): driver_test.go loads NVIDIA's real
// driver library (Debian's libcuda1, driver 535, from .ci/install: every
// symbol this package resolves must be there, and its cuInit's
// CUDA_ERROR_NO_DEVICE must be explained), NVIDIA's own link stub of libcuda
// (its CUDA_ERROR_STUB_LIBRARY likewise) and
// internal/testing/fakecuda's driver (built with gcc) made to lack a
// function, see no device, be too old or fail cuInit; fakedriver_test.go
// runs Device, Memory, Wrap, WaitEvent, whole allreduces and SameHostGroup
// (its IPC path and its fallback) through that driver as it is: its device
// memory is host memory at moved addresses, its streams run at once and its
// IPC handles open within the process (float32's kernels only). The kernels
// themselves are checked without a GPU by the kernels package (against internal/reduce, by compiling kernels.cu as C++
// on the host), its compile subpackage (NVRTC for sm_70/80/90) and its
// ptxas subpackage (the shipped PTX assembled as the driver's JIT would);
// the algorithms that drive this interface are covered by collective's
// device tests with a fake device, and the same-host decisions by
// ipcplan_test.go.
//
// With a GPU: the tests behind the build tag cuda (go test -tags cuda
// ./collective/cuda; CI only compiles them) run everything on the device,
// the kernels bit for bit against the host's; the same-host tests
// (ipc_test.go) re-run the test binary as two worker processes on one GPU.
package cuda
