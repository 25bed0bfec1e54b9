package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/cuda/kernels"
)

// SameHostConfig configures a SameHostGroup.
type SameHostConfig struct {
	// MaxMapped bounds how many peer allocations a group keeps mapped
	// (cuIpcOpenMemHandle is slow, so mappings are reused across calls; the
	// least recently used is unmapped past this many).
	MaxMapped int
	// Disable makes the group use the host path for every call (for
	// comparisons); the ranks still meet to agree, so it may be set on some
	// ranks only.
	Disable bool
	// HostSync makes the ranks of an IPC group meet within a call through a
	// board of shared memory in BoardDir (ipcboard.go) instead of over the
	// communicator (a network round trip each). Every rank must set the
	// same. Where the board cannot be made the group meets over the
	// communicator, and SyncReason says why.
	HostSync bool
	// BoardDir is where the board's file is made (and removed once every
	// rank has mapped it): a tmpfs all ranks share.
	BoardDir string
	// SyncTimeout bounds a wait on the board for the other ranks: past it
	// the call fails with a *SyncTimeoutError naming the ranks that did not
	// arrive. A peer whose process exits is noticed sooner (*PeerGoneError)
	// where the ranks share a PID namespace.
	SyncTimeout time.Duration
}

// DefaultSameHostConfig returns the defaults: 64 mappings, meetings over
// the communicator (with HostSync: a board in /dev/shm, waits of up to two
// minutes).
func DefaultSameHostConfig() SameHostConfig {
	return SameHostConfig{MaxMapped: 64, BoardDir: "/dev/shm", SyncTimeout: 2 * time.Minute}
}

// SameHostStats counts how a group's allreduces ran.
type SameHostStats struct {
	IPC  int64 // GPU to GPU through CUDA IPC
	Host int64 // through the communicator's host-staged path
	// Remaps counts the times the cached mappings were dropped because a
	// peer had reused memory this process still mapped (see openPeers).
	Remaps int64
	// Reused counts the IPC calls on the very allocations of the call
	// before, which skip one meeting of the ranks (see AllreduceScaled).
	Reused int64
}

// ErrGroupClosed is returned by a SameHostGroup's calls after Close.
var ErrGroupClosed = errors.New("cuda: same-host group closed")

// SameHostGroup runs allreduces of device buffers between processes whose
// GPUs are on one host directly from GPU memory to GPU memory, through CUDA
// IPC, instead of staging every chunk through host memory. NewSameHostGroup
// decides, with every rank of the communicator, whether that works; where it
// does not (ranks on several hosts, a driver that refuses IPC, a world of one
// rank) every call takes the communicator's host path, on every rank alike.
//
// One allreduce: the ranks exchange the IPC handles of their send and
// receive allocations (which also shows every rank's input is ready), map
// each other's (once per allocation: the mappings are cached), and agree
// that all mappings opened (skipped when every rank passes the allocations
// of the previous call). Then rank r reduces its share of the elements (the
// r-th of p contiguous slices), reading every rank's send buffer directly,
// scales it as the host path does (Average, Postscale), and writes it into
// every rank's receive buffer. A last meeting marks the end: when it is
// over, every rank's writes into this rank's buffer are complete. Each
// share is reduced by one rank (local operand first, then the others in
// rank order), so every rank ends with the same bits; for two ranks they are
// the host path's bits (the reduction of two operands is commutative). The
// ranks meet over the communicator (an allgather, then one-number
// allreduces), or with SameHostConfig.HostSync on a shared-memory board.
//
// Failures: a rank whose buffers cannot be exported or mapped makes every
// rank take the host path for that call. A peer that dies makes the
// others' meetings fail with the communicator's *collective.PeerError, or on
// the board with a *PeerGoneError (or a *SyncTimeoutError after
// SyncTimeout); a failed meeting on the board leaves the group unusable.
// After a failed call the receive buffers' contents are undefined.
//
// Buffers must be memory of the group's device from Alloc, or from Wrap of
// memory the driver can export (cudaMalloc'd memory such as PyTorch's
// caching allocator's blocks; not memory from the virtual memory API, which
// takes the host path). All ranks must pass device buffers, or all host
// buffers (which go to the communicator as they are). Calls on one group are
// serialized; like every collective, all ranks must make them in the same
// order. The caller must have finished the work that produced the send
// buffer (synchronized its stream) before the call.
type SameHostGroup struct {
	comm *collective.Communicator
	dev  *Device
	cfg  SameHostConfig

	mu         sync.Mutex
	closed     bool
	reason     string // why the group uses the host path; "" when IPC is used
	lastReason string // why the last call fell back to the host path, if it did
	maps       mapCache
	stats      SameHostStats
	prev       []callRecord // every rank's record of the last call, when it went through IPC
	board      *board       // with HostSync, where the ranks meet
	syncReason string       // with HostSync, why there is no board
	broken     error        // a board meeting that failed left the ranks out of step
}

