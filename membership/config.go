package membership

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config configures a Member. Start from DefaultConfig; zero fields take the
// defaults, except Secret, which is required.
type Config struct {
	// Name is this incarnation's member name; it must be unique per process
	// incarnation (a restarted process with an old name is refused by the others
	// as a "conflicting address"). Default: hostname-pid-random.
	Name string

	// BindAddr and BindPort are where gossip listens (UDP and TCP on the same
	// port). Default 127.0.0.1 and 0 (any free port); multi-host jobs set a
	// routable address.
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what peers dial when they differ from
	// the bind address (NAT, a wildcard bind address). Default: derived by
	// memberlist from the bind address.
	AdvertiseAddr string
	AdvertisePort int

	// Seeds are "host:port" gossip addresses of members to join through. Join
	// tries all of them each round (several seeds converge faster and survive a
	// dead seed); this member's own address is skipped, and a member with no
	// other seed starts a new cluster.
	Seeds []string

	// Secret is the job secret. The AES-256-GCM gossip key is derived from it,
	// so members without it can neither read nor inject gossip. Required.
	Secret []byte

	// Failure detection (see memberlist.Config for the meaning of each). The
	// defaults detect a crashed member in about 0.6-1.0 s on a LAN: a member is
	// probed every ProbeInterval by someone, a probe fails after ProbeTimeout,
	// and a suspect is declared dead after SuspicionMult × ProbeInterval
	// (scaled by log10 of the cluster size).
	ProbeInterval time.Duration // default 200ms
	ProbeTimeout  time.Duration // default 100ms
	SuspicionMult int           // default 2
	// SuspicionMaxTimeoutMult bounds how far suspicion may stretch while
	// waiting for independent confirmations. Default 4.
	SuspicionMaxTimeoutMult int
	// IndirectChecks is how many peers probe a suspect on our behalf. Default 3.
	IndirectChecks int
	// AwarenessMaxMultiplier bounds how much a member slows its own probing when
	// it sees it is overloaded (Lifeguard). It trades detection time under load
	// for fewer false Failed events. Default 4.
	AwarenessMaxMultiplier int

	// Dissemination. GossipInterval is how often piggy-backed updates go out to
	// GossipNodes random peers; PushPullInterval is how often a member swaps
	// full state with one random peer. A frequent push/pull is what keeps a
	// join from stalling for tens of seconds when an alive message dies out.
	GossipInterval      time.Duration // default 50ms
	GossipNodes         int           // default 3
	RetransmitMult      int           // default 4
	PushPullInterval    time.Duration // default 1s
	GossipToTheDeadTime time.Duration // default 2s

	// TCPTimeout bounds push/pull, TCP fallback probes and each Send.
	// Default 2s.
	TCPTimeout time.Duration

	// JoinRetry is the first pause between join rounds while no seed answers; it
	// doubles up to JoinRetryMax. Defaults 50ms and 1s.
	JoinRetry    time.Duration
	JoinRetryMax time.Duration
	// UpdateTimeout bounds UpdateMeta's wait for its broadcast, and LeaveTimeout
	// Leave's wait for its announcements, when the context has no earlier
	// deadline. Defaults 2s each.
	UpdateTimeout time.Duration
	LeaveTimeout  time.Duration

	// MaxMessageSize bounds a Send payload; larger incoming messages are dropped
	// and counted. Default 64 KiB, at most 16 MiB.
	MaxMessageSize int
	// MessageQueue is how many received messages wait for Messages() readers;
	// beyond it new messages are dropped and counted. Default 1024.
	MessageQueue int

	// Logger receives this package's and memberlist's diagnostics (memberlist's
	// "[LEVEL] memberlist: ..." lines mapped to slog levels). Default: discard.
	Logger *slog.Logger
	// LogRepeatWindow: identical memberlist lines within it (a stranger's
	// garbage packets, one ERROR each) are written once, then counted in one
	// line "... (repeated N times in the last 5 s)". Default 5 s.
	LogRepeatWindow time.Duration
}

const maxMessageSizeLimit = 16 << 20

// ErrInvalidConfig is wrapped by every error about a Config that cannot work.
var ErrInvalidConfig = errors.New("membership: invalid configuration")

// DefaultConfig returns settings tuned for a training cluster on a LAN (or one
// machine); Secret must still be set.
func DefaultConfig() Config {
	return Config{
		BindAddr:                "127.0.0.1",
		ProbeInterval:           200 * time.Millisecond,
		ProbeTimeout:            100 * time.Millisecond,
		SuspicionMult:           2,
		SuspicionMaxTimeoutMult: 4,
		IndirectChecks:          3,
		AwarenessMaxMultiplier:  4,
		GossipInterval:          50 * time.Millisecond,
		GossipNodes:             3,
		RetransmitMult:          4,
		PushPullInterval:        time.Second,
		GossipToTheDeadTime:     2 * time.Second,
		TCPTimeout:              2 * time.Second,
		JoinRetry:               50 * time.Millisecond,
		JoinRetryMax:            time.Second,
		UpdateTimeout:           2 * time.Second,
		LeaveTimeout:            2 * time.Second,
		MaxMessageSize:          64 << 10,
		MessageQueue:            1024,
		Logger:                  slog.New(slog.DiscardHandler),
		LogRepeatWindow:         5 * time.Second,
	}
}

