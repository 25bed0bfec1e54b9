package fakecuda

import (
	"os"
	"path/filepath"
	"testing"
)

// NVIDIADriverDir is where .ci/install puts NVIDIA's own driver libraries,
// taken from Debian's non-free packages libcuda1 and libnvidia-ml1 (driver
// 535) and named as the dynamic loader looks for them: libcuda.so.1 and
// libnvidia-ml.so.1. They are off the loader's path, so the rest of the
// tests still see a host without a driver; a test that wants them names the
// file or puts this directory on LD_LIBRARY_PATH.
const NVIDIADriverDir = "/var/cache/gorovod/nvidia-driver"

// NVIDIALibrary returns the path of NVIDIA's library name
// ("libcuda.so.1" or "libnvidia-ml.so.1") in NVIDIADriverDir, and skips t
// where .ci/install has not put it there.
func NVIDIALibrary(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(NVIDIADriverDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("NVIDIA's %s (from .ci/install) is not here: %v", name, err)
	}
	return p
}

// LoaderPathFirst returns the environment entry that puts dir first on
// LD_LIBRARY_PATH, before what this process has there: how a test makes a
// child process load a driver of dir by its name (libcuda.so.1).
func LoaderPathFirst(dir string) string {
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		dir += ":" + old
	}
	return "LD_LIBRARY_PATH=" + dir
}
