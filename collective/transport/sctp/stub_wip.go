package sctp

import (
	"errors"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Config is a work-in-progress placeholder.
type Config struct {
	ListenAddr, AdvertiseAddr   string
	Secret                      []byte
	HandshakeTimeout, IOTimeout time.Duration
	Logger                      *slog.Logger
}

// DefaultConfig placeholder.
func DefaultConfig() Config { return Config{} }

// Listen placeholder.
func Listen(Config) (transport.Transport, error) { return nil, errors.New("sctp: not yet") }
