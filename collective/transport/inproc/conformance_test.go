package inproc_test

import (
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// TestConformance runs the suite every transport passes.
func TestConformance(t *testing.T) {
	network := inproc.NewNetwork()
	conformance.Run(t, conformance.Factory{
		New: func(t testing.TB, o conformance.Options) transport.Transport {
			tr, err := network.Listen(inproc.Config{Secret: o.Secret, IOTimeout: o.IOTimeout, HandshakeTimeout: o.HandshakeTimeout})
			if err != nil {
				t.Fatal(err)
			}
			return tr
		},
		Packages:   []string{"collective/transport/inproc.", "collective/transport/internal/mesh."},
		ZeroAllocs: true,
	})
}
