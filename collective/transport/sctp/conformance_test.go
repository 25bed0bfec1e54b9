package sctp_test

import (
	"log/slog"
	"os"
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
	if os.Getenv("GOROVOD_SCTP_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

func listen(t testing.TB, cfg sctp.Config) *sctp.Transport {
	t.Helper()
	tr, err := sctp.Listen(cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// TestConformance runs the suite every transport passes.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Factory{
		New: func(t testing.TB, o conformance.Options) transport.Transport {
			cfg := testConfig()
			cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
			return listen(t, cfg)
		},
		Packages: []string{"collective/transport/sctp.", "collective/transport/internal/mesh.", "github.com/pion/"},
	})
}
