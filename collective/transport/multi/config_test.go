package multi_test

import (
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/collective/transport/sctp"
	"github.com/gorovod/gorovod/collective/transport/shm"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// Every transport's configuration errors wrap its own ErrInvalidConfig and
// transport.ErrInvalidConfig; zero fields take the defaults.
func TestConfigErrors(t *testing.T) {
	secret := []byte("multi config test secret")
	for _, tc := range []struct {
		name string
		cfg  multi.Config
		pkg  error // nil: valid
	}{
		{"zero but the secret", multi.Config{Secret: secret}, nil},
		{"tcp, zero but the secret", multi.Config{Mode: multi.TCP, Secret: secret}, nil},
		{"unknown mode", multi.Config{Mode: "carrier-pigeon", Secret: secret}, multi.ErrInvalidConfig},
		{"unknown remote", multi.Config{Remote: multi.SHM, Secret: secret}, multi.ErrInvalidConfig},
		{"tcp without a secret", multi.Config{Mode: multi.TCP}, tcp.ErrInvalidConfig},
		{"sctp without a secret", multi.Config{Mode: multi.SCTP}, sctp.ErrInvalidConfig},
		{"sctp, bad MTU", multi.Config{Mode: multi.SCTP, Secret: secret, SCTP: sctp.Config{MTU: 100}}, sctp.ErrInvalidConfig},
		{"sctp, plain frames", multi.Config{Mode: multi.SCTP, Secret: secret, Security: transport.SecurityPlain}, nil},
		{"sctp, encrypted frames", multi.Config{Mode: multi.SCTP, Secret: secret, Security: transport.SecurityEncrypted}, nil},
		{"auto over sctp, authenticated frames", multi.Config{Remote: multi.SCTP, Secret: secret, Security: transport.SecurityAuthenticated}, nil},
		{"sctp, unknown security", multi.Config{Mode: multi.SCTP, Secret: secret, SCTP: sctp.Config{Security: 7}}, sctp.ErrInvalidConfig},
		{"tcp, encrypted frames", multi.Config{Mode: multi.TCP, Secret: secret, Security: transport.SecurityEncrypted}, nil},
		{"tcp, unknown security", multi.Config{Mode: multi.TCP, Secret: secret, TCP: tcp.Config{Security: 9}}, tcp.ErrInvalidConfig},
		{"shm, bad ring", multi.Config{Mode: multi.SHM, Secret: secret, SHM: shm.Config{RingBytes: 3}}, shm.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := multi.Listen(tc.cfg)
			if tc.pkg == nil {
				if err != nil {
					t.Fatal(err)
				}
				tr.Close()
				return
			}
			if err == nil {
				tr.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, tc.pkg) || !errors.Is(err, transport.ErrInvalidConfig) {
				t.Fatalf("error %q does not wrap %q and %q", err, tc.pkg, transport.ErrInvalidConfig)
			}
		})
	}
}
