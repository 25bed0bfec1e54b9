package shm

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
)

// Region layout, little-endian; every offset is from the start of the mapping
// and the counters written by different processes sit on different cache lines
// (a line written by one side and polled by the other is the only traffic
// between the cores on the fast path):
//
//	page 0  region header
//	        0   magic     "GVSHMRG1"
//	        8   version   uint32
//	        16  ringBytes uint64
//	        24  job       uint64  JobHash of the world's job
//	        32  epoch     uint64
//	        40  lo, hi    uint32  the pair's ranks
//	        64  closed[0] uint32  set by the lower rank's Close   (own line)
//	        128 closed[1] uint32  set by the higher rank's Close  (own line)
//	page 1  control of ring 0 (lower rank → higher rank)
//	page 2  control of ring 1 (higher rank → lower rank)
//	        0   tail         uint64  bytes ever published by the producer
//	        64  head         uint64  bytes ever consumed by the consumer
//	        128 dataWaiting  uint32  the consumer is parked (or about to be)
//	        192 spaceWaiting uint32  the producer is parked (or about to be)
//	        256 acked        uint64  last single-copy frame the consumer finished
//	        320 withdrawn    uint64  last single-copy frame the producer gave up on
//	page 3  ring 0 data, ringBytes
//	        ring 1 data, ringBytes
//
// A ring holds records back to back, each a multiple of recordAlign bytes and
// starting with a head of recordAlign bytes: the frame's HeaderSize header, at
// offKind the record kind and, for a single-copy record, at offAddr the
// payload's address in the sender's memory and at offSeq the record's sequence
// number (uint64 each). An inline record (recInline) continues with the
// payload, padded to a multiple of recordAlign; a single-copy record
// (recSingle) is the head alone: the payload stays where it is until the
// receiver has copied it (see link_linux.go). Since the ring's size is a
// multiple of recordAlign, a head never wraps, and every payload starts
// cache-line aligned.
const (
	regionMagic   = "GVSHMRG1"
	regionVersion = 1
	pageSize      = 4096
	headerPages   = 3

	offRingBytes = 16
	offJob       = 24
	offEpoch     = 32
	offLo        = 40
	offHi        = 44
	offClosed0   = 64
	offClosed1   = 128

	offTail         = 0
	offHead         = 64
	offDataWaiting  = 128
	offSpaceWaiting = 192
	offAcked        = 256
	offWithdrawn    = 320

	recordAlign = 128
	offKind     = transport.HeaderSize
	offAddr     = transport.HeaderSize + 8
	offSeq      = transport.HeaderSize + 16

	recInline = 0
	recSingle = 1
)

// The record head must hold the frame header and the record's own fields: a
// negative array length stops the build if the frame header outgrows it.
var _ [recordAlign - (transport.HeaderSize + 24)]struct{}

func regionSize(ringBytes int) int { return headerPages*pageSize + 2*ringBytes }

// File names: filePrefix + stem fields joined by '-' + '.' + kind.
const filePrefix = "gorovod-shm-"

// The files of one pair: the region and, per side, the FIFO its receiver parks
// on (d) and the one its sender parks on (s).
const numFileKinds = 5

func fileKind(k int) string {
	return [numFileKinds]string{"region", "d0", "s0", "d1", "s1"}[k]
}

// procID identifies a process across pid reuse: its pid, its start time in
// clock ticks since boot, and its pid namespace (pids of other namespaces mean
// nothing here).
type procID struct {
	pid   int
	start uint64
	ns    uint64
}

func selfProcID() (procID, error) {
	start, err := procStart(os.Getpid())
	if err != nil {
		return procID{}, err
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return procID{}, fmt.Errorf("shm: pid namespace: %w", err)
	}
	return procID{pid: os.Getpid(), start: start, ns: st.Ino}, nil
}

