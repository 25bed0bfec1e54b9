package sctp_test

import (
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/sctp"
)

var testSecret = []byte("test secret, not for production")

func testConfig() sctp.Config {
	cfg := sctp.DefaultConfig()
	cfg.Secret = testSecret
	cfg.HandshakeTimeout = 2 * time.Second
	cfg.IOTimeout = 20 * time.Second
	// GOROVOD_SCTP_DEBUG=1 go test -v shows the transports' own log.
	cfg.Logger = conformance.DebugLogger("GOROVOD_SCTP_DEBUG")
	return cfg
}

func listen(t testing.TB, cfg sctp.Config) *sctp.Transport {
	t.Helper()
	return conformance.Listen(t, sctp.Listen, cfg)
}

// TestConformance runs the suite every transport passes, with each
// data-plane setting.
func TestConformance(t *testing.T) {
	for _, sec := range []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			conformance.Run(t, conformance.Factory{
				New: func(t testing.TB, o conformance.Options) transport.Transport {
					cfg := testConfig()
					cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
					cfg.Security = sec
					return listen(t, cfg)
				},
				Packages: []string{"collective/transport/sctp.", "collective/transport/internal/mesh.", "github.com/pion/"},
			})
		})
	}
}
