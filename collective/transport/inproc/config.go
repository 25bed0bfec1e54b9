package inproc

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
)

// Config configures a Transport (Network.Listen) or a Mesh. A zero field
// means its default (DefaultConfig).
type Config struct {
	// Secret is the job secret both ends of a connection must share
	// (Listen; required there).
	Secret []byte
	// JobID and Epoch name the world of the links Mesh builds; Listen
	// ignores them (Connect takes them from its World).
	JobID string
	Epoch uint64
	// HandshakeTimeout bounds each handshake message. Default
	// transport.DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// IOTimeout is how long a peer may stay silent on a blocked Send or Recv
	// before the call fails with transport.ErrPeerTimeout. Default
	// transport.DefaultIOTimeout.
	IOTimeout time.Duration
	// DialRetry is the first retry interval while a peer is not listening yet
	// or not yet connecting the world. Default 1ms.
	DialRetry time.Duration
	// BufferBytes is how many payload bytes a link queues before Send waits;
	// a larger frame is queued when the queue is empty. Default 1 MiB.
	BufferBytes int
	// Logger receives connection diagnostics. Default: discard.
	Logger *slog.Logger
}

// ErrInvalidConfig is wrapped by every error about a Config that cannot work;
// it wraps transport.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("inproc: %w", transport.ErrInvalidConfig)

// DefaultConfig returns the defaults; Secret must still be set for Listen.
func DefaultConfig() Config {
	return Config{
		HandshakeTimeout: transport.DefaultHandshakeTimeout,
		IOTimeout:        transport.DefaultIOTimeout,
		DialRetry:        time.Millisecond,
		BufferBytes:      1 << 20,
		Logger:           slog.New(slog.DiscardHandler),
	}
}

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	c.Secret = linkutil.CopySecret(c.Secret)
	c.HandshakeTimeout = linkutil.OrDefault(c.HandshakeTimeout, d.HandshakeTimeout)
	c.IOTimeout = linkutil.OrDefault(c.IOTimeout, d.IOTimeout)
	c.DialRetry = linkutil.OrDefault(c.DialRetry, d.DialRetry)
	c.BufferBytes = linkutil.OrDefault(c.BufferBytes, d.BufferBytes)
	c.Logger = linkutil.OrDefault(c.Logger, d.Logger)
	if c.HandshakeTimeout < 0 || c.IOTimeout < 0 || c.DialRetry < 0 || c.BufferBytes < 0 {
		return c, fmt.Errorf("%w: negative timeout or buffer size", ErrInvalidConfig)
	}
	return c, nil
}
