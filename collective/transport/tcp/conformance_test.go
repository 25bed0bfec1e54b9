package tcp_test

import (
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestConformance runs the suite every transport passes, with each
// data-plane setting: the sealed paths must keep every promise the plain
// one does.
func TestConformance(t *testing.T) {
	for _, sec := range []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			conformance.Run(t, conformance.Factory{
				New: func(t testing.TB, o conformance.Options) transport.Transport {
					cfg := testConfig()
					cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
					cfg.SpinTime = o.SpinTime
					cfg.Security = sec
					return listen(t, cfg)
				},
				Packages:   tcpPackages,
				ZeroAllocs: true,
			})
		})
	}
}
