package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
	"github.com/gorovod/gorovod/internal/testing/fakecuda"
)

func TestMain(m *testing.M) {
	code := m.Run()
	buildtest.Cleanup()
	os.Exit(code)
}

// TestCProgram compiles testdata/abi_test.c with cc against gorovod.h and
// libgorovod.so, and runs it alone (a world of one) and as 3 workers under
// `gorovod run`: every collective, the handles, the errors, a forked child.
func TestCProgram(t *testing.T) {
	cProgram{source: "abi_test.c", libs: []string{"-lpthread"}, okLine: "abi test ok", np: 3}.run(t)
}

// TestCUDAStandIn compiles testdata/cuda_standin_test.c and runs it
// against a library built with the tag gorovod_cudastandin (cudastandin.go:
// "device memory" that is host memory behind collective.DeviceMemory, events
// that are host flags), alone and as 3 workers: every collective through the
// C ABI's device path, a call that waits for its event before it reads its
// buffers, and the refusals. A CUDA build takes the same path to
// collective/cuda, which needs a GPU (bindings/python/tests/gpu_cuda_tensors.py).
func TestCUDAStandIn(t *testing.T) {
	cProgram{source: "cuda_standin_test.c", okLine: "cuda stand-in test ok", np: 3, tags: "gorovod_cudastandin"}.run(t)
}

// TestCUDAFakeDriver compiles testdata/cuda_fakedriver_test.c and runs it
// against the library every build makes, with the fake CUDA driver of
// internal/testing/fakecuda first on LD_LIBRARY_PATH as libcuda.so.1, alone
// and as 3 workers: the library loads that driver by name and runs the
// collectives on its device memory through cuda.go and collective/cuda (the
// staged path between processes), and refuses a host address as device
// memory.
func TestCUDAFakeDriver(t *testing.T) {
	cProgram{source: "cuda_fakedriver_test.c", libs: []string{"-ldl"}, okLine: "cuda fake driver test ok", np: 3,
		env: []string{fakecuda.LoaderPathFirst(filepath.Dir(fakecuda.Build(t)))}}.run(t)
}

// TestCUDANVIDIADriverWithoutGPU compiles testdata/cuda_nvidia_nogpu_test.c
// and runs it against the library every build makes, with NVIDIA's own
// libcuda.so.1 (from .ci/install) first on LD_LIBRARY_PATH, alone and as 3
// workers: on this host without a GPU, device memory fails with cuInit's
// CUDA_ERROR_NO_DEVICE and the world goes on.
func TestCUDANVIDIADriverWithoutGPU(t *testing.T) {
	cProgram{source: "cuda_nvidia_nogpu_test.c", libs: []string{"-ldl"}, okLine: "cuda nvidia no-gpu test ok", np: 3,
		env: []string{fakecuda.LoaderPathFirst(filepath.Dir(fakecuda.NVIDIALibrary(t, "libcuda.so.1")))}}.run(t)
}

// TestHeaderIsCPlusPlus checks that gorovod.h compiles as C++ too.
func TestHeaderIsCPlusPlus(t *testing.T) { headerIsCPlusPlus(t, "gorovod.h") }
