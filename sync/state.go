package sync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/fusion"
)

// State is what a new or recovering worker must receive to continue training
// as if nothing happened: the step counter plus everything the trainer
// registers (parameters, optimizer state, counters, the sampler's position,
// ...).
//
// Registered tensors — any dtype, in host or device memory — are made equal
// in place to the world's rank 0's whenever a world is entered: not at all
// when every member holds that state already, in stripes from the members
// that hold it when they are enough (see broadcast), else by broadcast from
// rank 0. A tensor in host memory that every member holds byte for byte
// already (a joiner that loaded the job's checkpoint, a frozen layer) is not
// sent at all. Blobs are read with get on rank 0 and installed with set on
// the others. Every worker must register the same names, dtypes and sizes
// in the same order: a worker whose registrations differ from rank 0's gets
// an error wrapping ErrStateMismatch that names the first difference, and
// leaves the job (rank 0's state is the job's).
type State struct {
	Step    int64
	tensors []namedTensor
	blobs   []namedBlob
}

type namedTensor struct {
	name string
	buf  collective.Buffer
}

type namedBlob struct {
	name string
	get  func() ([]byte, error)
	set  func([]byte) error
}

// ErrStateMismatch is wrapped by the error a worker gets when its registered
// state differs from the world's rank 0's (names, dtypes, element counts, or
// the number of tensors or blobs), or is malformed itself. It ends the
// worker's membership: redoing the step could not repair it.
var ErrStateMismatch = errors.New("sync: registered state differs from rank 0's")

// NewState returns an empty state at step 0.
func NewState() *State { return &State{} }

// RegisterBuffer adds a tensor of any dtype, in host or device memory
// (parameters, optimizer moments, integer counters), synchronized in place.
// Its memory must stay valid while the state is in use.
func (s *State) RegisterBuffer(name string, b collective.Buffer) {
	s.tensors = append(s.tensors, namedTensor{name, b})
}

// RegisterTensor adds a float32 slice; it is RegisterBuffer of
// collective.SliceBuffer(data).
func (s *State) RegisterTensor(name string, data []float32) {
	s.RegisterBuffer(name, collective.SliceBuffer(data))
}

// RegisterBlob adds opaque state (a sampler position, a learning-rate
// schedule) as bytes.
func (s *State) RegisterBlob(name string, get func() ([]byte, error), set func([]byte) error) {
	s.blobs = append(s.blobs, namedBlob{name, get, set})
}

// check reports a malformed registration: a tensor whose buffer is invalid,
// or a name used twice.
func (s *State) check() error {
	seen := make(map[string]bool, len(s.tensors)+len(s.blobs))
	for _, t := range s.tensors {
		if err := fusion.Check([]collective.Buffer{t.buf}); err != nil {
			return fmt.Errorf("%w: state tensor %q: %v", ErrStateMismatch, t.name, err)
		}
		if seen[t.name] {
			return fmt.Errorf("%w: state name %q registered twice", ErrStateMismatch, t.name)
		}
		seen[t.name] = true
	}
	for _, b := range s.blobs {
		if seen[b.name] {
			return fmt.Errorf("%w: state name %q registered twice", ErrStateMismatch, b.name)
		}
		seen[b.name] = true
	}
	return nil
}

// broadcast makes every rank's state a copy of root's. Root first sends its
// step and a description of its registrations (names, dtypes, counts, blob
// sizes); a rank whose own differ stops there with an error wrapping
// ErrStateMismatch that names the difference, rather than misread bytes.
// local is this rank's digest of its own state when it took one
// (Session.stateRoot), nil otherwise: its blobs as read, for root, and its
// tensors' digests.
//
// Before any tensor moves, one small allreduce (Max of each tensor's digest
// and of its negation) tells every rank which tensors some rank holds
// differently from the others; only those are sent (all of them, without
// that allreduce, when they total less than differingMinBytes). moved is
// their size in bytes (each tensor counted once, however many ranks
// receive it).
//
// holders are the ranks known to hold root's state byte for byte (root
// among them; see Session.stateRoot). When there are at least two, and at
// least as many as ranks that need the state, the tensors go by
// collective.Replicate: each receiver takes them in stripes from several
// holders at once, and every holder sends only its share, instead of all of
// it passing down the broadcast's chain through every rank. With more
// receivers than holders the chain is cheaper (Replicate would have each
// holder send several whole copies), so the tensors are broadcast. The
// step, the description and the blobs (small) are broadcast either way.
func (s *State) broadcast(ctx context.Context, c *collective.Communicator, root int, local *stateDigest, holders []int) (moved int64, err error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	var desc []byte
	blobs := make([][]byte, len(s.blobs))
	if c.Rank() == root {
		read := local.readBlobs()
		if read == nil {
			if read, err = s.readBlobs(); err != nil {
				return 0, err
			}
		}
		copy(blobs, read)
		desc = s.describe(blobs)
	}
	head := []int64{s.Step, int64(len(desc))}
	if err := collective.Broadcast(ctx, c, head, root); err != nil {
		return 0, err
	}
	if c.Rank() != root {
		if head[1] < 0 || head[1] > maxDescription {
			return 0, fmt.Errorf("%w: rank %d describes its state in %d bytes", ErrStateMismatch, root, head[1])
		}
		desc = make([]byte, head[1])
	}
	if err := collective.Broadcast(ctx, c, desc, root); err != nil {
		return 0, err
	}
	if c.Rank() != root {
		sizes, err := s.compare(desc, root)
		if err != nil {
			return 0, err
		}
		for i, n := range sizes {
			blobs[i] = make([]byte, n)
		}
	}
	// Every rank's registrations are root's now (a rank whose differ has
	// stopped), so every rank's digest vector has the same length, and
	// every rank takes the same branch.
	var total int
	for _, t := range s.tensors {
		total += t.buf.Bytes()
	}
	var differ []bool
	if total >= differingMinBytes {
		if differ, err = s.differing(ctx, c, local); err != nil {
			return 0, err
		}
	} else {
		differ = slices.Repeat([]bool{true}, len(s.tensors))
	}
	receivers := receiversOf(c.Size(), holders)
	striped := len(holders) >= 2 && len(receivers) <= len(holders)
	for i, t := range s.tensors {
		if !differ[i] {
			continue
		}
		if striped {
			err = c.Replicate(ctx, t.buf, holders, receivers)
		} else {
			err = c.Broadcast(ctx, t.buf, root)
		}
		if err != nil {
			return moved, err
		}
		moved += int64(t.buf.Bytes())
	}
	for i, b := range s.blobs {
		if err := collective.Broadcast(ctx, c, blobs[i], root); err != nil {
			return moved, err
		}
		if c.Rank() != root {
			if err := b.set(blobs[i]); err != nil {
				return moved, fmt.Errorf("sync: installing state %q: %w", b.name, err)
			}
		}
	}
	s.Step = head[0]
	return moved, nil
}

