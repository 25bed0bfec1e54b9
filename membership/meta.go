package membership

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// MaxMetaSize is the largest encoded Meta: memberlist's 512-byte NodeMeta
// limit less the seal each member adds to it (a sequence number and a
// signature, 72 bytes). An encoding over it is an error (memberlist itself
// would panic).
const MaxMetaSize = memberlist.MetaMaxSize - metaSealSize

// Field limits. Every string is length-prefixed by one byte; the 440-byte total
// is the binding limit in practice.
const (
	maxMetaString = 255
	maxExtraPairs = 32
	// MaxGPUs is the largest GPU count Meta carries.
	MaxGPUs = math.MaxInt16
	// GPUsUnknown is the GPU count of a member that has not detected its GPUs.
	GPUsUnknown = -1
)

// metaVersion is the first byte of every encoding. A decoder refuses other
// versions: all members of a job run the same build, and refusing is safer than
// guessing at fields.
const metaVersion = 1

// ErrMetaTooLarge is wrapped by errors for a Meta whose encoding exceeds MaxMetaSize.
var ErrMetaTooLarge = errors.New("membership: metadata over its 440-byte limit (memberlist's 512 less the seal)")

// Role is what a member does in the job.
type Role uint8

const (
	// RoleWorker trains and takes part in collectives.
	RoleWorker Role = 1
	// RoleDriver coordinates (proposes epochs) and takes no part in collectives.
	RoleDriver Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleWorker:
		return "worker"
	case RoleDriver:
		return "driver"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// State is where a member is in its life in the job.
type State uint8

const (
	// StateJoining: in the gossip cluster, not yet ready for a world epoch.
	StateJoining State = 1
	// StateReady: may be placed in the next world epoch.
	StateReady State = 2
	// StateLeaving: leaving gracefully; keep it out of the next epoch.
	StateLeaving State = 3
)

func (s State) String() string {
	switch s {
	case StateJoining:
		return "joining"
	case StateReady:
		return "ready"
	case StateLeaving:
		return "leaving"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Meta is what a member publishes about itself through gossip. The member's
// name (unique per incarnation) is Node.Name, not repeated here.
type Meta struct {
	// JobID names the job; members of other jobs are refused. Required.
	JobID string
	// Role: RoleWorker or RoleDriver. Join fills RoleWorker when zero.
	Role Role
	// State: joining, ready or leaving. Join fills StateJoining when zero.
	State State
	// CollectiveAddr is the "host:port" of the member's collective transport
	// (tcp.Transport.Addr()), empty when it has none yet (or is a driver).
	CollectiveAddr string
	// Host identifies the machine, so co-located members can be grouped (for
	// example shm.HostID). Join fills the host name when empty.
	Host string
	// GPUs is the number of GPUs the member drives, GPUsUnknown (-1) when not
	// known; 0 means none.
	GPUs int
	// StartedAt is the member's start time in Unix nanoseconds; the oldest ready
	// worker is the epoch proposer when there is no driver. Join fills the
	// current time when zero.
	StartedAt int64
	// Extra carries a few free-form pairs (up to 32; keys non-empty). The whole
	// encoding, Extra included, must fit MaxMetaSize.
	Extra map[string]string
	// SigningKey is the Ed25519 public key this incarnation signs its
	// messages with (see Send). Join sets it; UpdateMeta cannot change it,
	// and a peer refuses a member whose key differs from the first one it saw
	// under that name. Empty only in a Meta that was never published.
	SigningKey []byte
}

// Clone returns a deep copy (Extra is a map, which copies of Meta would share).
func (m Meta) Clone() Meta {
	if m.Extra != nil {
		m.Extra = maps.Clone(m.Extra)
	}
	m.SigningKey = bytes.Clone(m.SigningKey)
	return m
}

// Equal reports whether two Metas carry the same values (a nil and an empty
// Extra are equal, as they encode the same).
func (m Meta) Equal(o Meta) bool {
	return m.JobID == o.JobID && m.Role == o.Role && m.State == o.State &&
		m.CollectiveAddr == o.CollectiveAddr && m.Host == o.Host && m.GPUs == o.GPUs &&
		m.StartedAt == o.StartedAt && maps.Equal(m.Extra, o.Extra) && bytes.Equal(m.SigningKey, o.SigningKey)
}

// Validate checks every field against the limits of the encoding.
func (m *Meta) Validate() error {
	if m.JobID == "" {
		return errors.New("membership: Meta.JobID is required")
	}
	if m.Role != RoleWorker && m.Role != RoleDriver {
		return fmt.Errorf("membership: Meta.Role %v is not worker or driver", m.Role)
	}
	if m.State < StateJoining || m.State > StateLeaving {
		return fmt.Errorf("membership: Meta.State %v is not joining, ready or leaving", m.State)
	}
	if m.GPUs < GPUsUnknown || m.GPUs > MaxGPUs {
		return fmt.Errorf("membership: Meta.GPUs %d is outside [-1, %d]", m.GPUs, MaxGPUs)
	}
	if m.StartedAt <= 0 {
		return fmt.Errorf("membership: Meta.StartedAt %d is not a positive Unix time", m.StartedAt)
	}
	for _, f := range []struct{ name, v string }{{"JobID", m.JobID}, {"CollectiveAddr", m.CollectiveAddr}, {"Host", m.Host}} {
		if err := checkString(f.name, f.v); err != nil {
			return err
		}
	}
	if m.CollectiveAddr != "" {
		// The proposer hands these addresses to the transport; a malformed one
		// is better refused where it is set than where a peer dials it.
		if _, _, err := net.SplitHostPort(m.CollectiveAddr); err != nil {
			return fmt.Errorf("membership: Meta.CollectiveAddr %q: %v", m.CollectiveAddr, err)
		}
	}
	if len(m.SigningKey) != 0 && len(m.SigningKey) != ed25519.PublicKeySize {
		return fmt.Errorf("membership: Meta.SigningKey is %d bytes, not %d", len(m.SigningKey), ed25519.PublicKeySize)
	}
	if len(m.Extra) > maxExtraPairs {
		return fmt.Errorf("membership: Meta.Extra has %d pairs, more than %d", len(m.Extra), maxExtraPairs)
	}
	for k, v := range m.Extra {
		if k == "" {
			return errors.New("membership: Meta.Extra has an empty key")
		}
		if err := checkString("Extra key", k); err != nil {
			return err
		}
		if err := checkString("Extra value", v); err != nil {
			return err
		}
	}
	return nil
}

func checkString(name, v string) error {
	if len(v) > maxMetaString {
		return fmt.Errorf("membership: Meta.%s is %d bytes, more than %d", name, len(v), maxMetaString)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("membership: Meta.%s is not valid UTF-8", name)
	}
	return nil
}

// Encoding (all integers little-endian):
//
//	0  version    uint8  = 1
//	1  role       uint8
//	2  state      uint8
//	3  startedAt  int64
//	11 gpus       int16  (-1 unknown)
//	13 jobID, collectiveAddr, host: each uint8 length + bytes
//	   extra: uint8 count, then count × (uint8 len + key, uint8 len + value),
//	   keys strictly ascending
//	   signingKey: uint8 length (0 or 32) + bytes
//
// Every valid Meta has exactly one encoding, so the decoder can demand that its
// input re-encodes to itself (the fuzzer checks it), and equal metadata gives
// equal bytes (memberlist compares bytes to decide whether a node was updated).
const metaFixed = 13

// EncodedSize returns the size of m's encoding without validating it.
func (m *Meta) EncodedSize() int {
	n := metaFixed + 3 + len(m.JobID) + len(m.CollectiveAddr) + len(m.Host) + 1 + 1 + len(m.SigningKey)
	for k, v := range m.Extra {
		n += 2 + len(k) + len(v)
	}
	return n
}

// MarshalBinary validates m and encodes it; an encoding over MaxMetaSize is an
// error wrapping ErrMetaTooLarge.
func (m *Meta) MarshalBinary() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if n := m.EncodedSize(); n > MaxMetaSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, n)
	}
	return m.appendTo(make([]byte, 0, m.EncodedSize())), nil
}

