package shm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// Transport connects worlds over a bootstrap transport and moves every pair
// of ranks on one host onto shared memory. It implements transport.Transport.
type Transport struct {
	cfg  Config
	boot transport.Transport
	log  *slog.Logger
	host [32]byte
	proc procID
	uid  uint32
}

var _ transport.Transport = (*Transport)(nil)

// Listen starts a transport whose bootstrap is a TCP transport listening on
// cfg.ListenAddr (authenticated with cfg.Secret).
func Listen(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tc := tcp.DefaultConfig()
	tc.ListenAddr, tc.AdvertiseAddr, tc.Secret = cfg.ListenAddr, cfg.AdvertiseAddr, cfg.Secret
	tc.HandshakeTimeout, tc.IOTimeout, tc.Logger = cfg.HandshakeTimeout, cfg.IOTimeout, cfg.Logger
	boot, err := tcp.Listen(tc)
	if err != nil {
		return nil, err
	}
	t, err := New(boot, cfg)
	if err != nil {
		boot.Close()
		return nil, err
	}
	return t, nil
}

// New builds a transport on bootstrap, which it owns from then on (Close closes
// it). Worlds are connected over bootstrap first; see the package comment.
func New(bootstrap transport.Transport, cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	proc, err := selfProcID()
	if err != nil {
		return nil, err
	}
	id := cfg.HostID
	if id == "" {
		if id, err = HostID(cfg.Dir); err != nil {
			return nil, err
		}
	}
	// The bootstrap's links that stay (pairs on other hosts, and with
	// Fallback pairs that shared memory cannot join) share worlds with
	// shared-memory links: they must not suggest a chunk of their own.
	if m, ok := bootstrap.(interface{ MixedWorlds() }); ok {
		m.MixedWorlds()
	}
	t := &Transport{
		cfg:  cfg,
		boot: bootstrap,
		log:  cfg.Logger,
		host: sha256.Sum256([]byte(id)),
		proc: proc,
		uid:  uint32(os.Geteuid()),
	}
	if n := sweepStale(cfg.Dir, proc); n > 0 {
		t.log.Info("gorovod shm: removed files left by dead processes", "dir", cfg.Dir, "files", n)
	}
	return t, nil
}

// Addr is the bootstrap transport's address.
func (t *Transport) Addr() string { return t.boot.Addr() }

// Close closes the bootstrap transport. Links already returned stay usable.
func (t *Transport) Close() error { return t.boot.Close() }

// Connect connects w over the bootstrap transport, then sets up shared memory
// with every peer, all pairs at once. It returns one link per rank (links[w.Rank]
// is nil), or, having closed everything, an error naming a rank: a
// *transport.HandshakeError when a peer cannot share memory with this rank and
// Config.Fallback is off, a *transport.PeerError when the setup broke.
func (t *Transport) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	return t.ConnectSome(ctx, w, nil)
}

var _ transport.PartialConnector = (*Transport)(nil)