// differingMinBytes is the size of the tensors below which broadcast sends
// them all rather than first agree on those that differ: the agreement is
// one more collective of a few rounds in a row, and sending a quarter of a
// megabyte takes about as long.
const differingMinBytes = 256 << 10

// differing agrees with every rank on the tensors that some rank holds
// differently from another, in one allreduce of two int64s per tensor:
// the Max of each rank's digest of it (62 bits, so that its negation fits)
// and the Max of its negation, which is minus the smallest digest. A
// tensor is held alike everywhere when the largest and the smallest agree.
// A rank that cannot read a tensor from the host (device memory) puts the
// largest value in both places, which makes that tensor differ.
func (s *State) differing(ctx context.Context, c *collective.Communicator, local *stateDigest) ([]bool, error) {
	if len(s.tensors) == 0 {
		return nil, nil
	}
	var digests []int64
	if local != nil && len(local.tensors) == len(s.tensors) {
		digests = local.tensors
	} else {
		digests = s.tensorDigests()
	}
	v := make([]int64, 2*len(digests))
	for i, d := range digests {
		if d == noDigest {
			v[2*i], v[2*i+1] = math.MaxInt64, math.MaxInt64
		} else {
			v[2*i], v[2*i+1] = d, -d
		}
	}
	if err := collective.Allreduce(ctx, c, v, v, collective.Max); err != nil {
		return nil, err
	}
	differ := make([]bool, len(digests))
	for i := range differ {
		differ[i] = v[2*i] != -v[2*i+1]
	}
	return differ, nil
}

// receiversOf lists the ranks of a world of p that are not holders
// (ascending, as holders are).
func receiversOf(p int, holders []int) []int {
	var out []int
	for r, i := 0, 0; r < p; r++ {
		if i < len(holders) && holders[i] == r {
			i++
			continue
		}
		out = append(out, r)
	}
	return out
}

// readBlobs reads every registered blob.
func (s *State) readBlobs() ([][]byte, error) {
	blobs := make([][]byte, len(s.blobs))
	for i, b := range s.blobs {
		data, err := b.get()
		if err != nil {
			return nil, fmt.Errorf("sync: reading state %q: %w", b.name, err)
		}
		blobs[i] = data
	}
	return blobs, nil
}

// stateDigest is what a rank read of its own state on entering a world
// (Session.stateRoot), for the transfer that follows (broadcast).
type stateDigest struct {
	// sum is the whole state's digest: the step, the registrations, every
	// tensor's digest and every blob's bytes; whole is false when there is
	// none (a tensor in device memory, or a rank that holds no state yet
	// and read only its tensors).
	sum   uint64
	whole bool
	// blobs are the blobs as read for sum, for a broadcast from this rank.
	blobs [][]byte
	// tensors is each tensor's digest (62 bits), or noDigest for one that
	// cannot be read from the host.
	tensors []int64
}

// noDigest marks a tensor whose digest cannot be taken from the host.
const noDigest = -1

// readBlobs returns the blobs read for the whole digest, nil when there
// are none (d may be nil).
func (d *stateDigest) readBlobs() [][]byte {
	if d == nil || !d.whole {
		return nil
	}
	return d.blobs
}

