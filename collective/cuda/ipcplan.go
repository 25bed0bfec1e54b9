package cuda

// The decisions of the same-host path (ipc.go) that need no GPU: the records
// ranks exchange, how every rank reaches the same verdict from them, how a
// buffer is split into per-rank shares, and the cache of mapped peer
// allocations. This file has no build tag, so the default build tests it.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gorovod/gorovod/collective"
)

// ipcHandle is a CUDA IPC memory handle (CU_IPC_HANDLE_SIZE bytes, checked
// in driver.go).
type ipcHandle [64]byte

// recordVersion leads every record, so ranks built from different sources
// fail loudly instead of misreading each other.
const recordVersion = 1

// maxReason is how many bytes of a rank's failure reason travel to the others.
const maxReason = 180

// groupRecordSize is the size of a groupRecord on the wire.
const groupRecordSize = 1 + 1 + 32 + 16 + 64 + 2 + maxReason

// groupRecord is what each rank tells the others when a SameHostGroup is
// made: where it runs, which GPU, and the handle of a probe allocation the
// others open to prove the IPC path works.
type groupRecord struct {
	OK     bool     // the rank could open its device, read its identity and export the probe
	Reason string   // why not, when !OK (truncated to maxReason bytes)
	HostID [32]byte // hash of the host's name and boot id
	UUID   [16]byte // the GPU's UUID
	Probe  ipcHandle
}

func (g groupRecord) marshal() []byte {
	b := make([]byte, groupRecordSize)
	b[0] = recordVersion
	if g.OK {
		b[1] = 1
	}
	copy(b[2:34], g.HostID[:])
	copy(b[34:50], g.UUID[:])
	copy(b[50:114], g.Probe[:])
	reason := g.Reason
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	binary.LittleEndian.PutUint16(b[114:116], uint16(len(reason)))
	copy(b[116:], reason)
	return b
}

func unmarshalGroupRecord(b []byte) (groupRecord, error) {
	var g groupRecord
	if len(b) != groupRecordSize {
		return g, fmt.Errorf("group record of %d bytes, want %d", len(b), groupRecordSize)
	}
	if b[0] != recordVersion {
		return g, fmt.Errorf("group record version %d, want %d (ranks run different gorovod builds)", b[0], recordVersion)
	}
	g.OK = b[1] == 1
	copy(g.HostID[:], b[2:34])
	copy(g.UUID[:], b[34:50])
	copy(g.Probe[:], b[50:114])
	n := int(binary.LittleEndian.Uint16(b[114:116]))
	if n > maxReason {
		return g, fmt.Errorf("group record reason of %d bytes, at most %d", n, maxReason)
	}
	g.Reason = string(b[116 : 116+n])
	return g, nil
}

