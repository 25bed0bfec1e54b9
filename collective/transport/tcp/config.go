package tcp

import (
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
	"github.com/gorovod/gorovod/collective/transport/internal/mesh"
)

// Config configures a Transport. Start from DefaultConfig; zero fields are
// replaced by the defaults.
type Config struct {
	// ListenAddr is where to listen, "host:port". Default "127.0.0.1:0".
	ListenAddr string
	// AdvertiseAddr is the address peers dial, when it differs from the
	// listener's (NAT, a wildcard listen address). A host without a port (or
	// with port 0) takes the listener's port. Default: the listener's address.
	AdvertiseAddr string
	// Secret is the job secret both ends must share. Required.
	Secret []byte
	// HandshakeTimeout bounds each handshake message exchange. Default 5s.
	HandshakeTimeout time.Duration
	// PreAuthTimeout bounds how long an accepted connection may take to
	// prove it knows the secret (its hello and its proof), so strangers
	// that connect and wait free their handshake slots quickly. A real
	// peer sends both within a round trip. Default 1s, at most
	// HandshakeTimeout.
	PreAuthTimeout time.Duration
	// HandshakesPerSource bounds the handshakes in progress from one
	// source address, so one host's flood of connections cannot take all
	// 256 slots from the ranks of the job. Default 64 (room for 16 ranks
	// of one host each handshaking all 4 lanes of a link at once).
	HandshakesPerSource int
	// Security is how frames are protected once a link is connected
	// (transport.Security): plain, authenticated (AES-GCM tags) or
	// encrypted (AES-GCM). Default (SecurityDefault): authenticated on
	// links to other hosts, plain on links between ranks of this host (the
	// two ends of the connection have the same address). Every rank must
	// use the same; the handshake refuses a peer with another setting. See
	// package framesec for the wire layout and docs/multihost.md for what
	// each costs.
	Security transport.Security
	// IOTimeout is how long a peer may stay silent on a blocked Send or Recv
	// before the call fails with transport.ErrPeerTimeout. Default 30s.
	IOTimeout time.Duration
	// DialRetry is the first retry interval while a peer is not listening yet or
	// not yet connecting the world; it doubles up to 200ms. Default 5ms.
	DialRetry time.Duration
	// ReadBufferSize is the receive buffer of each link (at least 4 KiB):
	// headers and payloads shorter than it are read through it, longer
	// payloads straight into the caller's buffer. Default 16 KiB.
	ReadBufferSize int
	// SocketBuffer sets SO_SNDBUF and SO_RCVBUF of every connection, before
	// connecting (so the TCP window scale fits them); negative: the kernel's
	// autotuning. Default (0): 4 MiB on the links between ranks of this host,
	// set once a world is connected, when this host's ranks do not outnumber
	// its CPUs and the kernel grants that much (net.core.rmem_max and
	// wmem_max); autotuning on every other link.
	//
	// Why a fixed size on one host: autotuning starts the receive buffer at
	// net.ipv4.tcp_rmem's default (128 KiB) and grows it only as the
	// application reads, over hundreds of large transfers. Until then a ring
	// step's chunks (2 MiB in flight for a 4 MiB allreduce of two ranks) do
	// not fit the receive window: the sender's data waits in its socket and
	// goes out as the receiver's acknowledgements arrive, which on loopback
	// the receiver's core transmits, so segments of one stream leave from
	// two cores, arrive out of order and are retransmitted spuriously (nstat,
	// 35 4 MiB allreduces of two ranks: 2-14 fast retransmissions and
	// 1177-1675 segments queued behind a busy socket per run with
	// autotuning, 0-3 and 124-678 with 4 MiB; see docs/performance.md).
	// Why not when ranks share CPUs: a rank's peer on the same core is not
	// running while it sends, so a large window lets it queue megabytes that
	// leave the cache before they are read (4 ranks on 2 cores, 64 MiB: 7-9 %
	// slower than autotuning). Why not between hosts: between this
	// machine's network-namespace hosts no gain showed through the noise,
	// and a fixed window would cap a link whose bandwidth-delay product
	// autotuning would outgrow. A capped buffer
	// would be worse than autotuning, hence the check. Memory is taken only
	// as data is queued; the size is a limit.
	SocketBuffer int
	// SpinTime is how long a call that finds nothing to read (or no room to
	// write) polls the socket before it parks in the network poller; the bound
	// adapts per link direction (package spin: it halves while waits outlast
	// it, so long or silent waits cost almost no CPU). Polling keeps a rank
	// that waits a few microseconds for its peer on its core: waking a
	// parked thread, and on a VM an idle virtual CPU, costs tens of
	// microseconds. Default 100µs; a negative value disables polling.
	SpinTime time.Duration
	// Lanes is how many TCP connections each link has (1 to 16): a data
	// frame of at least 64 KiB is cut into contiguous stripes sent over
	// all of them at once, each lane served by its own goroutine, so one
	// link is not bound by what one connection (one core's worth of
	// kernel work, one congestion window) moves. Default (0): automatic,
	// 1 on links between ranks of this host; on links to other hosts 4
	// connections, of which each direction's sender uses as many as
	// raise the rate it measures on its first large frames (1, 2, then 4;
	// see autolanes.go). Every rank must use the same; the handshake
	// refuses a peer with another setting. See docs/transports.md.
	Lanes int
	// Logger receives connection diagnostics. Default: discard.
	Logger *slog.Logger
}

