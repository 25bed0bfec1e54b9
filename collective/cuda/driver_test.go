package cuda

// The driver's loading, which needs no GPU: a host without a driver, NVIDIA's
// own link stub (which exports every driver function and answers each call
// with CUDA_ERROR_STUB_LIBRARY), and drivers built here with gcc that lack a
// function or report no device or an old CUDA version.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// nvidiaStub is where .ci/install puts libcuda.so from Debian's
// nvidia-cuda-dev (CUDA 11.8): NVIDIA's stub of the driver library.
const nvidiaStub = "/var/cache/gorovod/cuda-11.8/lib/libcuda.so"

// fakeDriver compiles a shared library that exports every function
// loadDriver resolves but skip; each returns 0 (CUDA_SUCCESS) unless body
// gives its C body (parameters are named a, b, c, ...).
func fakeDriver(t *testing.T, skip string, body map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("no gcc to build the fake driver with: %v", err)
	}
	var src strings.Builder
	src.WriteString("#include <stddef.h>\n")
	for _, name := range driverSymbols() {
		if name == skip {
			continue
		}
		b, ok := body[name]
		if !ok {
			b = "return 0;"
		}
		fmt.Fprintf(&src, "int %s(void *a, void *b, void *c, void *d) { %s }\n", name, b)
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(c, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "libcuda-fake.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return so
}

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
		library: func(t *testing.T) string { return fakeDriver(t, "cuIpcOpenMemHandle_v2", nil) },
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
			// Loading resolved every symbol of driverSymbols in NVIDIA's own
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
		name: "driver that sees no device",
		library: func(t *testing.T) string {
			return fakeDriver(t, "", map[string]string{
				"cuDriverGetVersion": "*(int *)a = 12080; return 0;",
				"cuDeviceGetCount":   "*(int *)a = 0; return 0;",
			})
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
			return fakeDriver(t, "", map[string]string{"cuDriverGetVersion": "*(int *)a = 11020; return 0;"})
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
			return fakeDriver(t, "", map[string]string{
				"cuInit":         "return 100;",
				"cuGetErrorName": `*(const char **)b = "CUDA_ERROR_NO_DEVICE"; return 0;`,
			})
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
