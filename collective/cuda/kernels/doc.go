// Package kernels owns the CUDA kernels of gorovod's GPU backend
// (collective/cuda): their CUDA C++ source (kernels.cu), the PTX compiled from
// it (kernels.ptx), the kernel names and launch geometry, and the tests that
// hold the kernels to the host kernels of internal/reduce. It needs neither
// CUDA nor cgo: everything here builds and is tested by the default build.
//
// # Why PTX compiled ahead of time
//
// NVRTC (NVIDIA's runtime compiler) compiles kernels.cu to PTX for
// compute_70 once, by go generate, and the PTX is kept beside the source and
// embedded in the binary. The backend loads it with cuModuleLoadData, and the
// driver JIT-compiles it for whatever GPU is present (Volta and every later
// generation: PTX is forward compatible) and caches the result. Compiling
// with NVRTC at start-up instead would make every GPU worker need libnvrtc at
// run time (a PyTorch install keeps its own copy in a Python package, not on
// the library path) and spend about a second per process compiling; the
// pre-compiled PTX needs only the driver (R520 or newer, for PTX ISA 7.8 from
// CUDA 11.8). The price is that kernels.ptx must be regenerated when
// kernels.cu changes; it records the SHA-256 of the source it came from and a
// default-build test fails when they disagree:
//
//	go generate ./collective/cuda/kernels   # needs libnvrtc and nvrtc.h, no GPU
//
// # Semantics
//
// The kernels compute exactly what internal/reduce computes on the host:
// float16 and bfloat16 are widened to float32, combined, and rounded once to
// nearest even (with the conversions of internal/half written out in C, not
// the hardware's, whose NaN payloads differ); Min and Max are symmetric and
// NaN-propagating (min(+0,-0) = -0, max(+0,-0) = +0); integer Sum and Product
// wrap; integer Scale rounds to nearest even and saturates, NaN giving 0;
// integer Div truncates toward zero. The NVRTC options (Options) turn off
// fused multiply-add and flush-to-zero so float arithmetic is IEEE-exact. One
// difference remains: a NaN produced by Sum, Product or Scale is the GPU's
// canonical NaN, not the x86 payload (internal/reduce allows payloads to
// differ there too). Every rank still ends bit-identical, because each chunk
// is reduced by one rank and then copied.
//
// Without a GPU the semantics are checked by compiling kernels.cu as plain
// C++ with the host compiler (a shim turns __global__ functions into loops)
// and comparing every kernel with internal/reduce on edge-case and random
// inputs; the compile subpackage (build tag cuda) compiles the source with
// NVRTC for sm_70, sm_80 and sm_90, and the ptxas subpackage (build tag cuda)
// assembles the shipped kernels.ptx for sm_70 to sm_90 as the driver's JIT
// would.
package kernels

//go:generate go run -tags cuda ./internal/genptx -o kernels.ptx