// ConnectSome is Connect for the ranks r of w with want[r] set (all when
// want is nil); the others' links are nil (transport.PartialConnector).
// It needs a bootstrap transport that connects in part (TCP and SCTP do).
func (t *Transport) ConnectSome(ctx context.Context, w transport.World, want []bool) ([]transport.Link, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	var boot []transport.Link
	var err error
	switch pc, ok := t.boot.(transport.PartialConnector); {
	case want == nil:
		boot, err = t.boot.Connect(ctx, w)
	case ok:
		boot, err = pc.ConnectSome(ctx, w, want)
	default:
		return nil, fmt.Errorf("shm: the bootstrap transport cannot connect a world in part")
	}
	if err != nil || w.Size() == 1 {
		return boot, err
	}
	sweepStale(t.cfg.Dir, t.proc)
	links := make([]transport.Link, w.Size())
	errs := make([]error, w.Size())
	var wg sync.WaitGroup
	for r, bl := range boot {
		if bl == nil {
			continue
		}
		wg.Go(func() { links[r], errs[r] = t.setup(ctx, &w, bl) })
	}
	wg.Wait()
	// When this host's ranks outnumber its CPUs they take turns on the cores:
	// a single-copy Send waits for a receiver that is often not running, so
	// buffered copies through the ring do better (4 ranks on 2 cores, 4 MiB
	// allreduce: 2.9 against 1.7 GB/s), and a waiting rank should let the
	// others run.
	local := 1
	for _, l := range links {
		if _, ok := l.(*link); ok {
			local++
		}
	}
	if local > spin.HostCPUs() {
		for _, l := range links {
			if sl, ok := l.(*link); ok {
				sl.oversubscribed()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		for _, l := range links {
			if l != nil {
				l.Close()
			}
		}
		for _, e := range errs {
			if e != nil {
				return nil, e
			}
		}
	}
	return links, nil
}

// setupError is a setup step that failed on this side, reported to the peer.
type setupError struct{ reason string }

func (e *setupError) Error() string { return e.reason }

// setup runs the setup exchange over one bootstrap link and returns the link
// to use: a shared-memory link, or bl itself with Fallback when the pair cannot
// share memory. It closes bl unless it returns it.
func (t *Transport) setup(ctx context.Context, w *transport.World, bl transport.Link) (transport.Link, error) {
	peer := bl.Peer()
	addr := w.Addrs[peer]
	x := exchange{ctx: ctx, bl: bl, peer: peer, addr: addr}
	// The probe: bytes the peer may try to read out of this process's memory,
	// to learn whether it can take large payloads by reference. It stays alive
	// (heap-allocated, referenced) until the setup is over.
	probe := make([]byte, probeSize)
	_, _ = rand.Read(probe)
	defer runtime.KeepAlive(probe)
	me := hello{shared: true, host: t.host, uid: t.uid, pid: uint32(t.proc.pid), pidNS: t.proc.ns,
		probeAddr: uint64(uintptr(unsafe.Pointer(&probe[0])))}
	copy(me.probe[:], probe)
	var b [helloSize]byte
	me.encode(b[:])
	if err := x.send(msgHello, b[:]); err != nil {
		bl.Close()
		return nil, err
	}
	var them hello
	if err := x.recv(msgHello, func(p []byte) error { return decodeHello(p, &them) }); err != nil {
		bl.Close()
		return nil, err
	}
	var why string
	switch {
	case !them.shared:
		why = "the peer does not share memory"
	case them.host != t.host:
		why = "the peer is on another host"
	case them.uid != t.uid:
		why = fmt.Sprintf("the peer runs as uid %d, this rank as %d", them.uid, t.uid)
	}
	if why != "" {
		return t.noShare(bl, peer, addr, why)
	}
	canRead := t.cfg.SingleCopyBytes > 0 && them.pidNS == t.proc.ns && probeRead(int(them.pid), them.probeAddr, &them.probe)
	var l *link
	var err error
	if w.Rank < peer {
		l, err = t.create(&x, w, peer, canRead)
	} else {
		l, err = t.open(&x, w, peer, canRead)
	}
	if l != nil {
		l.peerPID = int(them.pid)
	}
	var se *setupError
	if errors.As(err, &se) {
		return t.noShare(bl, peer, addr, se.reason)
	}
	if err != nil {
		bl.Close()
		return nil, err
	}
	// The shared-memory link carries everything from here on; its FIFOs tell
	// of the peer's death, so the bootstrap connection is not needed.
	bl.Close()
	return l, nil
}

// noShare falls back to the bootstrap link, or fails.
func (t *Transport) noShare(bl transport.Link, peer int, addr, why string) (transport.Link, error) {
	if t.cfg.Fallback {
		t.log.Debug("gorovod shm: keeping the bootstrap link", "rank", peer, "reason", why)
		return bl, nil
	}
	bl.Close()
	return nil, &transport.HandshakeError{Rank: peer, Addr: addr, Fatal: true,
		Reason: "cannot use shared memory: " + why}
}

// exchange sends and receives setup messages over a bootstrap link.
type exchange struct {
	ctx  context.Context
	bl   transport.Link
	peer int
	addr string
}

func (x *exchange) fail(err error) error {
	var pe *transport.PeerError
	if errors.As(err, &pe) {
		pe.Op = "connect"
		return pe
	}
	return &transport.PeerError{Rank: x.peer, Addr: x.addr, Op: "connect", Err: err}
}

func (x *exchange) send(typ uint8, msg []byte) error {
	h := transport.Header{Kind: transport.FrameData, Coll: setupColl, Step: uint32(typ), Length: uint32(len(msg))}
	if err := x.bl.Send(x.ctx, &h, msg); err != nil {
		return x.fail(err)
	}
	return nil
}

func (x *exchange) recv(typ uint8, decode func([]byte) error) error {
	var h transport.Header
	if err := x.bl.RecvHeader(x.ctx, &h); err != nil {
		return x.fail(err)
	}
	size := setupMsgSize(typ)
	if h.Kind != transport.FrameData || h.Coll != setupColl || h.Step != uint32(typ) || int(h.Length) != size {
		return &transport.HandshakeError{Rank: x.peer, Addr: x.addr, Fatal: true,
			Reason: fmt.Sprintf("unexpected frame (kind %v, collective %d, step %d, %d bytes) during the shared-memory setup; is the peer using the shm transport?", h.Kind, h.Coll, h.Step, h.Length)}
	}
	var b [offerSize]byte // the largest message
	p := b[:size]
	if err := x.bl.RecvPayload(x.ctx, p); err != nil {
		return x.fail(err)
	}
	if err := decode(p); err != nil {
		return &transport.HandshakeError{Rank: x.peer, Addr: x.addr, Fatal: true, Reason: "shared-memory setup: " + err.Error()}
	}
	return nil
}

func (x *exchange) sendReply(typ uint8, ok, singleCopy bool, reason string) error {
	var b [replySize]byte
	(&reply{ok: ok, singleCopy: singleCopy, reason: reason}).encode(b[:], typ)
	return x.send(typ, b[:])
}

func (x *exchange) recvReply(typ uint8) (reply, error) {
	var r reply
	err := x.recv(typ, func(p []byte) error { return decodeReply(p, typ, &r) })
	return r, err
}

// files holds what a setup opened, until a link owns it.
type files struct {
	reg           *region
	dataR, spaceR *os.File
	dataW, spaceW int
}

func (f *files) close() {
	if f.reg != nil {
		f.reg.unmap()
	}
	for _, r := range []*os.File{f.dataR, f.spaceR} {
		if r != nil {
			r.Close()
		}
	}
	for _, fd := range []int{f.dataW, f.spaceW} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// fifo kinds: the receive FIFO (d) and the send FIFO (s) of each side.
func dataKind(side int) int  { return 1 + 2*side }
func spaceKind(side int) int { return 2 + 2*side }

// openReader opens one of this side's FIFOs for parking on it: non-blocking,
// so the runtime's poller owns the waits.
func openReader(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	if err := checkOwned(fd, path, true, 0); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openWriter opens one of the peer's FIFOs for waking it. It fails unless the
// peer already holds the read end.
func openWriter(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("shm: open %s for writing: %w", path, err)
	}
	if err := checkOwned(fd, path, true, 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// endpoint builds the link; peerReads says whether the peer can read this
// process's memory, which enables single copy for what this side sends.
func (t *Transport) endpoint(f *files, side int, w *transport.World, peer int, peerReads bool) *link {
	singleMin := 0
	if peerReads {
		singleMin = t.cfg.SingleCopyBytes
	}
	return newLink(&endpoint{
		reg: f.reg, side: side, dataR: f.dataR, spaceR: f.spaceR, dataW: f.dataW, spaceW: f.spaceW,
		peer: peer, addr: w.Addrs[peer], job: transport.JobHash(w.JobID), epoch: w.Epoch, self: w.Rank,
		ioTimeout: t.cfg.IOTimeout, spin: t.cfg.SpinTime, singleMin: singleMin,
	})
}

// probeRead reports whether this process can read the peer's probe bytes out
// of its memory: the same test the single-copy path will pass or fail later.
func probeRead(pid int, addr uint64, want *[probeSize]byte) bool {
	if pid <= 0 || addr == 0 {
		return false
	}
	var got [probeSize]byte
	local := []unix.Iovec{{Base: &got[0], Len: probeSize}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: probeSize}}
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	return err == nil && n == probeSize && got == *want
}

// create is the lower rank's side: make the region and the FIFOs, offer them,
// and once the peer has opened everything, open the peer's FIFOs and unlink
// every file. A *setupError means the pair cannot share memory (the peer was
// told); any other error means the setup broke.
func (t *Transport) create(x *exchange, w *transport.World, peer int, canRead bool) (l *link, err error) {
	job := transport.JobHash(w.JobID)
	st := newStem(job, w.Epoch, w.Rank, peer, t.proc)
	dir := t.cfg.Dir
	// Whatever happens, nothing of this setup stays in dir.
	defer st.unlinkAll(dir)
	f := files{dataW: -1, spaceW: -1}
	defer func() {
		if l == nil {
			f.close()
		}
	}()
	local := func() error {
		var err error
		if f.reg, err = createRegion(st.path(dir, 0), t.cfg.ringBytes(w.Size()), job, w.Epoch, w.Rank, peer); err != nil {
			return err
		}
		for k := 1; k < numFileKinds; k++ {
			p := st.path(dir, k)
			if err := unix.Mkfifo(p, 0o600); err != nil {
				return fmt.Errorf("shm: mkfifo %s: %w", p, err)
			}
			if err := unix.Chmod(p, 0o600); err != nil {
				return fmt.Errorf("shm: chmod %s: %w", p, err)
			}
		}
		if f.dataR, err = openReader(st.path(dir, dataKind(0))); err != nil {
			return err
		}
		f.spaceR, err = openReader(st.path(dir, spaceKind(0)))
		return err
	}
	if lerr := local(); lerr != nil {
		// Tell the peer, which waits for an offer, that there will be none.
		t.log.Warn("gorovod shm: cannot create a region", "rank", peer, "err", lerr)
		var b [offerSize]byte
		(&offer{ringBytes: 0, name: "-"}).encode(b[:])
		if err := x.send(msgOffer, b[:]); err != nil {
			return nil, err
		}
		return nil, &setupError{reason: lerr.Error()}
	}
	var ob [offerSize]byte
	(&offer{ringBytes: uint64(f.reg.ringBytes), name: st.String()}).encode(ob[:])
	if err := x.send(msgOffer, ob[:]); err != nil {
		return nil, err
	}
	r, err := x.recvReply(msgReply)
	if err != nil {
		return nil, err
	}
	if !r.ok {
		return nil, &setupError{reason: "the peer could not open the region: " + r.reason}
	}
	if f.dataW, err = openWriter(st.path(dir, dataKind(1))); err == nil {
		f.spaceW, err = openWriter(st.path(dir, spaceKind(1)))
	}
	if err != nil {
		if serr := x.sendReply(msgDone, false, false, err.Error()); serr != nil {
			return nil, serr
		}
		return nil, &setupError{reason: err.Error()}
	}
	if err := x.sendReply(msgDone, true, canRead, ""); err != nil {
		return nil, err
	}
	return t.endpoint(&f, 0, w, peer, r.singleCopy), nil
}

// open is the higher rank's side: check and open what the peer created.
func (t *Transport) open(x *exchange, w *transport.World, peer int, canRead bool) (l *link, err error) {
	var o offer
	if err := x.recv(msgOffer, func(p []byte) error { return decodeOffer(p, &o) }); err != nil {
		return nil, err
	}
	if o.name == "-" {
		return nil, &setupError{reason: "the peer could not create a region"}
	}
	f := files{dataW: -1, spaceW: -1}
	defer func() {
		if l == nil {
			f.close()
		}
	}()
	job := transport.JobHash(w.JobID)
	dir := t.cfg.Dir
	local := func() error {
		st, err := parseStem(o.name)
		if err != nil {
			return err
		}
		if st.job != job || st.epoch != w.Epoch || st.lo != peer || st.hi != w.Rank {
			return fmt.Errorf("shm: offered region %q is not for this pair of this world", o.name)
		}
		rb := o.ringBytes
		if rb < minRingBytes || rb > maxRingBytes || rb&(rb-1) != 0 {
			return fmt.Errorf("shm: offered ring of %d bytes", rb)
		}
		if f.reg, err = openRegion(st.path(dir, 0), int(rb), job, w.Epoch, peer, w.Rank); err != nil {
			return err
		}
		if f.dataR, err = openReader(st.path(dir, dataKind(1))); err != nil {
			return err
		}
		if f.spaceR, err = openReader(st.path(dir, spaceKind(1))); err != nil {
			return err
		}
		if f.dataW, err = openWriter(st.path(dir, dataKind(0))); err != nil {
			return err
		}
		f.spaceW, err = openWriter(st.path(dir, spaceKind(0)))
		return err
	}
	if lerr := local(); lerr != nil {
		t.log.Warn("gorovod shm: cannot open the peer's region", "rank", peer, "err", lerr)
		if err := x.sendReply(msgReply, false, false, lerr.Error()); err != nil {
			return nil, err
		}
		return nil, &setupError{reason: lerr.Error()}
	}
	if err := x.sendReply(msgReply, true, canRead, ""); err != nil {
		return nil, err
	}
	r, err := x.recvReply(msgDone)
	if err != nil {
		return nil, err
	}
	if !r.ok {
		return nil, &setupError{reason: "the peer could not open this rank's FIFOs: " + r.reason}
	}
	return t.endpoint(&f, 1, w, peer, r.singleCopy), nil
}