// procStart reads a process's start time (field 22 of /proc/pid/stat).
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: skip past the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("shm: malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("shm: short /proc stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the process p still runs (false once it exited, even if
// its pid was reused).
func (p procID) alive() bool {
	start, err := procStart(p.pid)
	return err == nil && start == p.start
}

// stem names the files of one pair of one world, created by process p.
type stem struct {
	job    uint64
	epoch  uint64
	lo, hi int
	proc   procID
	nonce  string // 16 hex digits
}

func (s *stem) String() string {
	return fmt.Sprintf("%s%016x-%d-%d-%d-%d-%d-%d-%s", filePrefix, s.job, s.epoch, s.lo, s.hi, s.proc.pid, s.proc.start, s.proc.ns, s.nonce)
}

// parseStem is strict: a stem that does not re-encode to itself is rejected, so
// a peer cannot make this side open a path of its choosing.
func parseStem(name string) (stem, error) {
	bad := func() (stem, error) { return stem{}, fmt.Errorf("shm: malformed region name %q", name) }
	if len(name) > maxStemLen || !strings.HasPrefix(name, filePrefix) {
		return bad()
	}
	// job, epoch, lo, hi, pid, start, ns, nonce
	f := strings.Split(name[len(filePrefix):], "-")
	if len(f) != 8 || len(f[0]) != 16 || len(f[7]) != 16 {
		return bad()
	}
	var nums [7]uint64
	for i := range nums {
		base := 10
		if i == 0 {
			base = 16
		}
		v, err := strconv.ParseUint(f[i], base, 64)
		if err != nil {
			return bad()
		}
		nums[i] = v
	}
	if _, err := hex.DecodeString(f[7]); err != nil {
		return bad()
	}
	if nums[2] > 1<<31 || nums[3] > 1<<31 || nums[4] == 0 || nums[4] > 1<<31 {
		return bad()
	}
	s := stem{job: nums[0], epoch: nums[1], lo: int(nums[2]), hi: int(nums[3]),
		proc: procID{pid: int(nums[4]), start: nums[5], ns: nums[6]}, nonce: f[7]}
	if s.String() != name {
		return bad()
	}
	return s, nil
}

func newStem(job, epoch uint64, lo, hi int, p procID) stem {
	var n [8]byte
	_, _ = rand.Read(n[:])
	return stem{job: job, epoch: epoch, lo: lo, hi: hi, proc: p, nonce: hex.EncodeToString(n[:])}
}

func (s *stem) path(dir string, kind int) string {
	return filepath.Join(dir, s.String()+"."+fileKind(kind))
}

// unlinkAll removes the pair's files; missing ones are fine.
func (s *stem) unlinkAll(dir string) {
	for k := range numFileKinds {
		_ = unix.Unlink(s.path(dir, k))
	}
}

// sweepStale removes the files of setups whose creating process has died (a
// setup unlinks its files once both ranks have opened them, so files that
// outlive their creator were left by a crash in the middle of one). Files of
// other pid namespaces are left alone: their pids cannot be checked from here.
func sweepStale(dir string, self procID) (removed int) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	uid := uint32(os.Geteuid())
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, filePrefix) {
			continue
		}
		dot := strings.LastIndexByte(name, '.')
		if dot < 0 {
			continue
		}
		s, err := parseStem(name[:dot])
		if err != nil || s.proc.ns != self.ns || s.proc == self || s.proc.alive() {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(dir, name), &st) != nil || st.Uid != uid {
			continue
		}
		if unix.Unlink(filepath.Join(dir, name)) == nil {
			removed++
		}
	}
	return removed
}

// region is one pair's mapping.
type region struct {
	mem       []byte
	ringBytes int
}

func u64at(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
func u32at(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

// createRegion creates, sizes and maps the region file and writes its header.
// The caller unlinks the file.
func createRegion(path string, ringBytes int, job, epoch uint64, lo, hi int) (*region, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	defer unix.Close(fd)
	// The umask can only clear bits; make the mode exact anyway.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("shm: chmod %s: %w", path, err)
	}
	size := regionSize(ringBytes)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("shm: size %s: %w", path, err)
	}
	// Allocate the pages now, so a full /dev/shm fails the setup rather than
	// killing the process with SIGBUS at the first write.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return nil, fmt.Errorf("shm: allocate %d bytes in %s: %w", size, filepath.Dir(path), err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	copy(mem, regionMagic)
	binary.LittleEndian.PutUint32(mem[8:], regionVersion)
	binary.LittleEndian.PutUint64(mem[offRingBytes:], uint64(ringBytes))
	binary.LittleEndian.PutUint64(mem[offJob:], job)
	binary.LittleEndian.PutUint64(mem[offEpoch:], epoch)
	binary.LittleEndian.PutUint32(mem[offLo:], uint32(lo))
	binary.LittleEndian.PutUint32(mem[offHi:], uint32(hi))
	return &region{mem: mem, ringBytes: ringBytes}, nil
}