// probeSize is the allocation each rank exports when the group is made.
const probeSize = 4096

// NewSameHostGroup makes the group on every rank of comm (a collective call:
// every rank must make it, with its own device). It returns an error only
// when the communicator fails or the arguments are bad; when IPC does not
// work the group is made anyway and uses the host path, with Reason saying
// why.
func NewSameHostGroup(ctx context.Context, comm *collective.Communicator, dev *Device, cfg SameHostConfig) (*SameHostGroup, error) {
	if comm == nil || dev == nil {
		return nil, errors.New("cuda: NewSameHostGroup needs a communicator and a device")
	}
	if cfg.MaxMapped < 1 {
		return nil, dev.usage("NewSameHostGroup", fmt.Sprintf("MaxMapped %d: at least 1 mapping is needed (see DefaultSameHostConfig)", cfg.MaxMapped))
	}
	if cfg.HostSync && (cfg.SyncTimeout <= 0 || cfg.BoardDir == "") {
		return nil, dev.usage("NewSameHostGroup", fmt.Sprintf("HostSync needs a SyncTimeout (%v) and a BoardDir (%q); see DefaultSameHostConfig", cfg.SyncTimeout, cfg.BoardDir))
	}
	g := &SameHostGroup{comm: comm, dev: dev, cfg: cfg}
	g.maps = mapCache{max: cfg.MaxMapped, open: dev.drv.ipcOpenHandle, close: dev.drv.ipcCloseHandle}
	if comm.Size() == 1 {
		g.reason = "a world of one rank has nothing to exchange"
		return g, nil
	}
	reason, err := g.probe(ctx)
	if err != nil {
		return nil, err
	}
	g.reason = reason
	if reason == "" && cfg.HostSync {
		if err := g.openBoard(ctx); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// openBoard has rank 0 make the board's file and every rank map it; the
// ranks use it only if all could (else SyncReason says why). The file is
// removed once all have tried, so nothing is left behind.
func (g *SameHostGroup) openBoard(ctx context.Context) error {
	p, r := g.comm.Size(), g.comm.Rank()
	name := make([]byte, boardNameSize)
	var path string
	if r == 0 {
		var err error
		path, err = createBoardFile(g.cfg.BoardDir, p)
		name = encodeBoardName(path, err)
	}
	if err := g.comm.Broadcast(ctx, collective.HostBuffer(collective.Uint8, name), 0); err != nil {
		if path != "" {
			os.Remove(path)
		}
		return fmt.Errorf("cuda: same-host group: sharing the board's name: %w", err)
	}
	status := groupRecord{OK: true}
	var b *board
	shared, err := decodeBoardName(name)
	if err == nil {
		b, err = openBoard(shared, p, r, g.cfg.SyncTimeout, g.comm.Err)
	}
	if err != nil {
		status.OK, status.Reason = false, err.Error()
	}
	all, err := g.allgatherGroup(ctx, status)
	if path != "" {
		os.Remove(path) // every rank has mapped it or failed to
	}
	if err == nil {
		g.syncReason = firstFailure(all)
	}
	if err != nil || g.syncReason != "" {
		if b != nil {
			b.close()
		}
		if err != nil {
			return fmt.Errorf("cuda: same-host group: agreeing on the board: %w", err)
		}
		return nil
	}
	b.watchPeers() // every rank wrote its pid before the allgather
	g.board = b
	return nil
}

// HostSync reports whether the ranks meet through the shared-memory board.
func (g *SameHostGroup) HostSync() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.board != nil
}

// SyncReason says why a group made with HostSync meets over the
// communicator instead ("" otherwise).
func (g *SameHostGroup) SyncReason() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.syncReason
}

