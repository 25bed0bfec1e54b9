// Command c is gorovod's C ABI: built with
//
//	go build -buildmode=c-shared -o libgorovod.so ./bindings/c
//
// it is libgorovod.so, whose interface is gorovod.h (in this directory; cgo's
// generated libgorovod.h is not the interface). The Python package
// (bindings/python) loads it with ctypes; a C or C++ program links it.
//
// The work is done by bindings/internal/engine; this package only crosses
// the boundary: shim.c implements gorovod.h (refusing calls from a forked
// child before they enter the Go runtime, keeping each thread's last error,
// building the synchronous calls from the _start ones, watching SIGINT for
// the interruptible _start calls), and
// exports.go converts the C arguments, calls the engine, and turns errors
// into status codes. Every export recovers panics (GOROVOD_ERR_INTERNAL),
// and C never holds a Go pointer: handles are numbers and messages are
// copied into C memory. A C ABI serves a process, so the engine it drives is
// the one piece of process-wide state (lib, in exports.go).
//
// cuda.go gives the engine CUDA devices (collective/cuda) for calls that
// gorovod_cuda_next marks as device memory. collective/cuda loads the NVIDIA
// driver (libcuda.so.1) at run time, when a call first names a device, so
// one build serves every host: without the driver such a call fails with
// GOROVOD_ERR_INVALID_ARGUMENT naming what is missing, and host memory
// works as everywhere. A test-only build with the tag gorovod_cudastandin
// (cudastandin.go) puts a stand-in device made of host memory there.
package main
