package collective

import "hash/fnv"

// segPlan lays out a buffer as p consecutive segments (one per rank, possibly of
// different sizes) and cuts every segment into the same number of chunks, so
// that chunk j of one ring step maps onto chunk j of the next.
type segPlan struct {
	esz int
	off []int // element offset of each segment; len p+1
	// at, when set, places segment i at element offset at[i] instead of
	// off[i] (segments off[i+1]-off[i] long, anywhere in the buffer): the
	// blocks of some ranks of a world, for a hierarchical allgather.
	at       []int
	nchunks  int
	maxChunk int // bytes of the largest chunk
}

// set lays out counts (per-segment element counts) of esz-byte elements,
// chunkBytes to a chunk at most, reusing pl's memory.
func (pl *segPlan) set(counts []int, esz, chunkBytes int) {
	pl.esz = esz
	pl.at = nil
	pl.off = resize(pl.off, len(counts)+1)
	pl.off[0] = 0
	longest := 0
	for i, n := range counts {
		pl.off[i+1] = pl.off[i] + n
		longest = max(longest, n)
	}
	perChunk := max(1, chunkBytes/esz)
	pl.nchunks = max(1, (longest+perChunk-1)/perChunk)
	pl.maxChunk = (longest + pl.nchunks - 1) / pl.nchunks * esz
}

// setAt is set for segments at the element offsets starts (as long as
// counts); starts must stay unchanged while the plan is used.
func (pl *segPlan) setAt(counts, starts []int, esz, chunkBytes int) {
	pl.set(counts, esz, chunkBytes)
	pl.at = starts
}

// start is the element offset of segment seg.
func (pl *segPlan) start(seg int) int {
	if pl.at != nil {
		return pl.at[seg]
	}
	return pl.off[seg]
}

// resize returns s with length n, reusing its memory when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// chunk returns the byte offset and length of chunk j of segment seg.
func (pl *segPlan) chunk(seg, j int) (off, n int) {
	s0, l := pl.start(seg), pl.off[seg+1]-pl.off[seg]
	a := s0 + j*l/pl.nchunks
	b := s0 + (j+1)*l/pl.nchunks
	return a * pl.esz, (b - a) * pl.esz
}

// segment returns the byte offset and length of segment seg.
func (pl *segPlan) segment(seg int) (off, n int) {
	return pl.start(seg) * pl.esz, (pl.off[seg+1] - pl.off[seg]) * pl.esz
}

// bytes is the size of segment seg in bytes.
func (pl *segPlan) bytes(seg int) int { return (pl.off[seg+1] - pl.off[seg]) * pl.esz }

// evenCounts splits n elements over p ranks as Horovod does: the first n%p ranks
// get one more.
func evenCounts(n, p int) []int { return evenCountsInto(nil, n, p) }

// evenCountsInto is evenCounts writing into counts' memory when it can.
func evenCountsInto(counts []int, n, p int) []int {
	counts = resize(counts, p)
	for i := range counts {
		counts[i] = n / p
		if i < n%p {
			counts[i]++
		}
	}
	return counts
}

// layoutHash summarizes per-rank counts for the frame header, so ranks that
// disagree on a variable layout see a mismatch before any payload moves.
func layoutHash(counts []int) uint32 {
	h := fnv.New32a()
	var b [8]byte
	for _, n := range counts {
		for i := range b {
			b[i] = byte(uint64(n) >> (8 * i))
		}
		h.Write(b[:])
	}
	return h.Sum32()
}

// scratchBuf returns the lane's receive staging, at least n bytes. Only the
// collective holding opMu uses it, from the lane's goroutine.
func (ln *lane) scratchBuf(n int) []byte {
	if cap(ln.scratch) < n {
		ln.scratch = make([]byte, n)
	}
	return ln.scratch[:cap(ln.scratch)]
}

// stagingFor returns the lane's send staging for device memory, nil for host
// memory (which is sent from where it lies).
func (ln *lane) stagingFor(m memory, n int) []byte {
	if m.dev == nil {
		return nil
	}
	if cap(ln.staging) < n {
		ln.staging = make([]byte, n)
	}
	return ln.staging[:cap(ln.staging)]
}