// probe has every rank export a small allocation, open every other rank's
// and read it back; it returns "" when all of that worked on every rank.
func (g *SameHostGroup) probe(ctx context.Context) (string, error) {
	p, r := g.comm.Size(), g.comm.Rank()
	rec := groupRecord{OK: true}
	hostname, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	rec.HostID = hostID(hostname, strings.TrimSpace(string(boot)))
	fail := func(err error) {
		if rec.OK {
			rec.OK, rec.Reason = false, err.Error()
		}
	}
	var probe *Memory
	if g.cfg.Disable {
		fail(errors.New("disabled by SameHostConfig.Disable"))
	} else {
		var err error
		if probe, err = g.dev.Alloc(ctx, probeSize); err != nil {
			fail(fmt.Errorf("allocating the probe: %w", err))
		} else {
			defer probe.Free()
			if err := probe.CopyFromHost(ctx, 0, probePattern(r, probeSize)); err != nil {
				fail(fmt.Errorf("writing the probe: %w", err))
			}
		}
	}
	if rec.OK {
		err := g.dev.withContext(ctx, func() error {
			var err error
			if rec.UUID, err = g.dev.drv.deviceUUID(g.dev.dev); err != nil {
				return g.dev.driverErr("cuDeviceGetUuid", err)
			}
			if rec.Probe, err = g.dev.drv.ipcGetHandle(uintptr(probe.ptr)); err != nil {
				return &DriverError{Device: g.dev.ordinal, Op: "cuIpcGetMemHandle(probe)", Err: err}
			}
			return nil
		})
		if err != nil {
			fail(err)
		}
	}
	recs, err := g.allgatherGroup(ctx, rec)
	if err != nil {
		return "", fmt.Errorf("cuda: same-host group: exchanging identities: %w", err)
	}
	if reason := decideGroup(recs); reason != "" {
		return reason, nil
	}
	// Every rank exported its probe and all run on one host: each reads the
	// others' through IPC, and all learn whether every rank could.
	status := groupRecord{OK: true}
	for k := range p {
		if k == r {
			continue
		}
		if err := g.readProbe(ctx, k, recs[k]); err != nil {
			status.OK, status.Reason = false, err.Error()
			break
		}
	}
	all, err := g.allgatherGroup(ctx, status)
	if err != nil {
		return "", fmt.Errorf("cuda: same-host group: exchanging probe results: %w", err)
	}
	// Every rank has finished reading every probe before any rank's
	// allgather returns, so the deferred Free of our probe is safe.
	return firstFailure(all), nil
}

// readProbe maps rank k's probe, reads it back and unmaps it.
func (g *SameHostGroup) readProbe(ctx context.Context, k int, rec groupRecord) error {
	got := make([]byte, probeSize)
	return g.dev.withContext(ctx, func() error {
		ptr, err := g.dev.drv.ipcOpenHandle(rec.Probe)
		if err != nil {
			return &DriverError{Device: g.dev.ordinal, Op: fmt.Sprintf("cuIpcOpenMemHandle(rank %d's probe, GPU %x)", k, rec.UUID), Err: err}
		}
		rerr := g.dev.drv.memcpyDtoH(got, uint64(ptr))
		cerr := g.dev.drv.ipcCloseHandle(ptr)
		switch {
		case rerr != nil:
			return g.dev.driverErr(fmt.Sprintf("cuMemcpyDtoH(rank %d's probe through IPC)", k), rerr)
		case cerr != nil:
			return g.dev.driverErr(fmt.Sprintf("cuIpcCloseMemHandle(rank %d's probe)", k), cerr)
		}
		return checkProbe(k, got)
	})
}

func (g *SameHostGroup) allgatherGroup(ctx context.Context, rec groupRecord) ([]groupRecord, error) {
	p := g.comm.Size()
	all := make([]byte, p*groupRecordSize)
	err := g.comm.Allgather(ctx, collective.HostBuffer(collective.Uint8, rec.marshal()), collective.HostBuffer(collective.Uint8, all))
	if err != nil {
		return nil, err
	}
	return unmarshalGroupRecords(all, p)
}

