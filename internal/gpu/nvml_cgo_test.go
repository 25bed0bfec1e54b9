//go:build cgo

package gpu

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/internal/testing/fakecuda"
)

// TestMissingLibrary loads a library that does not exist: the path every
// machine without a driver takes, whatever is installed here.
func TestMissingLibrary(t *testing.T) {
	_, err := openNVML("/nonexistent/libnvidia-ml.so.1")
	if !IsNoGPUs(err) {
		t.Fatalf("got %v, want a *NoGPUsError", err)
	}
	if !strings.Contains(err.Error(), "no NVML: /nonexistent/libnvidia-ml.so.1: cannot open") {
		t.Errorf("reason %q does not say why NVML is missing", err)
	}
}

// buildFake compiles testdata/fakenvml.c into a shared library.
func buildFake(t *testing.T, defines ...string) string {
	t.Helper()
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	out := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	args := append([]string{"-shared", "-fPIC", "-o", out}, defines...)
	args = append(args, filepath.Join("testdata", "fakenvml.c"))
	if b, err := exec.Command(strings.TrimSpace(string(cc)), args...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake NVML: %v\n%s", err, b)
	}
	return out
}

// TestFakeLibrary discovers through a stand-in NVML loaded with dlopen: the
// symbols, signatures and struct layouts of the shim.
func TestFakeLibrary(t *testing.T) {
	lib, err := openNVML(buildFake(t))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	if inv.DriverVersion != "550.54.15" || inv.CUDADriverVersion != 12040 || len(inv.GPUs) != 2 {
		t.Fatalf("inventory %+v", inv)
	}
	g := inv.GPUs[1]
	if g.UUID != "GPU-fake-1" || g.Name != "Fake H100" || g.MemoryBytes != 80<<30 || g.PCIBusID != "0000:1b:00.0" ||
		g.CCMajor != 9 || g.CCMinor != 0 || g.NVLinks != 2 {
		t.Fatalf("GPU 1: %+v", g)
	}
	if l := g.Links["GPU-fake-0"]; l != (Link{Level: LevelNVLink, NVLinks: 2}) {
		t.Errorf("GPU 1 to GPU 0: %+v", l)
	}
	if s := lib.ErrorString(nvmlInvalidArgument); s != "Invalid Argument" {
		t.Errorf("ErrorString: %q", s)
	}
	// Shut down as often as initialized: the fake's count is back at 0.
	if _, r := lib.DeviceCount(); r == nvmlSuccess {
		t.Error("NVML left initialized after discover")
	}
}

// TestOldLibrary: a library without a function discovery cannot do without
// is no NVML, not a crash.
func TestOldLibrary(t *testing.T) {
	_, err := openNVML(buildFake(t, "-DFAKE_OLD"))
	if !IsNoGPUs(err) || !strings.Contains(err.Error(), "no NVML: the library lacks") {
		t.Fatalf("got %v, want a *NoGPUsError saying what the library lacks", err)
	}
}

// TestNVIDIALibraryWithoutGPU loads NVIDIA's own libnvidia-ml (Debian's
// libnvidia-ml1, driver 535) on this host, which has no GPU and no NVIDIA
// kernel module: every function the shim resolves is in the real library
// (openNVML fails naming any that is not), and discovery is "no GPUs" with
// the reason a user of such a host needs, not an error.
func TestNVIDIALibraryWithoutGPU(t *testing.T) {
	lib, err := openNVML(fakecuda.NVIDIALibrary(t, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatalf("opening NVIDIA's library: %v", err)
	}
	_, err = discover(context.Background(), lib)
	if !IsNoGPUs(err) || !strings.Contains(err.Error(), "kernel driver is not loaded") {
		t.Fatalf("got %v, want a *NoGPUsError saying the kernel driver is not loaded", err)
	}
}
