package shm

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
	// ListenAddr, AdvertiseAddr, Secret and HandshakeTimeout configure the TCP
	// bootstrap transport Listen creates (see tcp.Config). New, which is given
	// its bootstrap, ignores ListenAddr, AdvertiseAddr and Secret.
	ListenAddr       string
	AdvertiseAddr    string
	Secret           []byte
	HandshakeTimeout time.Duration
	// IOTimeout is how long a peer may stay silent on a blocked Send or Recv
	// before the call fails with transport.ErrPeerTimeout. Default 30s.
	IOTimeout time.Duration
	// Dir is where regions and FIFOs are created (and unlinked again as soon as
	// both ranks have opened them). It must be a memory file system shared by
	// the ranks of the host. Default /dev/shm.
	Dir string
	// RingBytes is the capacity of each direction's ring: a power of two, at
	// least 128 KiB (a few InlinePayload frames must fit). A pair's region is
	// twice this plus 12 KiB. Zero (the default) sizes it by the world: 32 MiB
	// shared among a rank's peers, within [256 KiB, 4 MiB] — 4 MiB up to 9
	// ranks, where a sender that can run a whole 4 MiB collective ahead copes
	// best with ranks taking turns on cores.
	RingBytes int
	// SpinTime is how long a call polls the ring before it parks, at most:
	// the bound adapts per link direction, halving while waits outlast it
	// (package spin), so long or silent waits cost almost no CPU. While it
	// polls it yields the CPU to other goroutines and processes now and then,
	// so ranks that outnumber the cores still make progress; such ranks, whose
	// polls yield to other processes at every check, poll up to ten times
	// this (a neighbour's turn on the shared core is a yield away, a parked
	// wait pays a kernel wake-up on top of it). Default 100µs; a negative
	// value disables spinning.
	SpinTime time.Duration
	// SingleCopyBytes: payloads of at least this many bytes are not copied
	// through the ring; the receiver copies them straight from the sender's
	// memory (process_vm_readv), and Send waits until it has. This halves the
	// copying of large frames. It is used only in the directions where a probe
	// at connect time showed that the receiver may read the sender's memory
	// (same user, ptrace not forbidden by a security module or seccomp), and
	// only while the world's ranks on this host are no more than its CPUs
	// (waiting for a receiver that is not running costs more than a copy);
	// elsewhere every frame goes through the ring. It must exceed
	// transport.InlinePayload. Default 2 MiB: a single-copy Send waits until
	// its receiver has copied the frame, one frame at a time, where a ring
	// frame is done once it is in the ring, and for the chunks of a pipelined
	// collective (collective.Config.ChunkBytes, 256 KiB by default) that wait
	// costs more than the copy it saves. Measured between two processes at
	// GOMAXPROCS=1, allreduce p = 2: frames of 128 KiB to 1 MiB moved 1.3-2.7x
	// faster through the ring, frames of 2 MiB and 4 MiB 1.1-1.5x faster by
	// single copy. Negative disables it.
	SingleCopyBytes int
	// Fallback keeps the bootstrap link of a pair whose ranks are on different
	// hosts (or cannot share memory) instead of failing Connect. Default false:
	// the shm transport alone insists on shared memory.
	Fallback bool
	// HostID overrides the detected host identity (see HostID). Ranks share
	// memory only when their host identities match, so tests set distinct ones
	// to build mixed worlds on one machine.
	HostID string
	// Logger receives connection diagnostics. Default: discard.
	Logger *slog.Logger
}

const (
	defaultDir              = "/dev/shm"
	autoRingBudget          = 32 << 20
	minAutoRingBytes        = 256 << 10
	maxAutoRingBytes        = 4 << 20
	minRingBytes            = 128 << 10
	maxRingBytes            = 1 << 30
	defaultSpinTime         = 100 * time.Microsecond
	defaultSingleCopyBytes  = 2 << 20
	defaultIOTimeout        = transport.DefaultIOTimeout
	defaultHandshakeTimeout = transport.DefaultHandshakeTimeout
)

// ErrInvalidConfig is wrapped by every error about a Config that cannot work;
// it wraps transport.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("shm: %w", transport.ErrInvalidConfig)

// DefaultConfig returns the defaults; Secret must still be set for Listen.
func DefaultConfig() Config {
	return Config{
		ListenAddr:       "127.0.0.1:0",
		HandshakeTimeout: defaultHandshakeTimeout,
		IOTimeout:        defaultIOTimeout,
		Dir:              defaultDir,
		SpinTime:         defaultSpinTime,
		SingleCopyBytes:  defaultSingleCopyBytes,
		Logger:           slog.New(slog.DiscardHandler),
	}
}

// withDefaults fills zero fields and validates the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	c.ListenAddr = linkutil.OrDefault(c.ListenAddr, d.ListenAddr)
	c.HandshakeTimeout = linkutil.Positive(c.HandshakeTimeout, d.HandshakeTimeout)
	c.IOTimeout = linkutil.Positive(c.IOTimeout, d.IOTimeout)
	c.Dir = linkutil.OrDefault(c.Dir, d.Dir)
	if c.RingBytes != 0 && (c.RingBytes < minRingBytes || c.RingBytes > maxRingBytes || c.RingBytes&(c.RingBytes-1) != 0) {
		return c, fmt.Errorf("%w: RingBytes %d must be a power of two in [%d, %d]", ErrInvalidConfig, c.RingBytes, minRingBytes, maxRingBytes)
	}
	c.SpinTime = linkutil.SpinTime(c.SpinTime, d.SpinTime)
	switch {
	case c.SingleCopyBytes == 0:
		c.SingleCopyBytes = d.SingleCopyBytes
	case c.SingleCopyBytes < 0:
		c.SingleCopyBytes = 0
	case c.SingleCopyBytes <= transport.InlinePayload:
		return c, fmt.Errorf("%w: SingleCopyBytes %d must exceed transport.InlinePayload (%d)", ErrInvalidConfig, c.SingleCopyBytes, transport.InlinePayload)
	}
	if len(c.HostID) > 256 {
		return c, fmt.Errorf("%w: HostID is longer than 256 bytes", ErrInvalidConfig)
	}
	c.Logger = linkutil.OrDefault(c.Logger, d.Logger)
	c.Secret = linkutil.CopySecret(c.Secret)
	return c, nil
}

// ringBytes is the ring size for a world of size ranks.
func (c *Config) ringBytes(size int) int {
	if c.RingBytes != 0 {
		return c.RingBytes
	}
	n := maxAutoRingBytes
	for n > minAutoRingBytes && n*(size-1) > autoRingBudget {
		n /= 2
	}
	return n
}