// appendTo appends the encoding of a validated m.
func (m *Meta) appendTo(b []byte) []byte {
	b = append(b, metaVersion, byte(m.Role), byte(m.State))
	b = binary.LittleEndian.AppendUint64(b, uint64(m.StartedAt))
	b = binary.LittleEndian.AppendUint16(b, uint16(int16(m.GPUs)))
	b = appendString(b, m.JobID)
	b = appendString(b, m.CollectiveAddr)
	b = appendString(b, m.Host)
	b = append(b, byte(len(m.Extra)))
	for _, k := range slices.Sorted(maps.Keys(m.Extra)) {
		b = appendString(b, k)
		b = appendString(b, m.Extra[k])
	}
	return appendString(b, string(m.SigningKey))
}

func appendString(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

// UnmarshalBinary decodes and validates an encoding made by MarshalBinary. It
// never panics on arbitrary input, refuses trailing bytes, unsorted or
// duplicate Extra keys and anything Validate refuses, and leaves m unchanged
// on error.
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) > MaxMetaSize {
		return fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, len(b))
	}
	if len(b) < metaFixed {
		return fmt.Errorf("membership: metadata is %d bytes, shorter than its %d-byte header", len(b), metaFixed)
	}
	if b[0] != metaVersion {
		return fmt.Errorf("membership: metadata version %d, want %d", b[0], metaVersion)
	}
	out := Meta{
		Role:      Role(b[1]),
		State:     State(b[2]),
		StartedAt: int64(binary.LittleEndian.Uint64(b[3:])),
		GPUs:      int(int16(binary.LittleEndian.Uint16(b[11:]))),
	}
	r := reader{b: b[metaFixed:]}
	out.JobID = r.str()
	out.CollectiveAddr = r.str()
	out.Host = r.str()
	n := int(r.u8())
	prev := ""
	for i := range n {
		k, v := r.str(), r.str()
		if r.err != nil {
			break
		}
		if i > 0 && k <= prev {
			return errors.New("membership: metadata Extra keys are not strictly ascending")
		}
		prev = k
		if out.Extra == nil {
			out.Extra = make(map[string]string, n)
		}
		out.Extra[k] = v
	}
	if key := r.str(); key != "" {
		out.SigningKey = []byte(key)
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("membership: metadata has %d trailing bytes", len(r.b))
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*m = out
	return nil
}

// reader takes length-prefixed fields off a byte slice, remembering the first
// error so callers check once.
type reader struct {
	b   []byte
	err error
}

func (r *reader) u8() uint8 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.err = errors.New("membership: truncated field")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) str() string {
	n := int(r.u8())
	if r.err != nil {
		return ""
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("membership: field of %d bytes truncated at %d", n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