// withDefaults fills zero fields, copies slices the caller may reuse, and
// validates the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if len(c.Secret) == 0 {
		return c, fmt.Errorf("%w: Secret is required", ErrInvalidConfig)
	}
	c.Secret = append([]byte(nil), c.Secret...)
	c.Seeds = append([]string(nil), c.Seeds...)
	if c.Name == "" {
		name, err := generateName()
		if err != nil {
			return c, err
		}
		c.Name = name
	}
	// Message frames carry the sender's name behind a one-byte length.
	if len(c.Name) > maxFrameString {
		return c, fmt.Errorf("%w: Name is %d bytes, more than %d", ErrInvalidConfig, len(c.Name), maxFrameString)
	}
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return c, fmt.Errorf("%w: BindPort or AdvertisePort is outside [0, 65535]", ErrInvalidConfig)
	}
	durations := []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.ProbeInterval, d.ProbeInterval}, {&c.ProbeTimeout, d.ProbeTimeout},
		{&c.GossipInterval, d.GossipInterval}, {&c.PushPullInterval, d.PushPullInterval},
		{&c.GossipToTheDeadTime, d.GossipToTheDeadTime}, {&c.TCPTimeout, d.TCPTimeout},
		{&c.JoinRetry, d.JoinRetry}, {&c.JoinRetryMax, d.JoinRetryMax},
		{&c.UpdateTimeout, d.UpdateTimeout}, {&c.LeaveTimeout, d.LeaveTimeout},
		{&c.LogRepeatWindow, d.LogRepeatWindow},
	}
	for _, f := range durations {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	ints := []struct {
		v   *int
		def int
	}{
		{&c.SuspicionMult, d.SuspicionMult}, {&c.SuspicionMaxTimeoutMult, d.SuspicionMaxTimeoutMult},
		{&c.IndirectChecks, d.IndirectChecks}, {&c.AwarenessMaxMultiplier, d.AwarenessMaxMultiplier},
		{&c.GossipNodes, d.GossipNodes}, {&c.RetransmitMult, d.RetransmitMult},
		{&c.MaxMessageSize, d.MaxMessageSize}, {&c.MessageQueue, d.MessageQueue},
	}
	for _, f := range ints {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return c, fmt.Errorf("%w: ProbeTimeout %v must be shorter than ProbeInterval %v", ErrInvalidConfig, c.ProbeTimeout, c.ProbeInterval)
	}
	if c.JoinRetryMax < c.JoinRetry {
		c.JoinRetryMax = c.JoinRetry
	}
	if c.MaxMessageSize > maxMessageSizeLimit {
		return c, fmt.Errorf("%w: MaxMessageSize %d is over %d", ErrInvalidConfig, c.MaxMessageSize, maxMessageSizeLimit)
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	return c, nil
}

// gossipKey derives the 32-byte AES-256-GCM key memberlist encrypts gossip
// with. HKDF with a fixed label keeps the key independent of any other use of
// the same secret (the TCP transport's handshake MACs), and turns a secret of
// any length into exactly the key size memberlist requires.
func gossipKey(secret []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, []byte("gorovod membership"), "memberlist gossip AES-256-GCM key v1", 32)
}

// generateName builds hostname-pid-random: readable in logs, and unique per
// incarnation even when a pid is reused (containers often restart as pid 1).
func generateName() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	if len(host) > 64 {
		host = host[:64]
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("membership: generating a member name: %w", err)
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:])), nil
}

// memberlistConfig maps c onto memberlist's configuration.
func (c *Config) memberlistConfig(key []byte, logger *log.Logger) *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.Name
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if c.AdvertisePort == 0 {
		// memberlist advertises AdvertisePort verbatim when set; leaving it at
		// the LAN default (7946) would advertise the wrong port.
		mc.AdvertisePort = c.BindPort
	}
	mc.SecretKey = key
	mc.GossipVerifyIncoming = true
	mc.GossipVerifyOutgoing = true
	// memberlist compresses every packet and stream with LZW by default.
	// A job's gossip is small packets inside one cluster's network, where
	// the bytes saved are worth nothing and the compressing is not: in a
	// profile of a 16-worker world change on 2 cores (docs/multihost.md),
	// compressing and decompressing was a fifth of the workers' gossip CPU
	// (36 of 176 samples), at the moment every worker needed the CPU to
	// enter the next world. Compressed messages from peers are still read.
	mc.EnableCompression = false
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.SuspicionMult = c.SuspicionMult
	mc.SuspicionMaxTimeoutMult = c.SuspicionMaxTimeoutMult
	mc.IndirectChecks = c.IndirectChecks
	mc.AwarenessMaxMultiplier = c.AwarenessMaxMultiplier
	mc.GossipInterval = c.GossipInterval
	mc.GossipNodes = c.GossipNodes
	mc.RetransmitMult = c.RetransmitMult
	mc.PushPullInterval = c.PushPullInterval
	mc.GossipToTheDeadTime = c.GossipToTheDeadTime
	mc.TCPTimeout = c.TCPTimeout
	mc.Logger = logger
	return mc
}
