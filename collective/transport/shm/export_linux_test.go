package shm

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
)

// CreateStaleFiles creates, in dir, the files a setup of this process creates
// (a region and its FIFOs), as a process killed in the middle of a setup leaves
// them. The tests' child processes call it, then get killed.
func CreateStaleFiles(dir string, job, epoch uint64) (string, error) {
	p, err := selfProcID()
	if err != nil {
		return "", err
	}
	st := newStem(job, epoch, 0, 1, p)
	reg, err := createRegion(st.path(dir, 0), minRingBytes, job, epoch, 0, 1)
	if err != nil {
		return "", err
	}
	reg.unmap()
	for k := 1; k < numFileKinds; k++ {
		if err := unix.Mkfifo(st.path(dir, k), 0o600); err != nil {
			return "", err
		}
	}
	return st.String(), nil
}

// testPair is two links over one anonymous shared mapping, connected with
// pipes instead of FIFOs: the rings without any setup, for tests that write
// into a ring by hand.
type testPair struct {
	a, b  *link // a is rank 0 (side 0), b rank 1 (side 1)
	reg   *region
	pipes []*os.File
}

func newTestPair(ringBytes int, ioTimeout, spin time.Duration, singleMin int) (*testPair, error) {
	mem, err := unix.Mmap(-1, 0, regionSize(ringBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	copy(mem, regionMagic)
	// Each side has a receive and a send pipe; the peer holds the write ends.
	var files []*os.File
	pipe := func() (*os.File, int, error) {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
			return nil, -1, err
		}
		r := os.NewFile(uintptr(fds[0]), "pipe")
		files = append(files, r)
		return r, fds[1], nil
	}
	var ends [2]endpoint
	for side := range ends {
		d, dw, err := pipe()
		if err != nil {
			return nil, err
		}
		s, sw, err := pipe()
		if err != nil {
			return nil, err
		}
		ends[side].dataR, ends[side].spaceR = d, s
		// The peer's write ends of this side's pipes.
		ends[1-side].dataW, ends[1-side].spaceW = dw, sw
	}
	// Each side maps the region separately, as two processes would; here one
	// anonymous mapping is shared by both views.
	pair := &testPair{pipes: files}
	job := transport.JobHash("pair")
	for side := range ends {
		e := &ends[side]
		e.reg = &region{mem: mem, ringBytes: ringBytes}
		e.side, e.peer, e.self, e.addr = side, 1-side, side, fmt.Sprintf("test-%d", 1-side)
		e.job, e.epoch, e.ioTimeout, e.spin, e.singleMin, e.peerPID = job, 1, ioTimeout, spin, singleMin, os.Getpid()
	}
	pair.a, pair.b = newLink(&ends[0]), newLink(&ends[1])
	// The links would unmap the region on Close; the pair does, after both.
	pair.a.reg, pair.b.reg = &region{}, &region{}
	pair.reg = &region{mem: mem, ringBytes: ringBytes}
	return pair, nil
}

func (p *testPair) close() {
	p.a.Close()
	p.b.Close()
	p.reg.unmap()
}

// Oversubscription reports how a shared-memory link was set up for its
// host's load: whether its polls yield to other processes and whether large
// frames may go by single copy.
func Oversubscription(l transport.Link) (yields, singleCopy bool) {
	sl := l.(*link)
	return sl.rspin.YieldsToProcesses() && sl.wspin.YieldsToProcesses(), sl.singleMin > 0
}
