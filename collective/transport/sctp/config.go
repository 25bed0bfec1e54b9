package sctp

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
)

// Config configures a Transport. Start from DefaultConfig; zero fields are
// replaced by the defaults.
type Config struct {
	// ListenAddr is the UDP address to listen on, "host:port". Default "127.0.0.1:0".
	ListenAddr string
	// AdvertiseAddr is the address peers send to, when it differs from the
	// listener's. A host without a port (or with port 0) takes the
	// listener's port. Default: the listener's address.
	AdvertiseAddr string
	// Secret is the job secret both ends must share. Required.
	Secret []byte
	// HandshakeTimeout bounds connecting one association and each handshake
	// message exchange. Default 5s.
	HandshakeTimeout time.Duration
	// IOTimeout is how long a peer may stay silent on a blocked Send or Recv
	// before the call fails with transport.ErrPeerTimeout. Default 30s.
	IOTimeout time.Duration
	// DialRetry is the first retry interval while a peer is not listening yet or
	// not yet connecting the world; it doubles up to 200ms. Default 5ms.
	DialRetry time.Duration
	// MTU is the SCTP packet size, at most 8192 (what pion receives). Default 8192.
	MTU int
	// ReceiveBuffer is each association's receive window. It must hold several
	// messages (4 × messageBytes at least). Default 16 MiB.
	ReceiveBuffer int
	// SendBuffer is how many bytes of a link may be queued, sent but not yet
	// acknowledged, before Send waits. Default 8 MiB.
	SendBuffer int
	// SocketBuffer is SO_RCVBUF and SO_SNDBUF of each association's UDP socket.
	// Bursts that overflow the kernel's receive buffer are dropped and cost a
	// retransmission timeout, so it is set large; without privileges the
	// kernel caps it at net.core.rmem_max / wmem_max. Default 8 MiB.
	SocketBuffer int
	// ProbeInterval is how often a waiting read sends a heartbeat to learn
	// whether the peer still exists. Default 250ms.
	ProbeInterval time.Duration
	// Security is how frames are protected once a link is connected
	// (transport.Security), as for the TCP transport: every message of a
	// frame carries an AES-GCM tag, or is encrypted. Default
	// (SecurityDefault): sealed between hosts, plain between ranks of this
	// host. Every rank must use the same.
	Security transport.Security
	// Logger receives connection diagnostics. Default: discard.
	Logger *slog.Logger
}

const (
	defaultListenAddr       = "127.0.0.1:0"
	defaultHandshakeTimeout = transport.DefaultHandshakeTimeout
	defaultIOTimeout        = transport.DefaultIOTimeout
	defaultDialRetry        = 5 * time.Millisecond
	defaultMTU              = 8192
	minMTU                  = 1200
	maxMTU                  = 8192
	defaultReceiveBuffer    = 16 << 20
	defaultSendBuffer       = 8 << 20
	defaultProbeInterval    = 250 * time.Millisecond
	defaultSocketBuffer     = 8 << 20

	// messageBytes bounds one SCTP message: part of the wire format (the
	// receiver reads each message into a buffer of exactly its size), far
	// below the receive buffer.
	messageBytes = 1 << 20
)

// ErrInvalidConfig is wrapped by every error about a Config that cannot work;
// it wraps transport.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("sctp: %w", transport.ErrInvalidConfig)

// DefaultConfig returns the defaults; Secret must still be set.
func DefaultConfig() Config {
	return Config{
		ListenAddr:       defaultListenAddr,
		HandshakeTimeout: defaultHandshakeTimeout,
		IOTimeout:        defaultIOTimeout,
		DialRetry:        defaultDialRetry,
		MTU:              defaultMTU,
		ReceiveBuffer:    defaultReceiveBuffer,
		SendBuffer:       defaultSendBuffer,
		ProbeInterval:    defaultProbeInterval,
		SocketBuffer:     defaultSocketBuffer,
		Logger:           slog.New(slog.DiscardHandler),
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
	c.IOTimeout = linkutil.Positive(c.IOTimeout, d.IOTimeout)
	c.DialRetry = linkutil.Positive(c.DialRetry, d.DialRetry)
	c.MTU = linkutil.OrDefault(c.MTU, d.MTU)
	if c.MTU < minMTU || c.MTU > maxMTU {
		return c, fmt.Errorf("%w: MTU %d outside [%d, %d]", ErrInvalidConfig, c.MTU, minMTU, maxMTU)
	}
	c.ReceiveBuffer = linkutil.OrDefault(c.ReceiveBuffer, d.ReceiveBuffer)
	if c.ReceiveBuffer < 4*messageBytes || c.ReceiveBuffer > 1<<30 {
		return c, fmt.Errorf("%w: ReceiveBuffer %d outside [%d, %d]", ErrInvalidConfig, c.ReceiveBuffer, 4*messageBytes, 1<<30)
	}
	c.SendBuffer = linkutil.OrDefault(c.SendBuffer, d.SendBuffer)
	if c.SendBuffer < 2*messageBytes {
		return c, fmt.Errorf("%w: SendBuffer %d is below %d", ErrInvalidConfig, c.SendBuffer, 2*messageBytes)
	}
	c.SocketBuffer = linkutil.OrDefault(c.SocketBuffer, d.SocketBuffer)
	if c.SocketBuffer < 0 {
		return c, fmt.Errorf("%w: SocketBuffer is negative", ErrInvalidConfig)
	}
	c.ProbeInterval = linkutil.Positive(c.ProbeInterval, d.ProbeInterval)
	if !c.Security.Valid() {
		return c, fmt.Errorf("%w: unknown Security %v", ErrInvalidConfig, c.Security)
	}
	c.Logger = linkutil.OrDefault(c.Logger, d.Logger)
	return c, nil
}