// tensorDigests returns each registered tensor's digest: xxhash of its
// bytes, shifted to 62 bits (see differing), or noDigest for a tensor in
// device memory. The registrations (names, dtypes, counts) are compared
// apart, before the digests are.
func (s *State) tensorDigests() []int64 {
	out := make([]int64, len(s.tensors))
	for i, t := range s.tensors {
		if t.buf.Device != nil || len(t.buf.Host) < t.buf.Bytes() {
			out[i] = noDigest
			continue
		}
		out[i] = int64(xxhash.Sum64(t.buf.Host[:t.buf.Bytes()]) >> 2)
	}
	return out
}

// digest takes every tensor's digest and, when all of them can be read
// from the host, reads the blobs and takes the whole state's (see
// stateDigest).
func (s *State) digest() (*stateDigest, error) {
	d := &stateDigest{tensors: s.tensorDigests()}
	if slices.Contains(d.tensors, noDigest) {
		return d, nil
	}
	blobs, err := s.readBlobs()
	if err != nil {
		return nil, err
	}
	h := xxhash.New()
	var word [8]byte
	binary.LittleEndian.PutUint64(word[:], uint64(s.Step))
	h.Write(word[:])
	h.Write(s.describe(blobs))
	for _, t := range d.tensors {
		binary.LittleEndian.PutUint64(word[:], uint64(t))
		h.Write(word[:])
	}
	for _, b := range blobs {
		h.Write(b)
	}
	d.sum, d.whole, d.blobs = h.Sum64(), true, blobs
	return d, nil
}

// maxDescription bounds the description a rank accepts: names are short, and
// a corrupted length must not allocate gigabytes.
const maxDescription = 64 << 20

// describe encodes the registrations: the tensor and blob counts, then each
// tensor's name, dtype and element count and each blob's name and size.
func (s *State) describe(blobs [][]byte) []byte {
	b := binary.AppendUvarint(nil, uint64(len(s.tensors)))
	b = binary.AppendUvarint(b, uint64(len(s.blobs)))
	for _, t := range s.tensors {
		b = binary.AppendUvarint(b, uint64(len(t.name)))
		b = append(b, t.name...)
		b = append(b, byte(t.buf.DType))
		b = binary.AppendUvarint(b, uint64(t.buf.Count))
	}
	for i, bl := range s.blobs {
		b = binary.AppendUvarint(b, uint64(len(bl.name)))
		b = append(b, bl.name...)
		b = binary.AppendUvarint(b, uint64(len(blobs[i])))
	}
	return b
}

// compare checks root's description against this rank's registrations and
// returns root's blob sizes.
func (s *State) compare(desc []byte, root int) ([]int, error) {
	r := descReader{b: desc}
	nt, nb := r.uvarint(), r.uvarint()
	if r.err == nil && (nt != uint64(len(s.tensors)) || nb != uint64(len(s.blobs))) {
		return nil, fmt.Errorf("%w: rank %d registers %d tensors and %d blobs, this worker %d and %d (%s)",
			ErrStateMismatch, root, nt, nb, len(s.tensors), len(s.blobs), s.names())
	}
	for _, t := range s.tensors {
		name, dt, count := r.string(), collective.DType(r.byte()), r.uvarint()
		switch {
		case r.err != nil:
		case name != t.name:
			return nil, fmt.Errorf("%w: state tensor %q here is %q on rank %d (registered in another order?)", ErrStateMismatch, t.name, name, root)
		case dt != t.buf.DType:
			return nil, fmt.Errorf("%w: state tensor %q is %v here but %v on rank %d", ErrStateMismatch, t.name, t.buf.DType, dt, root)
		case count != uint64(t.buf.Count):
			return nil, fmt.Errorf("%w: state tensor %q has %d elements here but %d on rank %d", ErrStateMismatch, t.name, t.buf.Count, count, root)
		}
	}
	sizes := make([]int, len(s.blobs))
	for i, b := range s.blobs {
		name, size := r.string(), r.uvarint()
		switch {
		case r.err != nil:
		case name != b.name:
			return nil, fmt.Errorf("%w: state blob %q here is %q on rank %d (registered in another order?)", ErrStateMismatch, b.name, name, root)
		case size > maxDescription:
			return nil, fmt.Errorf("%w: state blob %q of %d bytes on rank %d", ErrStateMismatch, b.name, size, root)
		}
		sizes[i] = int(size)
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: malformed description from rank %d: %v", ErrStateMismatch, root, r.err)
	}
	return sizes, nil
}

// names lists the registrations, for an error message.
func (s *State) names() string {
	var parts []string
	for _, t := range s.tensors {
		parts = append(parts, fmt.Sprintf("%s %v[%d]", t.name, t.buf.DType, t.buf.Count))
	}
	for _, b := range s.blobs {
		parts = append(parts, b.name+" blob")
	}
	if len(parts) == 0 {
		return "nothing here"
	}
	return "here: " + strings.Join(parts, ", ")
}

// descReader decodes a description; the first error sticks and later reads
// return zero values.
type descReader struct {
	b   []byte
	err error
}

func (r *descReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *descReader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errors.New("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *descReader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = errors.New("truncated name")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
