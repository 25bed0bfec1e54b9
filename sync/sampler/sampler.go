package sampler

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// Config describes the data set a Sampler walks and how.
type Config struct {
	// N is the number of samples in the data set (at least 1).
	N int
	// Seed selects the shuffle; every rank must use the same one.
	Seed uint64
	// Shuffle permutes each data epoch; off, every epoch visits 0..N-1 in order.
	Shuffle bool
	// DropLast skips the final global batch of an epoch when it would be smaller
	// than the requested global batch, as PyTorch's drop_last does. Off, the last
	// step of an epoch is simply smaller. It is not part of Position because it does
	// not change which samples come before the cut, only whether the tail runs.
	DropLast bool
}

// Sampler hands out the sample indices of an elastic data-parallel job so that,
// within a data epoch, every index is processed exactly once by the world as a
// whole, however often the world is resized or a step fails and is redone.
//
// The trick is that the position in the epoch is a property of the world, not
// of a rank: the epoch's permutation depends only on (Seed, epoch), each global
// step takes the next Global indices of it, and the per-rank split is computed
// afresh from (rank, size) at every step. So the only state is (epoch, number of
// samples the world has committed), which fits in Position, is identical on all
// ranks and is what the elastic layer broadcasts to a joining worker.
//
// The protocol per step, identical on every rank:
//
//	st, err := s.Batch(rank, size, globalBatch)
//	if st.Global == 0 { /* epoch over: evaluate, then */ s.NextEpoch(); continue }
//	// ... forward/backward on st.Indices, allreduce, optimizer update, commit ...
//	s.Advance(st.Global) // only once the step has committed
//
// A step that fails before it commits is redone from the restored state with the
// new (rank, size): it gets the same Global indices, split among the new ranks.
//
// Uneven splits: the first Global%size ranks get one sample more (Split), and
// when Global < size some ranks get none. The exact global mean gradient is then
// sum_over_ranks(sum of per-sample gradients)/Global: each rank scales its sum
// by 1/st.Global and the world allreduces with Sum, or, equivalently, each rank
// scales its local mean by len(st.Indices)*size/st.Global before an Average
// allreduce. A rank with no samples contributes zeros but must still take part.
//
// A Sampler is not safe for concurrent use; the trainer loop owns it.
type Sampler struct {
	cfg       Config
	epoch     uint64
	processed int
	// perm caches the permutation of permEpoch; permOK says whether it is valid
	// (the zero epoch is a real epoch, so a sentinel value would not do).
	perm      []int
	permEpoch uint64
	permOK    bool
}

// Batch is one rank's share of one global step.
type Batch struct {
	// Epoch is the data epoch the indices belong to.
	Epoch uint64
	// Start is the position in the epoch's permutation where this global batch
	// begins (the number of samples the world had committed before it).
	Start int
	// Global is the number of samples the whole world processes in this step,
	// the value to pass to Advance once the step commits. Zero means the epoch
	// has no further steps (everything processed, or DropLast cut the tail).
	Global int
	// Indices are this rank's sample indices, a fresh slice the caller may keep.
	Indices []int
}

// Errors returned by Sampler methods, wrapped with detail; test with errors.Is.
var (
	ErrInvalidConfig    = errors.New("sampler: invalid sampler config")
	ErrInvalidBatch     = errors.New("sampler: invalid rank, size or batch")
	ErrAdvance          = errors.New("sampler: advance past the end of the epoch")
	ErrPositionMismatch = errors.New("sampler: sampler state is for a different data set or seed")
	ErrPositionEncoding = errors.New("sampler: malformed sampler state")
)

// New returns a Sampler positioned at the start of data epoch 0.
func New(cfg Config) (*Sampler, error) {
	if cfg.N < 1 {
		return nil, fmt.Errorf("%w: N = %d, need at least 1", ErrInvalidConfig, cfg.N)
	}
	return &Sampler{cfg: cfg}, nil
}

// Config returns the sampler's configuration.
func (s *Sampler) Config() Config { return s.cfg }

// Epoch returns the current data epoch.
func (s *Sampler) Epoch() uint64 { return s.epoch }

// Processed returns how many samples of the current epoch the world has committed.
func (s *Sampler) Processed() int { return s.processed }

// Remaining returns how many samples of the current epoch are still to be processed.
func (s *Sampler) Remaining() int { return s.cfg.N - s.processed }

