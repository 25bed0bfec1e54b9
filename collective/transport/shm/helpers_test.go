//go:build linux

package shm_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

var testSecret = []byte("test secret, not for production")

// singleCopyOn is the SingleCopyBytes of tests about the single-copy path: low
// enough that their 1 MiB frames take it (the default, 2 MiB, is not).
const singleCopyOn = 128 << 10

func testConfig() shm.Config {
	cfg := shm.DefaultConfig()
	cfg.Secret = testSecret
	cfg.HandshakeTimeout = 2 * time.Second
	cfg.IOTimeout = 20 * time.Second
	// Small rings keep the tests' /dev/shm use low (Docker's default is 64 MiB).
	cfg.RingBytes = 1 << 20
	// GOROVOD_SHM_DEBUG=1 go test -v shows the transports' own log.
	cfg.Logger = conformance.DebugLogger("GOROVOD_SHM_DEBUG")
	return cfg
}

func listen(t testing.TB, cfg shm.Config) *shm.Transport {
	t.Helper()
	return conformance.Listen(t, shm.Listen, cfg)
}

// shmFiles lists the files in dir that this process created (the creator's
// pid is part of every name). Other processes on the machine, such as other
// packages' tests running at the same time, may have setups in flight.
func shmFiles(dir string) []string {
	return filesOf(dir, os.Getpid())
}

// filesOf lists the files in dir created by process pid.
func filesOf(dir string, pid int) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		// gorovod-shm-<job>-<epoch>-<lo>-<hi>-<pid>-...
		f := strings.Split(e.Name(), "-")
		if strings.HasPrefix(e.Name(), "gorovod-shm-") && len(f) > 6 && f[6] == strconv.Itoa(pid) {
			names = append(names, e.Name())
		}
	}
	return names
}

// checkShmEmpty fails the test if, once its cleanups have run, files this
// process created are left in /dev/shm. Register it first so it runs last.
func checkShmEmpty(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		if left := shmFiles("/dev/shm"); len(left) > 0 {
			t.Errorf("files left in /dev/shm: %v", left)
		}
	})
}
