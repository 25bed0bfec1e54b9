package cuda

// The driver's loading, which needs no GPU: a host without a driver, NVIDIA's
// own link stub (which exports every driver function and answers each call
// with CUDA_ERROR_STUB_LIBRARY), NVIDIA's real driver library on this host
// without a GPU, and the fake driver of
// internal/testing/fakecuda built to lack a function, see no device, report
// an old CUDA version or fail cuInit.

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/internal/testing/fakecuda"
)

// nvidiaStub is where .ci/install puts libcuda.so from Debian's
// nvidia-cuda-dev (CUDA 11.8): NVIDIA's stub of the driver library.
const nvidiaStub = "/var/cache/gorovod/cuda-11.8/lib/libcuda.so"

func TestNewDeviceWithoutUsableDriver(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		library func(t *testing.T) string
		check   func(t *testing.T, err error)
	}{{
		name:    "no driver on the host",
		library: func(*testing.T) string { return "libgorovod-test-no-such-driver.so.1" },
		check: func(t *testing.T, err error) {
			var le *DriverLoadError
			if !errors.As(err, &le) || le.Reason == "" || le.Missing != "" {
				t.Fatalf("got %v (%T), want a DriverLoadError with the loader's reason", err, err)
			}
			for _, want := range []string{"libgorovod-test-no-such-driver.so.1", "NVIDIA driver", "CPU memory does not"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		},
	}, {
		name:    "driver lacking a function",
		library: func(t *testing.T) string { return fakecuda.Build(t, "-DFAKE_LACKS_IPC_OPEN") },
		check: func(t *testing.T, err error) {
			var le *DriverLoadError
			if !errors.As(err, &le) || le.Missing != "cuIpcOpenMemHandle_v2" {
				t.Fatalf("got %v, want a DriverLoadError naming cuIpcOpenMemHandle_v2", err)
			}
			if !strings.Contains(err.Error(), "CUDA 11.8") {
				t.Errorf("%q does not say which driver is needed", err)
			}
		},
	}, {
		name: "NVIDIA's link stub in place of the driver",
		library: func(t *testing.T) string {
			if _, err := os.Stat(nvidiaStub); err != nil {
				t.Skipf("%s (from .ci/install) is not here: %v", nvidiaStub, err)
			}
			return nvidiaStub
		},
		check: func(t *testing.T, err error) {
			// Loading resolved every symbol loadDriver needs in NVIDIA's own
			// library: the first call, cuInit, is what fails.
			var de *DriverError
			if !errors.As(err, &de) || de.Op != "cuInit" || !isResult(err, resultStubLibrary) {
				t.Fatalf("got %v, want cuInit's CUDA_ERROR_STUB_LIBRARY (every symbol resolved)", err)
			}
			if !strings.Contains(err.Error(), "link stub") {
				t.Errorf("%q does not say the stub was loaded", err)
			}
		},
	}, {
		name: "NVIDIA's driver (Debian's libcuda1 535) on a host without a GPU",
		library: func(t *testing.T) string {
			return fakecuda.NVIDIALibrary(t, "libcuda.so.1")
		},
		check: func(t *testing.T, err error) {
			// Every symbol loadDriver resolves is in NVIDIA's real library
			// (a missing one would be a DriverLoadError naming it), and its
			// cuInit answers as on a GPU host whose GPU is gone.
			var de *DriverError
			if !errors.As(err, &de) || de.Op != "cuInit" || !isResult(err, resultNoDevice) {
				t.Fatalf("got %v (%T), want cuInit's CUDA_ERROR_NO_DEVICE (every symbol resolved)", err, err)
			}
			for _, want := range []string{"CUDA_ERROR_NO_DEVICE (CUDA error 100)", "finds no GPU"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		},
	}, {
		name: "driver that sees no device",
		library: func(t *testing.T) string {
			return fakecuda.Build(t, "-DFAKE_DEVICES=0")
		},
		check: func(t *testing.T, err error) {
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), "CUDA sees 0") {
				t.Fatalf("got %v, want a UsageError saying CUDA sees no device", err)
			}
		},
	}, {
		name: "driver older than CUDA 11.8",
		library: func(t *testing.T) string {
			return fakecuda.Build(t, "-DFAKE_VERSION=11020")
		},
		check: func(t *testing.T, err error) {
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), "supports CUDA 11.2") {
				t.Fatalf("got %v, want a UsageError naming the driver's CUDA 11.2", err)
			}
		},
	}, {
		name: "cuInit failing, named by the driver",
		library: func(t *testing.T) string {
			return fakecuda.Build(t, "-DFAKE_INIT_RESULT=100")
		},
		check: func(t *testing.T, err error) {
			if !isResult(err, resultNoDevice) {
				t.Fatalf("got %v, want CUDA_ERROR_NO_DEVICE", err)
			}
			for _, want := range []string{"CUDA_ERROR_NO_DEVICE (CUDA error 100)", "finds no GPU"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultDeviceConfig()
			cfg.Driver = tt.library(t)
			d, err := NewDeviceConfig(ctx, 0, cfg)
			if err == nil {
				d.Close()
				t.Fatal("NewDeviceConfig succeeded")
			}
			tt.check(t, err)
		})
	}
}

func TestNewDeviceHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewDevice(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}