// IPC reports whether the group's device allreduces go GPU to GPU.
func (g *SameHostGroup) IPC() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason == ""
}

// Reason says why the group uses the host path ("" when it does not).
func (g *SameHostGroup) Reason() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason
}

// LastFallback says why the last allreduce of an IPC group took the host
// path ("" when it did not).
func (g *SameHostGroup) LastFallback() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastReason
}

// Stats counts the group's allreduces by path.
func (g *SameHostGroup) Stats() SameHostStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// Close unmaps the peers' allocations. It is local (not a collective call);
// the communicator and device stay open.
func (g *SameHostGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	var first error
	if g.board != nil {
		first = g.board.close()
	}
	if len(g.maps.entries) == 0 {
		return first
	}
	err := g.dev.withContext(context.Background(), func() error {
		if err := g.maps.closeAll(); err != nil {
			return g.dev.driverErr("cuIpcCloseMemHandle", err)
		}
		return nil
	})
	if first == nil {
		first = err
	}
	return first
}

// Allreduce reduces send across all ranks with op into recv on every rank
// (send and recv may be the same memory), as collective.Communicator's
// Allreduce does.
func (g *SameHostGroup) Allreduce(ctx context.Context, send, recv collective.Buffer, op collective.ReduceOp) error {
	return g.AllreduceScaled(ctx, send, recv, op, 1, 1)
}

// AllreduceScaled is Allreduce with Horovod's prescale and postscale
// factors (collective.Prescale and collective.Postscale).
func (g *SameHostGroup) AllreduceScaled(ctx context.Context, send, recv collective.Buffer, op collective.ReduceOp, prescale, postscale float64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrGroupClosed
	}
	if g.broken != nil {
		return fmt.Errorf("cuda: same-host group unusable after a failed meeting of the ranks: %w", g.broken)
	}
	// The last call's records count only for the very next call, and any
	// return short of success leaves none.
	prev := g.prev
	g.prev = nil
	if err := ctx.Err(); err != nil {
		return err
	}
	g.lastReason = ""
	if g.reason != "" || op == collective.Adasum || !op.Valid() || send.Count == 0 ||
		(send.Device == nil && recv.Device == nil) {
		return g.hostPath(ctx, send, recv, op, prescale, postscale)
	}
	sm, rm, err := g.deviceBuffers(send, recv)
	if err != nil {
		return err
	}
	for _, v := range []float64{prescale, postscale} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return g.dev.usage("Allreduce", fmt.Sprintf("scale factor %v is not finite", v))
		}
	}
	dt, nbytes := send.DType, send.Bytes()
	src := sm
	if prescale != 1 {
		// As the host path does: the scaled contribution goes to recv,
		// which then is the source every rank reads.
		if sm != rm {
			if err := rm.CopyFrom(ctx, 0, sm, 0, nbytes); err != nil {
				return fmt.Errorf("cuda: same-host allreduce: copying send to receive for the prescale: %w", err)
			}
		}
		if err := rm.Scale(ctx, 0, nbytes, dt, prescale, 1); err != nil {
			return fmt.Errorf("cuda: same-host allreduce: prescale: %w", err)
		}
		src, send, prescale = rm, recv, 1
	}
	rec, exportErr := g.export(ctx, src, rm)
	if exportErr != nil && ctx.Err() != nil {
		return exportErr
	}
	rec.DType, rec.Op, rec.Count = dt, op, uint64(send.Count)
	p := g.comm.Size()
	all := make([]byte, p*callRecordSize)
	if err := g.exchange(ctx, rec.marshal(), all); err != nil {
		return g.brokenBy(fmt.Errorf("cuda: same-host allreduce: exchanging handles: %w", err))
	}
	recs, err := unmarshalCallRecords(all, p)
	if err != nil {
		return fmt.Errorf("cuda: same-host allreduce: %w", err)
	}
	ipc, err := decideCall(recs)
	if err != nil {
		return g.dev.usage("Allreduce", "ranks disagree: "+err.Error())
	}
	if !ipc {
		g.lastReason = "a rank's buffers cannot be shared through CUDA IPC"
		if exportErr != nil {
			g.lastReason = exportErr.Error()
		}
		return g.hostPath(ctx, send, recv, op, prescale, postscale)
	}
	// When every rank names the very allocations of the last call, which
	// went through IPC, every rank still has them mapped (handles are unique
	// per allocation, and nothing unmaps between calls): no rank can fail to
	// map them, so the ranks skip the meeting that agrees on it, a network
	// round trip. All ranks reach the same verdict from the same records.
	reused := sameMappings(prev, recs)
	peers, openErr := g.openPeers(ctx, recs)
	if !reused {
		failed, err := g.anyFailed(ctx, openErr, "agreeing on the mappings")
		if err != nil {
			return g.brokenBy(fmt.Errorf("cuda: same-host allreduce: agreeing on the mappings: %w", err))
		}
		if failed >= 0 {
			g.lastReason = fmt.Sprintf("rank %d could not map its peers' buffers", failed)
			if openErr != nil {
				g.lastReason = openErr.Error()
			}
			return g.hostPath(ctx, send, recv, op, prescale, postscale)
		}
	}
	runErr := openErr // not nil only when reused: then the call fails on every rank
	if runErr == nil {
		runErr = g.reduceShare(ctx, src, rm, peers, dt, op, postscale, send.Count)
	}
	failed, err := g.anyFailed(ctx, runErr, "waiting for the other ranks' shares")
	switch {
	case err != nil:
		err = fmt.Errorf("cuda: same-host allreduce: waiting for the other ranks' shares: %w", err)
		if runErr != nil {
			err = fmt.Errorf("cuda: same-host allreduce: reducing this rank's share: %w (then %v)", runErr, err)
		}
		return g.brokenBy(err)
	case runErr != nil:
		return fmt.Errorf("cuda: same-host allreduce: reducing this rank's share: %w", runErr)
	case failed >= 0:
		return fmt.Errorf("cuda: same-host allreduce: rank %d failed to reduce its share; the result is undefined (that rank's error says why)", failed)
	}
	g.prev = recs
	if reused {
		g.stats.Reused++
	}
	g.stats.IPC++
	return nil
}

