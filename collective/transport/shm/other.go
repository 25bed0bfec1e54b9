//go:build !linux

package shm

import (
	"errors"

	"github.com/gorovod/gorovod/collective/transport"
)

// ErrUnsupported: shared memory needs Linux (FIFOs in the netpoller, /proc).
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux")

// Transport is not available on this system.
type Transport struct{ transport.Transport }

// Listen fails with ErrUnsupported.
func Listen(Config) (*Transport, error) { return nil, ErrUnsupported }

// New fails with ErrUnsupported.
func New(transport.Transport, Config) (*Transport, error) { return nil, ErrUnsupported }

// HostID fails with ErrUnsupported.
func HostID(string) (string, error) { return "", ErrUnsupported }
