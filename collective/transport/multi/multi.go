package multi

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/sctp"
	"github.com/gorovod/gorovod/collective/transport/shm"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// Mode names how pairs of ranks are connected.
type Mode string

const (
	// Auto: shared memory between ranks on one host, Remote between the others.
	Auto Mode = "auto"
	// TCP for every pair.
	TCP Mode = "tcp"
	// SHM: shared memory for every pair; a pair on two hosts fails Connect.
	SHM Mode = "shm"
	// SCTP over UDP for every pair.
	SCTP Mode = "sctp"
)

// Modes lists the valid modes, for usage messages.
func Modes() []Mode { return []Mode{Auto, TCP, SHM, SCTP} }

// ParseMode parses a mode name (case-insensitive; "" is Auto).
func ParseMode(s string) (Mode, error) {
	m := Mode(strings.ToLower(strings.TrimSpace(s)))
	if m == "" {
		return Auto, nil
	}
	for _, v := range Modes() {
		if m == v {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown transport %q (want one of %v)", s, Modes())
}

// Config configures the transport Listen builds. A zero field means its
// default (DefaultConfig). The common fields (addresses, secret, timeouts,
// logger) are the only ones that set these for the transports built: the
// per-transport configurations tune the rest, and their own copies of the
// common fields are ignored.
type Config struct {
	Mode Mode
	// Remote is the network transport of Auto mode: TCP (default) or SCTP.
	Remote Mode

	ListenAddr       string        // default 127.0.0.1:0
	AdvertiseAddr    string        // default: the listener's address
	Secret           []byte        // required
	HandshakeTimeout time.Duration // default transport.DefaultHandshakeTimeout
	IOTimeout        time.Duration // default transport.DefaultIOTimeout
	Logger           *slog.Logger  // default: discard
	// Security is how frames between hosts are protected
	// (transport.Security); when set it overrides TCP.Security and
	// SCTP.Security. Shared memory between processes of one host is not
	// affected: it stays inside the trust boundary of the user who runs
	// them.
	Security transport.Security

	TCP  tcp.Config
	SHM  shm.Config
	SCTP sctp.Config
}

// DefaultConfig returns Auto mode over TCP with every transport's defaults;
// Secret must still be set.
func DefaultConfig() Config {
	return Config{
		Mode:             Auto,
		Remote:           TCP,
		HandshakeTimeout: transport.DefaultHandshakeTimeout,
		IOTimeout:        transport.DefaultIOTimeout,
		TCP:              tcp.DefaultConfig(),
		SHM:              shm.DefaultConfig(),
		SCTP:             sctp.DefaultConfig(),
	}
}

// ErrInvalidConfig is wrapped by every error about a Config that cannot work;
// it wraps transport.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("multi: %w", transport.ErrInvalidConfig)

// Listen builds and starts the transport cfg describes.
func Listen(cfg Config) (transport.Transport, error) {
	if cfg.Mode == "" {
		cfg.Mode = Auto
	}
	if cfg.Remote == "" {
		cfg.Remote = TCP
	}
	switch cfg.Mode {
	case TCP:
		return listenTCP(&cfg)
	case SCTP:
		return listenSCTP(&cfg)
	case SHM, Auto:
		var boot transport.Transport
		var err error
		switch {
		case cfg.Mode == SHM || cfg.Remote == TCP:
			boot, err = listenTCP(&cfg)
		case cfg.Remote == SCTP:
			boot, err = listenSCTP(&cfg)
		default:
			return nil, fmt.Errorf("%w: Remote %q must be tcp or sctp", ErrInvalidConfig, cfg.Remote)
		}
		if err != nil {
			return nil, err
		}
		sc := cfg.SHM
		sc.Fallback = cfg.Mode == Auto
		sc.ListenAddr, sc.AdvertiseAddr, sc.Secret = "", "", nil // New takes them from boot
		sc.HandshakeTimeout, sc.IOTimeout, sc.Logger = cfg.HandshakeTimeout, cfg.IOTimeout, cfg.Logger
		t, err := shm.New(boot, sc)
		if err != nil {
			boot.Close()
			return nil, err
		}
		return t, nil
	}
	return nil, fmt.Errorf("%w: unknown mode %q", ErrInvalidConfig, cfg.Mode)
}

func listenTCP(cfg *Config) (transport.Transport, error) {
	c := cfg.TCP
	c.ListenAddr, c.AdvertiseAddr, c.Secret = cfg.ListenAddr, cfg.AdvertiseAddr, cfg.Secret
	c.HandshakeTimeout, c.IOTimeout, c.Logger = cfg.HandshakeTimeout, cfg.IOTimeout, cfg.Logger
	if cfg.Security != transport.SecurityDefault {
		c.Security = cfg.Security
	}
	t, err := tcp.Listen(c)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return t, nil
}

func listenSCTP(cfg *Config) (transport.Transport, error) {
	c := cfg.SCTP
	c.ListenAddr, c.AdvertiseAddr, c.Secret = cfg.ListenAddr, cfg.AdvertiseAddr, cfg.Secret
	c.HandshakeTimeout, c.IOTimeout, c.Logger = cfg.HandshakeTimeout, cfg.IOTimeout, cfg.Logger
	if cfg.Security != transport.SecurityDefault {
		c.Security = cfg.Security
	}
	t, err := sctp.Listen(c)
	if err != nil {
		return nil, err
	}
	return t, nil
}
