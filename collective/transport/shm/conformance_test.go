//go:build linux

package shm_test

import (
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestConformance runs the suite every transport passes, with single copy on
// (from 128 KiB: large frames are read out of the sender's memory) and off
// (every frame goes through the ring).
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name       string
		singleCopy int
	}{
		{"single copy", singleCopyOn},
		{"ring only", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkShmEmpty(t)
			conformance.Run(t, conformance.Factory{
				New: func(t testing.TB, o conformance.Options) transport.Transport {
					cfg := testConfig()
					cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
					cfg.SpinTime = o.SpinTime
					cfg.SingleCopyBytes = tc.singleCopy
					return listen(t, cfg)
				},
				Packages:   []string{"collective/transport/shm.", "collective/transport/tcp.", "collective/transport/internal/mesh."},
				ZeroAllocs: true,
			})
		})
	}
}