// hostPath runs the call through the communicator.
func (g *SameHostGroup) hostPath(ctx context.Context, send, recv collective.Buffer, op collective.ReduceOp, prescale, postscale float64) error {
	// Staged: the communicator's own algorithms, not this group again
	// (SameHostAllreducer makes the group the communicator's
	// DeviceAllreducer).
	opts := []collective.Option{collective.Staged()}
	if prescale != 1 {
		opts = append(opts, collective.Prescale(prescale))
	}
	if postscale != 1 {
		opts = append(opts, collective.Postscale(postscale))
	}
	if err := g.comm.Allreduce(ctx, send, recv, op, opts...); err != nil {
		return err
	}
	g.stats.Host++
	return nil
}

// deviceBuffers checks what the IPC path needs of the buffers: both memory
// of this device, the same dtype and count, fitting, and either the same
// memory or disjoint.
func (g *SameHostGroup) deviceBuffers(send, recv collective.Buffer) (*Memory, *Memory, error) {
	const what = "Allreduce"
	if send.Device == nil || recv.Device == nil {
		return nil, nil, g.dev.usage(what, "send and receive buffers must both be host or both be device memory")
	}
	if send.Host != nil || recv.Host != nil {
		return nil, nil, g.dev.usage(what, "a buffer sets both Host and Device memory")
	}
	if send.DType != recv.DType || send.Count != recv.Count {
		return nil, nil, g.dev.usage(what, fmt.Sprintf("send is %d %v but receive %d %v", send.Count, send.DType, recv.Count, recv.DType))
	}
	if send.Count < 0 {
		return nil, nil, g.dev.usage(what, fmt.Sprintf("negative count %d", send.Count))
	}
	var mems [2]*Memory
	for i, b := range []collective.Buffer{send, recv} {
		m, ok := b.Device.(*Memory)
		if !ok || m == nil {
			return nil, nil, g.dev.usage(what, fmt.Sprintf("%T is not CUDA memory of this backend", b.Device))
		}
		if m.dev != g.dev {
			return nil, nil, g.dev.usage(what, fmt.Sprintf("memory of device %d given to the group of device %d", m.dev.ordinal, g.dev.ordinal))
		}
		if err := m.checkTyped(what, 0, send.Bytes(), send.DType); err != nil {
			return nil, nil, err
		}
		mems[i] = m
	}
	s, r := mems[0], mems[1]
	if s.ptr != r.ptr && overlap(s.at(0), r.at(0), send.Bytes()) {
		return nil, nil, g.dev.usage(what, "send and receive buffers overlap without being the same memory")
	}
	if s.ptr == r.ptr {
		s = r
	}
	return s, r, nil
}

