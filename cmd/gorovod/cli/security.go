package cli

import (
	"flag"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// securityOptions are the --security and --encrypt flags of gorovod run and
// gorovod bench: how the collective transport protects frames between
// hosts (transport.Security).
type securityOptions struct {
	name    string
	encrypt bool
}

func securityFlags(fs *flag.FlagSet) *securityOptions {
	o := &securityOptions{}
	fs.StringVar(&o.name, "security", "default", "how the network transport (TCP, SCTP) protects frames: plain, authenticated or encrypted (default: authenticated between hosts, plain between workers of one host)")
	fs.BoolVar(&o.encrypt, "encrypt", false, "encrypt frames between hosts (AES-GCM; --security encrypted)")
	return o
}

// value is the setting the flags ask for; SecurityDefault when neither was
// given.
func (o *securityOptions) value() (transport.Security, error) {
	s, err := transport.ParseSecurity(o.name)
	if err != nil {
		return 0, fmt.Errorf("--security: %w", err)
	}
	if o.encrypt {
		if s != transport.SecurityDefault && s != transport.SecurityEncrypted {
			return 0, fmt.Errorf("--encrypt contradicts --security %s", o.name)
		}
		s = transport.SecurityEncrypted
	}
	return s, nil
}

// lanesFlag registers --lanes of gorovod run and gorovod bench: how many TCP
// connections each link between two workers has (tcp.Config.Lanes).
func lanesFlag(fs *flag.FlagSet) *int {
	return fs.Int("lanes", 0, fmt.Sprintf("TCP connections per link between two workers, 1 to %d; large frames are striped over them (0: automatic, 1 within a host; between hosts 4, of which each link uses as many as raise the rate it measures)", tcp.MaxLanes))
}

// checkLanes validates --lanes.
func checkLanes(n int) error {
	if n < 0 || n > tcp.MaxLanes {
		return fmt.Errorf("--lanes %d outside 0 to %d", n, tcp.MaxLanes)
	}
	return nil
}
