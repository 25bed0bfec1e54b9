//go:build linux

package cuda

// A board is host shared memory through which the processes of one host
// meet within a same-host allreduce, instead of a network round trip over
// the communicator for each meeting (about 120 µs each between two
// processes on the H200 machine). It needs no GPU, so the default build
// tests it. (Mailboxes in GPU memory were tried first and measured slower
// than the communicator: every poll is a copy that waits for the GPU to
// switch between the processes' contexts.)
//
// Layout: one boardSlot bytes per rank, written only by that rank:
//
//	[0, 8·syncSlots)                 flag words, one per slot: seq<<1 | failed
//	[pidOff, pidOff+8)               the rank's process id
//	[recordOff, +maxBoardRecord)     the rank's record of the latest exchange
//
// A sync numbered s (all ranks count their syncs alike, since all make the
// same calls) stores the flag word s%syncSlots after the record (Go's atomic
// store orders the plain writes before it), then loads every peer's word
// s%syncSlots until it holds s. A peer is at most one sync ahead (it cannot
// pass s+1 before this rank publishes s+1), so it never overwrites the word
// of s before this rank has read it, and it rewrites its record only after
// this rank has read it and published the next sync.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const (
	boardSlot      = 512
	syncSlots      = 4
	pidOff         = 8 * syncSlots
	boardRecordOff = 64
	maxBoardRecord = boardSlot - boardRecordOff
)

// SyncTimeoutError is a wait on the board that ran past the group's
// SyncTimeout: the ranks in Missing never arrived (stuck, or no longer
// calling the group).
type SyncTimeoutError struct {
	Step    string // what the ranks were meeting for
	Seq     uint64 // the sync's number
	Missing []int
	After   time.Duration
}

func (e *SyncTimeoutError) Error() string {
	return fmt.Sprintf("cuda: same-host allreduce: %s: ranks %v did not arrive within %v (sync %d)", e.Step, e.Missing, e.After, e.Seq)
}

// PeerGoneError is a wait on the board for a rank whose process has exited.
type PeerGoneError struct {
	Step string
	Rank int
	PID  int
}

func (e *PeerGoneError) Error() string {
	return fmt.Sprintf("cuda: same-host allreduce: %s: rank %d (process %d) has exited", e.Step, e.Rank, e.PID)
}

// board is one rank's view of the shared memory.
type board struct {
	mem     []byte // the mapping, p·boardSlot bytes
	p, r    int
	seq     uint64
	timeout time.Duration
	// pids are the peers' process ids when this process can see them
	// (the same PID namespace), for noticing a peer that exited; nil
	// otherwise.
	pids []int
	// failed reports a failure of the communicator, which ends waits too.
	failed func() error
}