// export fills the record's handles; an error leaves OK false (the ranks
// then take the host path together).
func (g *SameHostGroup) export(ctx context.Context, src, dst *Memory) (callRecord, error) {
	var rec callRecord
	err := g.dev.withContext(ctx, func() error {
		for _, x := range []struct {
			m   *Memory
			h   *ipcHandle
			off *uint64
			who string
		}{{src, &rec.Src, &rec.SrcOff, "send"}, {dst, &rec.Dst, &rec.DstOff, "receive"}} {
			base, size, err := g.dev.drv.addressRange(x.m.ptr)
			if err != nil {
				return &DriverError{Device: g.dev.ordinal, Op: "cuMemGetAddressRange(" + x.who + " buffer)", Err: err}
			}
			off := uint64(x.m.ptr) - uint64(base)
			if off+uint64(x.m.size) > uint64(size) {
				return g.dev.usage("Allreduce", fmt.Sprintf("the %s buffer (%d bytes at 0x%x) runs past its allocation (%d bytes at 0x%x)", x.who, x.m.size, uintptr(x.m.ptr), size, base))
			}
			h, err := g.dev.drv.ipcGetHandle(uintptr(base))
			if err != nil {
				return &DriverError{Device: g.dev.ordinal, Op: "cuIpcGetMemHandle(" + x.who + " buffer's allocation)", Err: err,
					Hint: "memory from the virtual memory API (cuMemCreate, PyTorch's expandable segments) cannot be exported this way"}
			}
			*x.h, *x.off = h, off
		}
		return nil
	})
	rec.OK = err == nil
	return rec, err
}

// peerBufs are the device addresses, in this process, of one rank's source
// and destination.
type peerBufs struct {
	src, dst uint64
}

// openPeers maps (or finds mapped) every other rank's buffers. A peer that
// freed an allocation this process still maps and got the same memory back
// in a new allocation makes the driver refuse the new handle as already
// mapped: then every cached mapping (of allocations seen in earlier calls)
// is closed and the opening starts over, once.
func (g *SameHostGroup) openPeers(ctx context.Context, recs []callRecord) ([]peerBufs, error) {
	peers := make([]peerBufs, len(recs))
	err := g.dev.withContext(ctx, func() error {
		err := g.mapPeers(recs, peers)
		if err == nil || !isResult(err, resultAlreadyMapped) {
			return err
		}
		g.stats.Remaps++
		if cerr := g.maps.closeAll(); cerr != nil {
			return g.dev.driverErr("cuIpcCloseMemHandle(stale mappings)", cerr)
		}
		return g.mapPeers(recs, peers)
	})
	return peers, err
}

// mapPeers fills peers from the cache, on a locked thread with the context
// current; the driver's error is wrapped so that isResult sees it.
func (g *SameHostGroup) mapPeers(recs []callRecord, peers []peerBufs) error {
	r := g.comm.Rank()
	for k, rec := range recs {
		if k == r {
			continue
		}
		for _, x := range []struct {
			h   ipcHandle
			off uint64
			out *uint64
			who string
		}{{rec.Src, rec.SrcOff, &peers[k].src, "send"}, {rec.Dst, rec.DstOff, &peers[k].dst, "receive"}} {
			base, err := g.maps.get(x.h)
			if err != nil {
				return &DriverError{Device: g.dev.ordinal, Op: fmt.Sprintf("cuIpcOpenMemHandle(rank %d's %s buffer) or closing an old mapping", k, x.who), Err: err}
			}
			*x.out = uint64(base) + x.off
		}
	}
	return nil
}