const (
	defaultListenAddr       = "127.0.0.1:0"
	defaultHandshakeTimeout = transport.DefaultHandshakeTimeout
	defaultPreAuthTimeout   = time.Second
	defaultIOTimeout        = transport.DefaultIOTimeout
	defaultDialRetry        = 5 * time.Millisecond
	defaultReadBufferSize   = 16384
	defaultSpinTime         = 100 * time.Microsecond
	defaultSocketBuffer     = 4 << 20
	minReadBufferSize       = 4 << 10
)

// MaxLanes bounds Config.Lanes.
const MaxLanes = handshake.MaxLanes

// ErrInvalidConfig is wrapped by every error about a Config that cannot work;
// it wraps transport.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("tcp: %w", transport.ErrInvalidConfig)

// DefaultConfig returns the defaults; Secret must still be set.
func DefaultConfig() Config {
	return Config{
		ListenAddr:          defaultListenAddr,
		HandshakeTimeout:    defaultHandshakeTimeout,
		PreAuthTimeout:      defaultPreAuthTimeout,
		HandshakesPerSource: mesh.DefaultHandshakesPerSource,
		IOTimeout:           defaultIOTimeout,
		DialRetry:           defaultDialRetry,
		ReadBufferSize:      defaultReadBufferSize,
		SpinTime:            defaultSpinTime,
		Logger:              slog.New(slog.DiscardHandler),
	}
}

// withDefaults fills zero fields and validates the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	secret, err := linkutil.RequireSecret(c.Secret, ErrInvalidConfig)
	if err != nil {
		return c, err
	}
	c.Secret = secret
	c.ListenAddr = linkutil.OrDefault(c.ListenAddr, d.ListenAddr)
	c.HandshakeTimeout = linkutil.Positive(c.HandshakeTimeout, d.HandshakeTimeout)
	c.PreAuthTimeout = min(linkutil.Positive(c.PreAuthTimeout, d.PreAuthTimeout), c.HandshakeTimeout)
	c.HandshakesPerSource = linkutil.Positive(c.HandshakesPerSource, d.HandshakesPerSource)
	if !c.Security.Valid() {
		return c, fmt.Errorf("%w: unknown Security %v", ErrInvalidConfig, c.Security)
	}
	c.IOTimeout = linkutil.Positive(c.IOTimeout, d.IOTimeout)
	c.DialRetry = linkutil.Positive(c.DialRetry, d.DialRetry)
	c.ReadBufferSize = max(linkutil.Positive(c.ReadBufferSize, d.ReadBufferSize), minReadBufferSize)
	if c.Lanes < 0 || c.Lanes > MaxLanes {
		return c, fmt.Errorf("%w: Lanes %d outside [0, %d]", ErrInvalidConfig, c.Lanes, MaxLanes)
	}
	c.SpinTime = linkutil.SpinTime(c.SpinTime, d.SpinTime)
	c.Logger = linkutil.OrDefault(c.Logger, d.Logger)
	return c, nil
}

// worldSocketBuffer is the buffer size Connect sets on a world's links to
// ranks of this host, 0 for none: with SocketBuffer left at its default
// (configured 0),
// defaultSocketBuffer unless this host's ranks outnumber its CPUs or the
// kernel would cap it (granted false). An explicit size was set before
// connecting; a negative one asks for autotuning.
func worldSocketBuffer(configured int, oversubscribed, granted bool) int {
	if configured != 0 || oversubscribed || !granted {
		return 0
	}
	return defaultSocketBuffer
}

// kernelGrants reports whether the kernel gives a socket SO_RCVBUF and
// SO_SNDBUF of n bytes: it caps both silently at net.core.rmem_max and
// wmem_max (212992 bytes unless raised), and Linux reports twice what it
// grants, for its bookkeeping. It asks on a socket of its own, which it
// closes: the buffer lock a setsockopt leaves cannot be undone.
func kernelGrants(n int) bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return false
		}
	}
	defer unix.Close(fd)
	if setSocketBuffers(fd, n) != nil {
		return false
	}
	for _, opt := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF} {
		if got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt); err != nil || got < n {
			return false
		}
	}
	return true
}

// socketControl sizes a socket's buffers before it connects or listens, when
// SocketBuffer is set.
func (c Config) socketControl(network, address string, rc syscall.RawConn) error {
	if c.SocketBuffer <= 0 {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setSocketBuffers(int(fd), c.SocketBuffer) }); err != nil {
		return err
	}
	return serr
}

// setSocketBuffers sets a socket's SO_RCVBUF and SO_SNDBUF to n bytes.
func setSocketBuffers(fd, n int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n); err != nil {
		return err
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
}