// unmarshalGroupRecords splits an allgather of p records.
func unmarshalGroupRecords(b []byte, p int) ([]groupRecord, error) {
	if len(b) != p*groupRecordSize {
		return nil, fmt.Errorf("%d bytes of group records for %d ranks", len(b), p)
	}
	recs := make([]groupRecord, p)
	for r := range p {
		var err error
		if recs[r], err = unmarshalGroupRecord(b[r*groupRecordSize : (r+1)*groupRecordSize]); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return recs, nil
}

// decideGroup is the verdict every rank reaches from the same records: ""
// when every rank is ready and all run on one host, else why the group must
// use the host path. Ranks on different GPUs of one host may still share
// memory (the driver enables peer access); the probe settles that.
func decideGroup(recs []groupRecord) string {
	for r, g := range recs {
		if !g.OK {
			return fmt.Sprintf("rank %d: %s", r, g.Reason)
		}
	}
	for r, g := range recs {
		if g.HostID != recs[0].HostID {
			return fmt.Sprintf("rank %d runs on another host than rank 0", r)
		}
	}
	return ""
}

// firstFailure is the verdict from every rank's probe status (as groupRecord
// OK and Reason): "" when all succeeded.
func firstFailure(recs []groupRecord) string {
	for r, g := range recs {
		if !g.OK {
			return fmt.Sprintf("rank %d: %s", r, g.Reason)
		}
	}
	return ""
}

// hostID identifies a host from its name and boot id (either may be empty
// where it cannot be read; containers on one host share the boot id).
func hostID(hostname, bootID string) [32]byte {
	return sha256.Sum256([]byte(hostname + "\x00" + bootID))
}

// callRecordSize is the size of a callRecord on the wire.
const callRecordSize = 1 + 1 + 1 + 1 + 8 + 64 + 8 + 64 + 8

// callRecord is what each rank tells the others at the start of one
// allreduce: what it reduces, and where its source and destination
// allocations are (handle plus offset into the allocation).
type callRecord struct {
	OK     bool // both buffers could be exported
	DType  collective.DType
	Op     collective.ReduceOp
	Count  uint64
	Src    ipcHandle
	SrcOff uint64
	Dst    ipcHandle
	DstOff uint64
}

func (c callRecord) marshal() []byte {
	b := make([]byte, callRecordSize)
	b[0] = recordVersion
	if c.OK {
		b[1] = 1
	}
	b[2], b[3] = byte(c.DType), byte(c.Op)
	binary.LittleEndian.PutUint64(b[4:12], c.Count)
	copy(b[12:76], c.Src[:])
	binary.LittleEndian.PutUint64(b[76:84], c.SrcOff)
	copy(b[84:148], c.Dst[:])
	binary.LittleEndian.PutUint64(b[148:156], c.DstOff)
	return b
}

func unmarshalCallRecords(b []byte, p int) ([]callRecord, error) {
	if len(b) != p*callRecordSize {
		return nil, fmt.Errorf("%d bytes of call records for %d ranks", len(b), p)
	}
	recs := make([]callRecord, p)
	for r := range p {
		x := b[r*callRecordSize : (r+1)*callRecordSize]
		if x[0] != recordVersion {
			return nil, fmt.Errorf("rank %d: call record version %d, want %d", r, x[0], recordVersion)
		}
		c := &recs[r]
		c.OK = x[1] == 1
		c.DType, c.Op = collective.DType(x[2]), collective.ReduceOp(x[3])
		c.Count = binary.LittleEndian.Uint64(x[4:12])
		copy(c.Src[:], x[12:76])
		c.SrcOff = binary.LittleEndian.Uint64(x[76:84])
		copy(c.Dst[:], x[84:148])
		c.DstOff = binary.LittleEndian.Uint64(x[148:156])
	}
	return recs, nil
}

// decideCall is the verdict on one allreduce from every rank's record: an
// error when the ranks disagree on what they reduce (the same on every rank,
// since all see the same records), else whether every rank's buffers can be
// shared.
func decideCall(recs []callRecord) (ipc bool, err error) {
	for r, c := range recs {
		if c.DType != recs[0].DType || c.Op != recs[0].Op || c.Count != recs[0].Count {
			return false, fmt.Errorf("rank %d reduces %d %v with %v but rank 0 %d %v with %v",
				r, c.Count, c.DType, c.Op, recs[0].Count, recs[0].DType, recs[0].Op)
		}
	}
	for _, c := range recs {
		if !c.OK {
			return false, nil
		}
	}
	return true, nil
}

// sameMappings reports whether cur names, rank by rank, exactly the send
// and receive allocations prev did (offsets aside: a mapping covers the
// whole allocation), every one of them exported.
func sameMappings(prev, cur []callRecord) bool {
	if len(prev) == 0 || len(prev) != len(cur) {
		return false
	}
	for r := range cur {
		if !prev[r].OK || !cur[r].OK || prev[r].Src != cur[r].Src || prev[r].Dst != cur[r].Dst {
			return false
		}
	}
	return true
}

// shareRange is the elements [lo, hi) of count that rank r of p reduces:
// contiguous shares in rank order, the first count%p one element longer.
func shareRange(count, p, r int) (lo, hi int) {
	q, rem := count/p, count%p
	lo = r*q + min(r, rem)
	hi = lo + q
	if r < rem {
		hi++
	}
	return lo, hi
}

// finalScaling is what the rank that finishes a share applies, as the host
// path does: the postscale factor and, for Average, the division by p,
// folded into the factor for floating-point types and an integer division
// otherwise.
func finalScaling(dt collective.DType, op collective.ReduceOp, post float64, p int) (factor float64, divisor int) {
	if op != collective.Average || p == 1 {
		return post, 1
	}
	if dt.IsFloat() {
		return post / float64(p), 1
	}
	return post, p
}

// mapCache keeps peers' allocations mapped, so that an allreduce on buffers
// seen before opens nothing (cuIpcOpenMemHandle costs far more than the
// reduction of a small buffer). Handles are unique per allocation (a freed
// and reallocated range gets a new one), so a handle is a safe key; the
// least recently used mapping is closed past max entries, which bounds how
// long a peer's freed allocation stays mapped here.
type mapCache struct {
	max     int
	open    func(ipcHandle) (uintptr, error)
	close   func(uintptr) error
	entries []mapEntry // most recently used last
}

type mapEntry struct {
	h   ipcHandle
	ptr uintptr
}

// get returns the mapping of h, opening it if needed.
func (m *mapCache) get(h ipcHandle) (uintptr, error) {
	for i, e := range m.entries {
		if e.h == h {
			copy(m.entries[i:], m.entries[i+1:])
			m.entries[len(m.entries)-1] = e
			return e.ptr, nil
		}
	}
	p, err := m.open(h)
	if err != nil {
		return 0, err
	}
	var closeErr error
	for len(m.entries) >= max(m.max, 1) {
		closeErr = m.close(m.entries[0].ptr)
		m.entries = m.entries[1:]
	}
	m.entries = append(m.entries, mapEntry{h: h, ptr: p})
	return p, closeErr
}

// closeAll unmaps everything, keeping the first error.
func (m *mapCache) closeAll() error {
	var first error
	for _, e := range m.entries {
		if err := m.close(e.ptr); err != nil && first == nil {
			first = err
		}
	}
	m.entries = nil
	return first
}

// probePattern is what rank r writes into its probe allocation of n bytes,
// for the others to read back through their mapping.
func probePattern(r, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r*131 + i*7 + 1)
	}
	return b
}

// checkProbe compares what was read through the mapping of rank r's probe.
func checkProbe(r int, got []byte) error {
	want := probePattern(r, len(got))
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		return fmt.Errorf("rank %d's probe read back wrong at byte %d: %#x, want %#x", r, i, got[i], want[i])
	}
	return nil
}