// SetEpoch moves to data epoch e at its start. Setting the epoch the sampler is
// already in keeps the position, so a trainer that calls SetEpoch(e) at the top
// of its epoch loop resumes mid-epoch after a Restore instead of starting over.
func (s *Sampler) SetEpoch(e uint64) {
	if e == s.epoch {
		return
	}
	s.epoch, s.processed = e, 0
}

// NextEpoch moves to the start of the following data epoch.
func (s *Sampler) NextEpoch() { s.SetEpoch(s.epoch + 1) }

// Batch returns rank's share of the next global step of the current epoch for a
// world of size ranks and a global batch of globalBatch samples. It does not
// move the position: call Advance(st.Global) once the step has committed, so a
// step that fails and is redone, perhaps with another world size, sees the same
// samples. Every rank must call it with the same size and globalBatch.
func (s *Sampler) Batch(rank, size, globalBatch int) (Batch, error) {
	if size < 1 || rank < 0 || rank >= size || globalBatch < 1 {
		return Batch{}, fmt.Errorf("%w: rank %d, size %d, global batch %d", ErrInvalidBatch, rank, size, globalBatch)
	}
	st := Batch{Epoch: s.epoch, Start: s.processed}
	global := min(globalBatch, s.Remaining())
	if s.cfg.DropLast && global < globalBatch {
		global = 0
	}
	st.Global = global
	if global == 0 {
		return st, nil
	}
	off, n := Split(global, rank, size)
	perm := s.permutation()
	lo := s.processed + off
	st.Indices = append([]int(nil), perm[lo:lo+n]...)
	return st, nil
}

// Advance records that the world committed a step of global samples (the
// Global of the Batch it ran). Call it on every rank with the same value, only
// after the step's update is committed.
func (s *Sampler) Advance(global int) error {
	if global < 0 || global > s.Remaining() {
		return fmt.Errorf("%w: advancing by %d with %d of %d remaining in epoch %d",
			ErrAdvance, global, s.Remaining(), s.cfg.N, s.epoch)
	}
	s.processed += global
	return nil
}

// Split divides count items among size ranks in rank order and returns the
// offset and length of rank's contiguous share: the first count%size ranks get
// one item more, as Horovod and the autoscaling engine split a global batch.
// Out-of-range arguments (size < 1, rank outside [0, size), count < 0) give an
// empty share rather than a panic.
func Split(count, rank, size int) (offset, length int) {
	if size < 1 || rank < 0 || rank >= size || count < 0 {
		return 0, 0
	}
	base, extra := count/size, count%size
	if rank < extra {
		return rank * (base + 1), base + 1
	}
	return extra*(base+1) + (rank-extra)*base, base
}

// permutation returns the cached order of the current epoch, building it on
// first use.
func (s *Sampler) permutation() []int {
	if !s.permOK || s.permEpoch != s.epoch {
		s.perm = fillPermutation(s.perm, s.cfg.N, s.cfg.Seed, s.epoch, s.cfg.Shuffle)
		s.permEpoch, s.permOK = s.epoch, true
	}
	return s.perm
}

// Permutation returns the order in which a shuffling sampler with n samples and
// the given seed visits data epoch epoch. It is a pure function of its
// arguments and fixed across Go versions and platforms (its own generator and
// bounded-integer reduction, not math/rand's, whose streams may change), so
// ranks built separately still agree.
func Permutation(n int, seed, epoch uint64) []int {
	return fillPermutation(nil, n, seed, epoch, true)
}

func fillPermutation(dst []int, n int, seed, epoch uint64, shuffle bool) []int {
	if cap(dst) >= n {
		dst = dst[:n]
	} else {
		dst = make([]int, n)
	}
	for i := range dst {
		dst[i] = i
	}
	if !shuffle {
		return dst
	}
	// mix64 is a bijection, so for one seed distinct epochs start distinct streams.
	r := splitMix{state: mix64(mix64(seed) ^ epoch)}
	for i := n - 1; i > 0; i-- { // Fisher–Yates
		j := int(r.below(uint64(i) + 1))
		dst[i], dst[j] = dst[j], dst[i]
	}
	return dst
}

// splitMix is SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, statistically
// good enough for shuffling, and specified here so its stream never changes.
type splitMix struct{ state uint64 }

func (r *splitMix) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	return mix64(r.state)
}