// checkOwned verifies that an opened file is what the creator made: the right
// type, owned by this user, owner-only.
func checkOwned(fd int, path string, fifo bool, size int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("shm: stat %s: %w", path, err)
	}
	want := uint32(unix.S_IFREG)
	if fifo {
		want = unix.S_IFIFO
	}
	switch {
	case st.Mode&unix.S_IFMT != want:
		return fmt.Errorf("shm: %s is not a file of the expected type (mode %#o)", path, st.Mode)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("shm: %s is owned by uid %d, not %d", path, st.Uid, os.Geteuid())
	case st.Mode&0o777 != 0o600:
		return fmt.Errorf("shm: %s has mode %#o, want 0600", path, st.Mode&0o777)
	case !fifo && st.Size != int64(size):
		return fmt.Errorf("shm: %s holds %d bytes, want %d", path, st.Size, size)
	}
	return nil
}

// openRegion maps a region the peer created and checks its header against the
// world it was announced for.
func openRegion(path string, ringBytes int, job, epoch uint64, lo, hi int) (*region, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	size := regionSize(ringBytes)
	if err := checkOwned(fd, path, false, size); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	r := &region{mem: mem, ringBytes: ringBytes}
	if err := r.checkHeader(job, epoch, lo, hi); err != nil {
		r.unmap()
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	return r, nil
}

func (r *region) checkHeader(job, epoch uint64, lo, hi int) error {
	m := r.mem
	switch {
	case string(m[:8]) != regionMagic:
		return errors.New("not a gorovod region")
	case binary.LittleEndian.Uint32(m[8:]) != regionVersion:
		return fmt.Errorf("region version %d, want %d", binary.LittleEndian.Uint32(m[8:]), regionVersion)
	case binary.LittleEndian.Uint64(m[offRingBytes:]) != uint64(r.ringBytes):
		return errors.New("ring size differs from the announced one")
	case binary.LittleEndian.Uint64(m[offJob:]) != job || binary.LittleEndian.Uint64(m[offEpoch:]) != epoch:
		return errors.New("region of another job or epoch")
	case binary.LittleEndian.Uint32(m[offLo:]) != uint32(lo) || binary.LittleEndian.Uint32(m[offHi:]) != uint32(hi):
		return errors.New("region of another pair of ranks")
	}
	return nil
}

func (r *region) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

// ring is one direction's view of the region.
type ring struct {
	tail, head                *uint64
	acked, withdrawn          *uint64
	dataWaiting, spaceWaiting *uint32
	data                      []byte
	size                      uint64
	mask                      uint64
}

func (r *region) ring(dir int) ring {
	ctl := (1 + dir) * pageSize
	data := headerPages*pageSize + dir*r.ringBytes
	return ring{
		tail:         u64at(r.mem, ctl+offTail),
		head:         u64at(r.mem, ctl+offHead),
		acked:        u64at(r.mem, ctl+offAcked),
		withdrawn:    u64at(r.mem, ctl+offWithdrawn),
		dataWaiting:  u32at(r.mem, ctl+offDataWaiting),
		spaceWaiting: u32at(r.mem, ctl+offSpaceWaiting),
		data:         r.mem[data : data+r.ringBytes : data+r.ringBytes],
		size:         uint64(r.ringBytes),
		mask:         uint64(r.ringBytes - 1),
	}
}

// closedFlag is side's closed flag (0 the lower rank, 1 the higher).
func (r *region) closedFlag(side int) *uint32 {
	if side == 0 {
		return u32at(r.mem, offClosed0)
	}
	return u32at(r.mem, offClosed1)
}