// exchange fills all with every rank's record (this rank's rec at its
// index) and shows that every rank has reached this point: on the board,
// or as an allgather over the communicator.
func (g *SameHostGroup) exchange(ctx context.Context, rec, all []byte) error {
	if g.board != nil {
		got, err := g.board.exchange(ctx, rec, "exchanging handles")
		if err == nil {
			copy(all, got)
		}
		return err
	}
	return g.comm.Allgather(ctx, collective.HostBuffer(collective.Uint8, rec), collective.HostBuffer(collective.Uint8, all))
}

// anyFailed is a meeting where every rank says whether its last step
// failed: it returns the highest rank whose step failed (-1 when none), and
// returning means every rank has finished that step. On the board, or as an
// allreduce of one number over the communicator.
func (g *SameHostGroup) anyFailed(ctx context.Context, local error, step string) (int, error) {
	if g.board != nil {
		return g.board.agree(ctx, local, step)
	}
	v := []int32{0}
	if local != nil {
		v[0] = int32(g.comm.Rank() + 1)
	}
	b := collective.SliceBuffer(v)
	if err := g.comm.Allreduce(ctx, b, b, collective.Max); err != nil {
		return 0, err
	}
	return int(v[0]) - 1, nil
}

// brokenBy returns err, and when the ranks meet on the board (whose
// meetings are counted) marks the group unusable: a failed meeting may have
// left the ranks' counts apart. Over the communicator its own failure
// handling applies.
func (g *SameHostGroup) brokenBy(err error) error {
	if g.board != nil {
		g.broken = err
	}
	return err
}

// reduceShare reduces this rank's share of every rank's source into its
// destination, scales it, and writes it into every other rank's destination.
func (g *SameHostGroup) reduceShare(ctx context.Context, src, dst *Memory, peers []peerBufs, dt collective.DType, op collective.ReduceOp, postscale float64, count int) error {
	p, r := g.comm.Size(), g.comm.Rank()
	lo, hi := shareRange(count, p, r)
	n := hi - lo
	if n == 0 {
		return nil
	}
	kop := op
	if op == collective.Average {
		kop = collective.Sum
	}
	reduceName, err := kernels.ReduceKernel(dt, kop)
	if err != nil {
		return g.dev.usage("Allreduce", err.Error())
	}
	factor, divisor := finalScaling(dt, op, postscale, p)
	div := !dt.IsFloat() && divisor > 1
	scale := factor != 1 // floats: Average is folded into the factor
	var divName, scaleName string
	if div {
		if divName, err = kernels.DivKernel(dt); err != nil {
			return g.dev.usage("Allreduce", err.Error())
		}
	}
	if scale {
		if scaleName, err = kernels.ScaleKernel(dt); err != nil {
			return g.dev.usage("Allreduce", err.Error())
		}
	}
	off := uint64(lo * dt.Size())
	size := n * dt.Size()
	mine := dst.at(int(off))
	return g.dev.call(ctx, 0, func(s uintptr, _ uint64) error {
		a := src.at(int(off))
		for k := range p {
			if k == r {
				continue
			}
			if err := g.dev.launch(s, reduceName, n, mine, a, peers[k].src+off, uint64(n)); err != nil {
				return fmt.Errorf("reducing with rank %d's share: %w", k, err)
			}
			a = mine
		}
		if div {
			if err := g.dev.launch(s, divName, n, mine, uint64(n), uint64(int64(divisor))); err != nil {
				return err
			}
		}
		if scale {
			if err := g.dev.launch(s, scaleName, n, mine, uint64(n), math.Float64bits(factor)); err != nil {
				return err
			}
		}
		for k := range p {
			if k == r {
				continue
			}
			if err := g.dev.drv.memcpyDtoDAsync(peers[k].dst+off, mine, size, s); err != nil {
				return g.dev.driverErr(fmt.Sprintf("cuMemcpyDtoDAsync(share into rank %d's receive buffer)", k), err)
			}
		}
		return nil
	})
}