// below returns a uniform value in [0, n) by Lemire's multiply-shift with
// rejection, which avoids the modulo bias of next()%n.
func (r *splitMix) below(n uint64) uint64 {
	hi, lo := bits.Mul64(r.next(), n)
	if lo < n {
		threshold := -n % n
		for lo < threshold {
			hi, lo = bits.Mul64(r.next(), n)
		}
	}
	return hi
}

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Position is a Sampler's resumable position: small, identical on every rank, and
// part of the state the elastic layer commits and broadcasts. N, Seed and
// Shuffle are carried so that Restore can refuse a state from another data set.
type Position struct {
	N         uint64
	Seed      uint64
	Shuffle   bool
	Epoch     uint64
	Processed uint64
}

// PositionSize is the length of an encoded Position.
const PositionSize = 40

// positionMagic and positionVersion open every encoded Position so that a stray buffer
// is rejected rather than misread.
const (
	positionMagic   = "GSMP"
	positionVersion = 1
	flagShuffle     = 1 << 0
)

// Position returns the sampler's current position.
func (s *Sampler) Position() Position {
	return Position{
		N:         uint64(s.cfg.N),
		Seed:      s.cfg.Seed,
		Shuffle:   s.cfg.Shuffle,
		Epoch:     s.epoch,
		Processed: uint64(s.processed),
	}
}

// Restore moves the sampler to st, which must come from a sampler with the same
// N, Seed and Shuffle.
func (s *Sampler) Restore(st Position) error {
	if st.N != uint64(s.cfg.N) || st.Seed != s.cfg.Seed || st.Shuffle != s.cfg.Shuffle {
		return fmt.Errorf("%w: state has N=%d seed=%d shuffle=%t, sampler has N=%d seed=%d shuffle=%t",
			ErrPositionMismatch, st.N, st.Seed, st.Shuffle, s.cfg.N, s.cfg.Seed, s.cfg.Shuffle)
	}
	if st.Processed > st.N {
		return fmt.Errorf("%w: processed %d > N %d", ErrPositionEncoding, st.Processed, st.N)
	}
	s.epoch, s.processed = st.Epoch, int(st.Processed)
	return nil
}

// MarshalBinary encodes the sampler's position (its Position), and
// UnmarshalBinary restores one, so that a trainer can hand the sampler to the
// elastic state directly:
//
//	state.RegisterBlob("sampler", sampler.MarshalBinary, sampler.UnmarshalBinary)
func (s *Sampler) MarshalBinary() ([]byte, error) { return s.Position().MarshalBinary() }

// UnmarshalBinary decodes a Position and restores it (see MarshalBinary); on error
// the position is unchanged.
func (s *Sampler) UnmarshalBinary(b []byte) error {
	var st Position
	if err := st.UnmarshalBinary(b); err != nil {
		return err
	}
	return s.Restore(st)
}

// MarshalBinary encodes st in PositionSize bytes: magic "GSMP", version, flags,
// two zero bytes, then N, Seed, Epoch, Processed as little-endian uint64.
func (st Position) MarshalBinary() ([]byte, error) {
	b := make([]byte, PositionSize)
	copy(b, positionMagic)
	b[4] = positionVersion
	if st.Shuffle {
		b[5] = flagShuffle
	}
	binary.LittleEndian.PutUint64(b[8:], st.N)
	binary.LittleEndian.PutUint64(b[16:], st.Seed)
	binary.LittleEndian.PutUint64(b[24:], st.Epoch)
	binary.LittleEndian.PutUint64(b[32:], st.Processed)
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced. It accepts only the
// canonical encoding (exact length, known version and flags, zero padding,
// Processed <= N), so a decoded state re-encodes to the same bytes, and it
// leaves st untouched on error.
func (st *Position) UnmarshalBinary(b []byte) error {
	if len(b) != PositionSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrPositionEncoding, len(b), PositionSize)
	}
	if string(b[:4]) != positionMagic {
		return fmt.Errorf("%w: bad magic %q", ErrPositionEncoding, b[:4])
	}
	if b[4] != positionVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrPositionEncoding, b[4], positionVersion)
	}
	if b[5]&^flagShuffle != 0 || b[6] != 0 || b[7] != 0 {
		return fmt.Errorf("%w: unknown flags %#x or nonzero padding", ErrPositionEncoding, b[5:8])
	}
	out := Position{
		N:         binary.LittleEndian.Uint64(b[8:]),
		Seed:      binary.LittleEndian.Uint64(b[16:]),
		Shuffle:   b[5]&flagShuffle != 0,
		Epoch:     binary.LittleEndian.Uint64(b[24:]),
		Processed: binary.LittleEndian.Uint64(b[32:]),
	}
	if out.Processed > out.N {
		return fmt.Errorf("%w: processed %d > N %d", ErrPositionEncoding, out.Processed, out.N)
	}
	*st = out
	return nil
}
