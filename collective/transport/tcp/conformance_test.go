package tcp_test

import (
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestConformance runs the suite every transport passes.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Factory{
		New: func(t testing.TB, o conformance.Options) transport.Transport {
			cfg := testConfig()
			cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
			cfg.SpinTime = o.SpinTime
			return listen(t, cfg)
		},
		Packages:   tcpPackages,
		ZeroAllocs: true,
	})
}
