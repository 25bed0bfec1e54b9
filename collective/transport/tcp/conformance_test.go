package tcp_test

import (
	"fmt"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestConformance runs the suite every transport passes, with each
// data-plane setting and with links of 1, 2 and 4 lanes: the sealed paths
// and the striped ones must keep every promise the plain one-lane path
// does.
func TestConformance(t *testing.T) {
	for _, lanes := range []int{1, 2, 4} {
		for _, sec := range []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated, transport.SecurityEncrypted} {
			t.Run(fmt.Sprintf("lanes=%d/%v", lanes, sec), func(t *testing.T) {
				conformance.Run(t, conformance.Factory{
					New: func(t testing.TB, o conformance.Options) transport.Transport {
						cfg := testConfig()
						cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
						cfg.SpinTime = o.SpinTime
						cfg.Security = sec
						cfg.Lanes = lanes
						return listen(t, cfg)
					},
					Packages:   tcpPackages,
					ZeroAllocs: true,
				})
			})
		}
	}
}