// createBoardFile makes the file the ranks map: in dir (/dev/shm, a tmpfs),
// p·boardSlot bytes of zeros. The caller removes it once every rank has
// mapped it.
func createBoardFile(dir string, p int) (string, error) {
	f, err := os.CreateTemp(dir, "gorovod-samehost-*")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Truncate(int64(p * boardSlot)); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// openBoard maps the board file as rank r of p and writes this process's id.
func openBoard(path string, p, r int, timeout time.Duration, failed func() error) (*board, error) {
	if r < 0 || r >= p || timeout <= 0 {
		return nil, fmt.Errorf("board: rank %d of %d, timeout %v", r, p, timeout)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != int64(p*boardSlot) {
		return nil, fmt.Errorf("board %s has %d bytes, want %d for %d ranks", path, st.Size(), p*boardSlot, p)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, p*boardSlot, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	b := &board{mem: mem, p: p, r: r, timeout: timeout, failed: failed}
	atomic.StoreUint64(b.word(r, pidOff), uint64(os.Getpid()))
	return b, nil
}

// watchPeers reads the peers' process ids (after every rank has opened the
// board) and keeps them if each names a live process this one can see.
func (b *board) watchPeers() {
	pids := make([]int, b.p)
	for k := range b.p {
		if k == b.r {
			continue
		}
		pid := int(atomic.LoadUint64(b.word(k, pidOff)))
		if pid <= 0 || syscall.Kill(pid, 0) != nil {
			return // another PID namespace, say: rely on the timeout
		}
		pids[k] = pid
	}
	b.pids = pids
}

func (b *board) close() error {
	if b.mem == nil {
		return nil
	}
	err := syscall.Munmap(b.mem)
	b.mem = nil
	return err
}

// word is the 8-byte word at off in rank k's slot.
func (b *board) word(k, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&b.mem[k*boardSlot+off]))
}

// publish writes rec (if any) and then the next sync's flag; it returns the
// sync's number.
func (b *board) publish(failed bool, rec []byte) (uint64, error) {
	if len(rec) > maxBoardRecord {
		return 0, fmt.Errorf("board: record of %d bytes, at most %d", len(rec), maxBoardRecord)
	}
	b.seq++
	s := b.seq
	if len(rec) > 0 {
		base := b.r*boardSlot + boardRecordOff
		copy(b.mem[base:base+len(rec)], rec)
	}
	v := s << 1
	if failed {
		v |= 1
	}
	atomic.StoreUint64(b.word(b.r, 8*int(s%syncSlots)), v)
	return s, nil
}

// record is rank k's record of the latest exchange (n bytes), valid between
// awaiting that exchange's sync and publishing the next one.
func (b *board) record(k, n int) []byte {
	base := k*boardSlot + boardRecordOff
	return append([]byte(nil), b.mem[base:base+n]...)
}

// boardSpin bounds the polling without sleeps, as spinWait does in
// Device.wait.
const boardSpin = 200 * time.Microsecond

// await waits until every peer has published sync s and returns the highest
// rank that published a failure (-1 when none). It ends early when ctx
// ends, the communicator fails, a peer's process exits, or after the
// board's timeout.
func (b *board) await(ctx context.Context, s uint64, step string) (int, error) {
	failed := -1
	pending := make([]int, 0, b.p)
	for k := range b.p {
		if k != b.r {
			pending = append(pending, k)
		}
	}
	start := time.Now()
	lastCheck := start
	sleep := time.Microsecond
	spinning := true
	for spin := 0; ; spin++ {
		left := pending[:0]
		for _, k := range pending {
			v := atomic.LoadUint64(b.word(k, 8*int(s%syncSlots)))
			switch {
			case v>>1 == s:
				if v&1 == 1 {
					failed = max(failed, k)
				}
			case v>>1 > s:
				return 0, fmt.Errorf("cuda: same-host allreduce: %s: rank %d is at sync %d, this rank at %d: the ranks' calls are out of step", step, k, v>>1, s)
			default:
				left = append(left, k)
			}
		}
		pending = left
		if len(pending) == 0 {
			return failed, nil
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if spinning && spin%64 != 63 {
			// The clock is read every 64 rounds while spinning.
			runtime.Gosched()
			continue
		}
		now := time.Now()
		waited := now.Sub(start)
		if waited > b.timeout {
			return 0, &SyncTimeoutError{Step: step, Seq: s, Missing: append([]int(nil), pending...), After: waited.Round(time.Millisecond)}
		}
		if now.Sub(lastCheck) >= 10*time.Millisecond {
			lastCheck = now
			if b.failed != nil {
				if err := b.failed(); err != nil {
					return 0, fmt.Errorf("cuda: same-host allreduce: %s: the communicator failed: %w", step, err)
				}
			}
			for _, k := range pending {
				if b.pids != nil && errors.Is(syscall.Kill(b.pids[k], 0), syscall.ESRCH) {
					return 0, &PeerGoneError{Step: step, Rank: k, PID: b.pids[k]}
				}
			}
		}
		if waited < boardSpin {
			runtime.Gosched()
			continue
		}
		spinning = false
		time.Sleep(sleep)
		sleep = min(2*sleep, 100*time.Microsecond)
	}
}

// exchange publishes rec and returns every rank's (p records back to
// back, this rank's at its index).
func (b *board) exchange(ctx context.Context, rec []byte, step string) ([]byte, error) {
	s, err := b.publish(false, rec)
	if err != nil {
		return nil, err
	}
	if _, err := b.await(ctx, s, step); err != nil {
		return nil, err
	}
	all := make([]byte, 0, b.p*len(rec))
	for k := range b.p {
		if k == b.r {
			all = append(all, rec...)
		} else {
			all = append(all, b.record(k, len(rec))...)
		}
	}
	return all, nil
}

// agree publishes whether this rank's step failed and returns the highest
// rank whose step failed (-1 when none): returning means every rank has
// finished the step.
func (b *board) agree(ctx context.Context, local error, step string) (int, error) {
	s, err := b.publish(local != nil, nil)
	if err != nil {
		return 0, err
	}
	failed, err := b.await(ctx, s, step)
	if err != nil {
		return 0, err
	}
	if local != nil {
		failed = max(failed, b.r)
	}
	return failed, nil
}

// boardNameSize is the fixed size of the board file's path as rank 0
// broadcasts it of the board file's path that rank 0
// (a leading NUL and the reason when it could not make the file).
const boardNameSize = 256

func encodeBoardName(path string, err error) []byte {
	b := make([]byte, boardNameSize)
	if err != nil {
		copy(b[1:], err.Error())
		return b
	}
	copy(b, path)
	return b
}

func decodeBoardName(b []byte) (string, error) {
	if len(b) != boardNameSize {
		return "", fmt.Errorf("board name of %d bytes", len(b))
	}
	if b[0] == 0 {
		end := 1
		for end < len(b) && b[end] != 0 {
			end++
		}
		return "", fmt.Errorf("rank 0 could not make the board: %s", b[1:end])
	}
	end := 0
	for end < len(b) && b[end] != 0 {
		end++
	}
	return string(b[:end]), nil
}
