package main

import (
	"os"
	"testing"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
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

// TestHeaderIsCPlusPlus checks that gorovod.h compiles as C++ too.
func TestHeaderIsCPlusPlus(t *testing.T) { headerIsCPlusPlus(t, "gorovod.h") }
