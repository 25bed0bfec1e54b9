package main

/*
#include <stdlib.h>
#include "gorovod.h"

void gorovod_set_error_(const char *msg, size_t n);
void gorovod_set_interrupt_fd_(int fd);
uint64_t gorovod_sigint_count_(void);
char *gorovod_take_name_(void);
int gorovod_take_cuda_(int32_t *device, uint64_t *event);
*/
import "C"

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/logging"
	gsync "github.com/gorovod/gorovod/sync"
	"golang.org/x/sys/unix"
)

// The process's engine. A C ABI serves one process, so this is the one
// place the library keeps state of its own (see doc.go).
var lib struct {
	initMu stdsync.Mutex // one init or shutdown at a time
	eng    atomic.Pointer[engine.Engine]
	// watching: the SIGINT watch's eventfd is read (watchInterrupts), once
	// per process.
	watching bool
}

// watchInterrupts makes the eventfd that shim.c's SIGINT handler writes to
// and a goroutine that interrupts the engine's call running on a caller's
// thread each time it does (the interruptible _start calls). It runs once,
// at the first init, and lasts as long as the process: the handler may run
// at any time. Without an eventfd the _start calls are simply never
// interrupted, as the blocking C calls are not.
func watchInterrupts() {
	if lib.watching {
		return
	}
	lib.watching = true
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "gorovod-sigint") // non-blocking: read through the poller
	C.gorovod_set_interrupt_fd_(C.int(fd))
	go func() {
		var b [8]byte
		for {
			if _, err := f.Read(b[:]); err != nil {
				return
			}
			if e := lib.eng.Load(); e != nil {
				e.Interrupt(uint64(C.gorovod_sigint_count_()))
			}
		}
	}()
}

// The status codes of gorovod.h.
const (
	statusOK            = C.GOROVOD_OK
	statusInvalid       = C.GOROVOD_ERR_INVALID_ARGUMENT
	statusNotInit       = C.GOROVOD_ERR_NOT_INITIALIZED
	statusMismatch      = C.GOROVOD_ERR_MISMATCH
	statusWorldChanged  = C.GOROVOD_ERR_WORLD_CHANGED
	statusHostsUpdated  = C.GOROVOD_ERR_HOSTS_UPDATED
	statusExcluded      = C.GOROVOD_ERR_EXCLUDED
	statusTimeout       = C.GOROVOD_ERR_TIMEOUT
	statusShutDown      = C.GOROVOD_ERR_SHUT_DOWN
	statusUnknownHandle = C.GOROVOD_ERR_UNKNOWN_HANDLE
	statusInternal      = C.GOROVOD_ERR_INTERNAL
	statusFailed        = C.GOROVOD_ERR_FAILED
)

var errNotInitialized = errors.New("gorovod: not initialized (call init first)")

// status maps an error onto its status code and, when it is a failure,
// records its message as the calling thread's last error.
func status(err error) C.int {
	if err == nil {
		return statusOK
	}
	var mismatch *collective.MismatchError
	code := C.int(statusFailed)
	switch {
	case errors.Is(err, engine.ErrNotDone):
		code = statusTimeout
	case errors.Is(err, engine.ErrInvalid):
		code = statusInvalid
	case errors.Is(err, errNotInitialized):
		code = statusNotInit
	case errors.As(err, &mismatch):
		code = statusMismatch
	case errors.Is(err, engine.ErrHostsUpdated):
		code = statusHostsUpdated
	case errors.Is(err, gsync.ErrWorldChanged):
		code = statusWorldChanged
	case errors.Is(err, gsync.ErrExcluded):
		code = statusExcluded
	case errors.Is(err, engine.ErrClosed):
		code = statusShutDown
	case errors.Is(err, engine.ErrUnknownHandle):
		code = statusUnknownHandle
	case errors.Is(err, engine.ErrInternal):
		code = statusInternal
	}
	setError(err.Error())
	return code
}

func setError(msg string) {
	if msg == "" {
		msg = "gorovod: unknown error"
	}
	b := []byte(msg)
	C.gorovod_set_error_((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
}

// guard turns a panic in an export into GOROVOD_ERR_INTERNAL: no panic may
// cross into C. Every export defers it.
func guard(rc *C.int) {
	if p := recover(); p != nil {
		*rc = status(fmt.Errorf("%w: panic: %v\n%s", engine.ErrInternal, p, debug.Stack()))
	}
}

func current() (*engine.Engine, error) {
	if e := lib.eng.Load(); e != nil {
		return e, nil
	}
	return nil, errNotInitialized
}

//export gorovodGoInit
func gorovodGoInit(cfg *C.gorovod_config) (rc C.int) {
	defer guard(&rc)
	lib.initMu.Lock()
	defer lib.initMu.Unlock()
	if lib.eng.Load() != nil {
		return statusOK
	}
	ec, err := engineConfig(cfg)
	if err != nil {
		return status(err)
	}
	e, err := engine.Start(context.Background(), ec)
	if err != nil {
		return status(fmt.Errorf("gorovod: joining the job: %w", err))
	}
	lib.eng.Store(e)
	watchInterrupts()
	return statusOK
}

// field reads a gorovod_config field that an older program's smaller struct
// may not have (its struct_size says).
func has(cfg *C.gorovod_config, offset, size uintptr) bool {
	return uintptr(cfg.struct_size) >= offset+size
}

// engineConfig turns a gorovod_config (nil: all defaults) into the engine's.
func engineConfig(cfg *C.gorovod_config) (engine.Config, error) {
	ec := engine.DefaultConfig()
	ec.OpenDevice = cudaOpener()
	level := 0
	if cfg != nil {
		if cfg.struct_size < C.uint32_t(unsafe.Offsetof(cfg.job_id)) {
			return ec, fmt.Errorf("%w: gorovod_config.struct_size %d (use gorovod_config_init)", engine.ErrInvalid, cfg.struct_size)
		}
		str := func(p *C.char, offset uintptr) string {
			if p == nil || !has(cfg, offset, unsafe.Sizeof(p)) {
				return ""
			}
			return C.GoString(p)
		}
		w := &ec.Worker
		w.JobID = str(cfg.job_id, unsafe.Offsetof(cfg.job_id))
		if w.JobID != "" {
			secret, err := hex.DecodeString(str(cfg.secret_hex, unsafe.Offsetof(cfg.secret_hex)))
			if err != nil || len(secret) < 16 {
				return ec, fmt.Errorf("%w: gorovod_config.secret_hex must be at least 16 hex-encoded bytes", engine.ErrInvalid)
			}
			w.Secret = secret
			for _, s := range strings.Split(str(cfg.seeds, unsafe.Offsetof(cfg.seeds)), ",") {
				if s = strings.TrimSpace(s); s != "" {
					w.Seeds = append(w.Seeds, s)
				}
			}
			if len(w.Seeds) == 0 {
				return ec, fmt.Errorf("%w: gorovod_config.seeds names no gossip address to join through", engine.ErrInvalid)
			}
			w.Transport.ListenAddr = str(cfg.listen_addr, unsafe.Offsetof(cfg.listen_addr))
			if g := str(cfg.gossip_addr, unsafe.Offsetof(cfg.gossip_addr)); g != "" {
				host, port, err := net.SplitHostPort(g)
				if err != nil {
					host, port = g, "0"
				}
				p, err := strconv.Atoi(port)
				if err != nil || p < 0 || p > 65535 {
					return ec, fmt.Errorf("%w: gorovod_config.gossip_addr %q", engine.ErrInvalid, g)
				}
				w.Membership.BindAddr, w.Membership.BindPort = host, p
			}
		}
		if has(cfg, unsafe.Offsetof(cfg.io_timeout_ms), 8) {
			switch ms := int64(cfg.io_timeout_ms); {
			case ms < 0:
				return ec, fmt.Errorf("%w: gorovod_config.io_timeout_ms %d", engine.ErrInvalid, ms)
			case ms > 0:
				w.Transport.IOTimeout = time.Duration(ms) * time.Millisecond
			}
		}
		if has(cfg, unsafe.Offsetof(cfg.fusion_bytes), 8) {
			switch n := int64(cfg.fusion_bytes); {
			case n < 0 || n > math.MaxInt32:
				return ec, fmt.Errorf("%w: gorovod_config.fusion_bytes %d", engine.ErrInvalid, n)
			case n > 0:
				w.Session.FusionBytes = int(n)
			}
		}
		if has(cfg, unsafe.Offsetof(cfg.log_level), 4) {
			level = int(cfg.log_level)
		}
	}
	switch level {
	case -1:
		ec.Logger = slog.New(slog.DiscardHandler)
	case 0, 1, 2:
		lv := []slog.Level{slog.LevelWarn, slog.LevelInfo, slog.LevelDebug}[level]
		ec.Logger = slog.New(logging.NewHandler(os.Stderr, lv, logging.FormatText))
	default:
		return ec, fmt.Errorf("%w: gorovod_config.log_level %d (want -1, 0, 1 or 2)", engine.ErrInvalid, level)
	}
	ec.Worker.Session.Collective.NewDeviceAllreducer = deviceAllreducer(ec.Worker.Transport.IOTimeout, ec.Logger)
	return ec, nil
}

//export gorovodGoShutdown
func gorovodGoShutdown(finished C.int) (rc C.int) {
	defer guard(&rc)
	lib.initMu.Lock()
	defer lib.initMu.Unlock()
	e := lib.eng.Swap(nil)
	if e == nil {
		return statusOK
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx, finished != 0); err != nil {
		return status(fmt.Errorf("gorovod: leaving the job: %w", err))
	}
	return statusOK
}

// gorovodGoCudaSupported is 1: every build takes CUDA device memory (cuda.go
// loads the driver when a call first names a device; the stand-in build has
// its own device), which gorovod.h documents for callers that also meet
// older libraries.
//
//export gorovodGoCudaSupported
func gorovodGoCudaSupported() (rc C.int) {
	defer guard(&rc)
	return 1
}

//export gorovodGoIsInitialized
func gorovodGoIsInitialized() (rc C.int) {
	defer guard(&rc)
	if lib.eng.Load() != nil {
		return 1
	}
	return 0
}

//export gorovodGoTopology
func gorovodGoTopology(out *C.gorovod_topology) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if out == nil {
		return status(fmt.Errorf("%w: topology: NULL output", engine.ErrInvalid))
	}
	t := e.Topology()
	*out = C.gorovod_topology{
		rank: C.int32_t(t.Rank), size: C.int32_t(t.Size),
		local_rank: C.int32_t(t.LocalRank), local_size: C.int32_t(t.LocalSize),
		cross_rank: C.int32_t(t.CrossRank), cross_size: C.int32_t(t.CrossSize),
		world: C.uint64_t(t.World),
	}
	return statusOK
}

//export gorovodGoNewestWorld
func gorovodGoNewestWorld(number *C.uint64_t, breaking *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if number == nil || breaking == nil {
		return status(fmt.Errorf("%w: newest world: NULL output", engine.ErrInvalid))
	}
	n, b := e.NewestWorld()
	*number, *breaking = C.uint64_t(n), 0
	if b {
		*breaking = 1
	}
	return statusOK
}

//export gorovodGoLeftRanks
func gorovodGoLeftRanks(ranks *C.int32_t, capacity C.int32_t, count *C.int32_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if count == nil || (ranks == nil && capacity > 0) || capacity < 0 {
		return status(fmt.Errorf("%w: left ranks: NULL output or negative capacity", engine.ErrInvalid))
	}
	left := e.LeftRanks()
	*count = C.int32_t(len(left))
	if capacity > 0 {
		out := unsafe.Slice(ranks, int(capacity))
		for i, r := range left {
			if i >= len(out) {
				break
			}
			out[i] = C.int32_t(r)
		}
	}
	return statusOK
}

//export gorovodGoDigest
func gorovodGoDigest(data unsafe.Pointer, nbytes C.int64_t, out *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	if out == nil || nbytes < 0 || (data == nil && nbytes > 0) {
		return status(fmt.Errorf("%w: digest: NULL output, negative size, or NULL data", engine.ErrInvalid))
	}
	if nbytes == 0 {
		*out = C.uint64_t(xxhash.Sum64(nil))
		return statusOK
	}
	*out = C.uint64_t(xxhash.Sum64(unsafe.Slice((*byte)(data), int(nbytes))))
	return statusOK
}

// hostBuffer wraps count elements of dtype at p, C memory, without copying;
// what and index (-1: none) name it in an error.
func hostBuffer(what string, index int, p unsafe.Pointer, count int64, dtype C.int32_t) (collective.Buffer, error) {
	dt := collective.DType(dtype)
	size := int64(dt.Size())
	name := func() string {
		if index < 0 {
			return what
		}
		return fmt.Sprintf("%s tensor %d", what, index)
	}
	switch {
	case dtype < 1 || dtype > 7:
		return collective.Buffer{}, fmt.Errorf("%w: %s: dtype %d (want 1 to 7: float32, float64, float16, bfloat16, int32, int64, uint8)", engine.ErrInvalid, name(), dtype)
	case count < 0 || count > math.MaxInt/size:
		return collective.Buffer{}, fmt.Errorf("%w: %s: %d elements", engine.ErrInvalid, name(), count)
	case count == 0:
		return collective.Buffer{DType: dt, Host: []byte{}}, nil
	case p == nil:
		return collective.Buffer{}, fmt.Errorf("%w: %s: NULL pointer for %d elements", engine.ErrInvalid, name(), count)
	}
	return collective.Buffer{DType: dt, Count: int(count), Host: unsafe.Slice((*byte)(p), int(count*size))}, nil
}

// memorySpace is where a call's buffers are: host memory, or the memory of
// a CUDA device (gorovod_cuda_next), whose event the call waits for.
type memorySpace struct {
	cuda   bool
	device int
	event  uintptr
}

// takeMemory takes what gorovod_cuda_next said of the calling thread's next
// collective: every collective takes it first thing, accepted or refused,
// as its name.
func takeMemory() memorySpace {
	var dev C.int32_t
	var ev C.uint64_t
	if C.gorovod_take_cuda_(&dev, &ev) == 0 {
		return memorySpace{}
	}
	return memorySpace{cuda: true, device: int(dev), event: uintptr(ev)}
}

// check refuses device memory where it cannot be taken: before a call is
// built, so that nothing was sent.
func (m memorySpace) check() error {
	switch {
	case !m.cuda:
		return nil
	case m.device < 0:
		return fmt.Errorf("%w: gorovod_cuda_next: device %d", engine.ErrInvalid, m.device)
	}
	return nil
}

// buffer is count elements of dtype at p, in this memory space: hostBuffer,
// or the device memory there; what and index name it in an error.
func (m memorySpace) buffer(e *engine.Engine, what string, index int, p unsafe.Pointer, count int64, dtype C.int32_t) (collective.Buffer, error) {
	if !m.cuda {
		return hostBuffer(what, index, p, count, dtype)
	}
	name := what
	if index >= 0 {
		name = fmt.Sprintf("%s tensor %d", what, index)
	}
	if err := m.check(); err != nil {
		return collective.Buffer{}, err
	}
	// The dtype's check (on no memory).
	if _, err := hostBuffer(what, index, nil, 0, dtype); err != nil {
		return collective.Buffer{}, err
	}
	if count < 0 || count > math.MaxInt/int64(collective.DType(dtype).Size()) {
		return collective.Buffer{}, fmt.Errorf("%w: %s: %d elements", engine.ErrInvalid, name, count)
	}
	b, err := e.DeviceBuffer(m.device, uintptr(p), collective.DType(dtype), int(count))
	if err != nil {
		return b, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// options are the call options of a call in this memory space (its event),
// after those given.
func (m memorySpace) options(e *engine.Engine, opts []engine.CallOption) []engine.CallOption {
	if !m.cuda || m.event == 0 {
		return opts
	}
	return append(opts, e.AfterEvent(m.device, m.event))
}

// pointers reads n pointers from a C array.
func pointers(p unsafe.Pointer, n int) []unsafe.Pointer {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*unsafe.Pointer)(p), n)
}

func int64s(p *C.int64_t, n int) []int64 {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(p)), n)
}

func int32s(p *C.int32_t, n int) []int32 {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(p)), n)
}

// counts reads a per-rank counts array of the world's size (nil stays nil).
func counts(what string, p *C.int64_t, size int) ([]int, error) {
	if p == nil {
		return nil, nil
	}
	out := make([]int, size)
	for r, n := range int64s(p, size) {
		if n < 0 || n > math.MaxInt32*int64(64) {
			return nil, fmt.Errorf("%w: %s: count %d for rank %d", engine.ErrInvalid, what, n, r)
		}
		out[r] = int(n)
	}
	return out, nil
}

// issue stores h for the caller, or reports why there is none.
func issue(out *C.gorovod_handle, h engine.Handle, err error) C.int {
	if err != nil {
		return status(err)
	}
	*out = C.gorovod_handle(h)
	return statusOK
}

func reduction(op C.int, pre, post C.double) gsync.Reduction {
	return gsync.Reduction{Op: collective.ReduceOp(op), Prescale: float64(pre), Postscale: float64(post)}
}

// takeName takes the name gorovod_name_next gave the calling thread's next
// collective: the option that names it, or none. Every collective takes it
// first thing, accepted or refused, so that it never names a later one;
// barrier and join drop it (they have no name, as in Horovod).
func takeName() []engine.CallOption {
	p := C.gorovod_take_name_()
	if p == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(p))
	return []engine.CallOption{engine.Name(C.GoString(p))}
}

//export gorovodGoAllreduceAsync
func gorovodGoAllreduceAsync(set, n C.int32_t, send, recv unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, ndims *C.int32_t, dims *C.int64_t, op C.int, pre, post C.double, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return allreduce(int32(set), n, send, recv, cnts, dtypes, ndims, dims, op, pre, post, submitAsync, h)
}

//export gorovodGoAllreduceStart
func gorovodGoAllreduceStart(set, n C.int32_t, send, recv unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, ndims *C.int32_t, dims *C.int64_t, op C.int, pre, post C.double, flags C.int, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return allreduce(int32(set), n, send, recv, cnts, dtypes, ndims, dims, op, pre, post, startMode(flags), h)
}

// How a call is submitted: queued for the engine's executor (the _async
// calls), or for a caller about to wait (the _start calls: it may run on the
// caller's thread; see engine.Engine.AllreduceNow), interruptibly or not.
type submitMode int

const (
	submitAsync submitMode = iota
	submitNow
	submitNowInterruptible
)

// caller is how a _start call runs on its caller's goroutine: a cgo
// callback's, locked to the C thread.
func (m submitMode) caller() engine.Caller {
	c := engine.Caller{LockedThread: true}
	if m == submitNowInterruptible {
		c.Interruptible, c.Interrupts = true, uint64(C.gorovod_sigint_count_())
	}
	return c
}

func startMode(flags C.int) submitMode {
	if flags&C.GOROVOD_START_INTERRUPTIBLE != 0 {
		return submitNowInterruptible
	}
	return submitNow
}

// submit submits a call as mode says, through queue (the engine's
// asynchronous form) or now (its Now form, for a caller about to wait), and
// stores what that gave the caller: the handle of a queued call, or 0 and
// the result of one that ran on the caller's thread.
func (m submitMode) submit(out *C.gorovod_handle, queue func() (engine.Handle, error), now func(engine.Caller) (engine.Handle, error)) C.int {
	if m == submitAsync {
		h, err := queue()
		return issue(out, h, err)
	}
	h, err := now(m.caller())
	*out = C.gorovod_handle(h)
	return status(err)
}

// allreduce submits an allreduce of n tensors; ndims (NULL: not given)
// holds each tensor's number of dimensions and dims their sizes, one after
// another, which every rank compares (see engine.Engine.AllreduceShapedOn).
func allreduce(set int32, n C.int32_t, send, recv unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, ndims *C.int32_t, dims *C.int64_t, op C.int, pre, post C.double, mode submitMode, h *C.gorovod_handle) C.int {
	name, space := takeName(), takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil || recv == nil || cnts == nil || dtypes == nil || n < 0 {
		return status(fmt.Errorf("%w: allreduce: NULL handle, receive buffers, counts or dtypes, or %d tensors", engine.ErrInvalid, n))
	}
	if op < 1 || op > 6 {
		return status(fmt.Errorf("%w: allreduce: reduce op %d (want sum 1, average 2, min 3, max 4, product 5 or adasum 6)", engine.ErrInvalid, op))
	}
	num := int(n)
	cs, ds := int64s(cnts, num), int32s(dtypes, num)
	recvs := make([]collective.Buffer, num)
	var sends []collective.Buffer
	rp, sp := pointers(recv, num), pointers(send, num)
	if sp != nil {
		sends = make([]collective.Buffer, num)
	}
	for i := range num {
		if recvs[i], err = space.buffer(e, "allreduce", i, rp[i], cs[i], C.int32_t(ds[i])); err != nil {
			return status(err)
		}
		switch {
		case sp == nil:
		case space.cuda && sp[i] == rp[i]:
			sends[i] = recvs[i] // in place: the same memory
		default:
			if sends[i], err = space.buffer(e, "allreduce", i, sp[i], cs[i], C.int32_t(ds[i])); err != nil {
				return status(err)
			}
		}
	}
	shapes, err := shapesOf(num, ndims, dims)
	if err != nil {
		return status(err)
	}
	how := reduction(op, pre, post)
	opts := space.options(e, name)
	return mode.submit(h, func() (engine.Handle, error) { return e.AllreduceShapedOn(set, sends, recvs, shapes, how, opts...) },
		func(c engine.Caller) (engine.Handle, error) {
			return e.AllreduceShapedNowOn(set, sends, recvs, shapes, how, c, opts...)
		})
}

// maxDims bounds a tensor's number of dimensions (PyTorch's is 64 too).
const maxDims = 64

// shapesOf reads n tensors' shapes: ndims[i] dimensions each, their sizes
// one after another in dims; nil when ndims is NULL.
func shapesOf(n int, ndims *C.int32_t, dims *C.int64_t) ([][]int64, error) {
	if ndims == nil {
		return nil, nil
	}
	nd := int32s(ndims, n)
	total := 0
	for i, k := range nd {
		if k < 0 || k > maxDims {
			return nil, fmt.Errorf("%w: allreduce tensor %d: %d dimensions (want 0 to %d)", engine.ErrInvalid, i, k, maxDims)
		}
		total += int(k)
	}
	if total > 0 && dims == nil {
		return nil, fmt.Errorf("%w: allreduce: NULL dims for %d dimensions", engine.ErrInvalid, total)
	}
	all := int64s(dims, total)
	shapes := make([][]int64, n)
	for i, k := range nd {
		shapes[i] = slices.Clone(all[:k])
		all = all[k:]
	}
	return shapes, nil
}

//export gorovodGoBroadcastAsync
func gorovodGoBroadcastAsync(set, n C.int32_t, bufs unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, root C.int32_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return broadcast(int32(set), n, bufs, cnts, dtypes, root, submitAsync, h)
}

//export gorovodGoBroadcastStart
func gorovodGoBroadcastStart(set, n C.int32_t, bufs unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, root C.int32_t, flags C.int, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return broadcast(int32(set), n, bufs, cnts, dtypes, root, startMode(flags), h)
}

func broadcast(set int32, n C.int32_t, bufs unsafe.Pointer, cnts *C.int64_t, dtypes *C.int32_t, root C.int32_t, mode submitMode, h *C.gorovod_handle) C.int {
	name, space := takeName(), takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil || bufs == nil || cnts == nil || dtypes == nil || n < 0 {
		return status(fmt.Errorf("%w: broadcast: NULL handle, buffers, counts or dtypes, or %d tensors", engine.ErrInvalid, n))
	}
	num := int(n)
	cs, ds, ps := int64s(cnts, num), int32s(dtypes, num), pointers(bufs, num)
	bs := make([]collective.Buffer, num)
	for i := range num {
		if bs[i], err = space.buffer(e, "broadcast", i, ps[i], cs[i], C.int32_t(ds[i])); err != nil {
			return status(err)
		}
	}
	opts := space.options(e, name)
	return mode.submit(h, func() (engine.Handle, error) { return e.BroadcastOn(set, bs, int(root), opts...) },
		func(c engine.Caller) (engine.Handle, error) { return e.BroadcastNowOn(set, bs, int(root), c, opts...) })
}

//export gorovodGoAllgatherAsync
func gorovodGoAllgatherAsync(set C.int32_t, send unsafe.Pointer, count C.int64_t, recv unsafe.Pointer, recvCounts *C.int64_t, dtype C.int, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	name, space := takeName(), takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil {
		return status(fmt.Errorf("%w: allgather: NULL handle", engine.ErrInvalid))
	}
	size, _, err := setSize(e, set)
	if err != nil {
		return status(err)
	}
	cs, err := counts("allgather", recvCounts, size)
	if err != nil {
		return status(err)
	}
	if cs == nil {
		cs = make([]int, size)
		for r := range cs {
			cs[r] = int(count)
		}
	}
	total := int64(0)
	for _, c := range cs {
		total += int64(c)
	}
	s, err := space.buffer(e, "allgather send", -1, send, int64(count), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	r, err := space.buffer(e, "allgather receive", -1, recv, total, C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	hd, err := e.AllgatherOn(int32(set), s, r, cs, space.options(e, name)...)
	return issue(h, hd, err)
}

//export gorovodGoAlltoallAsync
func gorovodGoAlltoallAsync(set C.int32_t, send unsafe.Pointer, sendCounts *C.int64_t, recv unsafe.Pointer, recvCounts *C.int64_t, dtype C.int, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	name, space := takeName(), takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil || sendCounts == nil || recvCounts == nil {
		return status(fmt.Errorf("%w: alltoall: NULL handle or counts", engine.ErrInvalid))
	}
	size, _, err := setSize(e, set)
	if err != nil {
		return status(err)
	}
	sc, err := counts("alltoall send", sendCounts, size)
	if err != nil {
		return status(err)
	}
	rcs, err := counts("alltoall receive", recvCounts, size)
	if err != nil {
		return status(err)
	}
	s, err := space.buffer(e, "alltoall send", -1, send, sum(sc), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	r, err := space.buffer(e, "alltoall receive", -1, recv, sum(rcs), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	hd, err := e.AlltoallOn(int32(set), s, sc, r, rcs, space.options(e, name)...)
	return issue(h, hd, err)
}

func sum(cs []int) int64 {
	t := int64(0)
	for _, c := range cs {
		t += int64(c)
	}
	return t
}

//export gorovodGoReducescatterAsync
func gorovodGoReducescatterAsync(set C.int32_t, send unsafe.Pointer, count C.int64_t, recv unsafe.Pointer, recvCounts *C.int64_t, dtype, op C.int, pre, post C.double, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	name, space := takeName(), takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil {
		return status(fmt.Errorf("%w: reducescatter: NULL handle", engine.ErrInvalid))
	}
	if op < 1 || op > 6 {
		return status(fmt.Errorf("%w: reducescatter: reduce op %d (want sum 1, average 2, min 3, max 4 or product 5)", engine.ErrInvalid, op))
	}
	size, rank, err := setSize(e, set)
	if err != nil {
		return status(err)
	}
	cs, err := counts("reducescatter", recvCounts, size)
	if err != nil {
		return status(err)
	}
	if cs == nil {
		cs = make([]int, size)
		for r := range cs {
			cs[r] = int(int64(count) / int64(size))
			if int64(r) < int64(count)%int64(size) {
				cs[r]++
			}
		}
	}
	s, err := space.buffer(e, "reducescatter send", -1, send, int64(count), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	r, err := space.buffer(e, "reducescatter receive", -1, recv, int64(cs[rank]), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	hd, err := e.ReduceScatterOn(int32(set), s, r, cs, reduction(op, pre, post), space.options(e, name)...)
	return issue(h, hd, err)
}

//export gorovodGoBarrierAsync
func gorovodGoBarrierAsync(set C.int32_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return barrier(int32(set), submitAsync, h)
}

//export gorovodGoBarrierStart
func gorovodGoBarrierStart(set C.int32_t, flags C.int, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	return barrier(int32(set), startMode(flags), h)
}

func barrier(set int32, mode submitMode, h *C.gorovod_handle) C.int {
	takeName()
	takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil {
		return status(fmt.Errorf("%w: barrier: NULL handle", engine.ErrInvalid))
	}
	return mode.submit(h, func() (engine.Handle, error) { return e.BarrierOn(set) },
		func(c engine.Caller) (engine.Handle, error) { return e.BarrierNowOn(set, c) })
}

// p2pEngine checks what every point-to-point call needs (host memory: no
// gorovod_cuda_next before it; a handle to write) and returns the engine.
func p2pEngine(what string, h *C.gorovod_handle) (*engine.Engine, error) {
	space := takeMemory()
	e, err := current()
	if err != nil {
		return nil, err
	}
	if space.cuda {
		return nil, fmt.Errorf("%w: %s: point-to-point messages take host memory only (gorovod_cuda_next was called before it)", engine.ErrInvalid, what)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: %s: NULL handle", engine.ErrInvalid, what)
	}
	return e, nil
}

//export gorovodGoP2PAsync
func gorovodGoP2PAsync(send C.int, buf unsafe.Pointer, count C.int64_t, dtype C.int, peer C.int32_t, tag C.uint64_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	what := "recv"
	if send != 0 {
		what = "send"
	}
	e, err := p2pEngine(what, h)
	if err != nil {
		return status(err)
	}
	b, err := hostBuffer(what, -1, buf, int64(count), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	var handle engine.Handle
	if send != 0 {
		handle, err = e.Send(int(peer), uint64(tag), b)
	} else {
		handle, err = e.Recv(int(peer), uint64(tag), b)
	}
	if err != nil {
		return status(err)
	}
	*h = C.gorovod_handle(handle)
	return statusOK
}

//export gorovodGoRecvAnyAsync
func gorovodGoRecvAnyAsync(ps C.int32_t, buf unsafe.Pointer, count C.int64_t, dtype C.int, tag C.uint64_t, source *C.int32_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	const what = "recv from any rank"
	e, err := p2pEngine(what, h)
	if err != nil {
		return status(err)
	}
	if source == nil {
		return status(fmt.Errorf("%w: %s: NULL source", engine.ErrInvalid, what))
	}
	b, err := hostBuffer(what, -1, buf, int64(count), C.int32_t(dtype))
	if err != nil {
		return status(err)
	}
	handle, err := e.RecvAnyOn(int32(ps), uint64(tag), b, (*int32)(unsafe.Pointer(source)))
	if err != nil {
		return status(err)
	}
	*h = C.gorovod_handle(handle)
	return statusOK
}

//export gorovodGoJoinAsync
func gorovodGoJoinAsync(last *C.int32_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	takeName()
	takeMemory()
	e, err := current()
	if err != nil {
		return status(err)
	}
	if h == nil {
		return status(fmt.Errorf("%w: join: NULL handle", engine.ErrInvalid))
	}
	hd, err := e.Join((*int32)(unsafe.Pointer(last)))
	return issue(h, hd, err)
}

// setSize returns the size of process set set (0: the world) and this
// process's rank in it: the length of a call's per-rank counts.
func setSize(e *engine.Engine, set C.int32_t) (size, rank int, err error) {
	info, err := e.ProcessSet(int32(set))
	if err != nil {
		return 0, 0, err
	}
	if info.Rank < 0 {
		return 0, 0, fmt.Errorf("rank %d: %w %d (ranks %v)", e.Topology().Rank, engine.ErrNotMember, set, info.Ranks)
	}
	return len(info.Ranks), info.Rank, nil
}

//export gorovodGoAddProcessSet
func gorovodGoAddProcessSet(ranks *C.int32_t, n C.int32_t, id *C.int32_t) (rc C.int) {
	defer guard(&rc)
	var got int32
	e, h, err := addProcessSet(ranks, n, id, &got)
	if err != nil {
		return status(err)
	}
	if err := e.Wait(h, -1); err != nil {
		return status(err)
	}
	*id = C.int32_t(got)
	return statusOK
}

//export gorovodGoAddProcessSetAsync
func gorovodGoAddProcessSetAsync(ranks *C.int32_t, n C.int32_t, id *C.int32_t, h *C.gorovod_handle) (rc C.int) {
	defer guard(&rc)
	if h == nil {
		return status(fmt.Errorf("%w: add process set: NULL handle", engine.ErrInvalid))
	}
	// The engine writes the id into the caller's memory when the
	// registration runs, as a collective writes its outputs: the caller
	// keeps id valid until the handle completes (gorovod.h).
	_, hd, err := addProcessSet(ranks, n, id, (*int32)(unsafe.Pointer(id)))
	return issue(h, hd, err)
}

// addProcessSet checks a registration's arguments (id is the caller's
// output, checked for NULL) and queues it; the engine writes the set's id
// to *into (id itself, or a Go variable of the blocking form) when it runs.
func addProcessSet(ranks *C.int32_t, n C.int32_t, id *C.int32_t, into *int32) (*engine.Engine, engine.Handle, error) {
	e, err := current()
	if err != nil {
		return nil, 0, err
	}
	if id == nil || n < 0 || (ranks == nil && n > 0) {
		return nil, 0, fmt.Errorf("%w: add process set: NULL ranks or id, or %d ranks", engine.ErrInvalid, n)
	}
	rs := make([]int, n)
	for i, r := range int32s(ranks, int(n)) {
		rs[i] = int(r)
	}
	h, err := e.AddProcessSet(rs, into)
	return e, h, err
}

//export gorovodGoRemoveProcessSet
func gorovodGoRemoveProcessSet(id C.int32_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	h, err := e.RemoveProcessSet(int32(id))
	if err != nil {
		return status(err)
	}
	return status(e.Wait(h, -1))
}

//export gorovodGoProcessSetGet
func gorovodGoProcessSetGet(id C.int32_t, rank, size, ranks *C.int32_t, capacity C.int32_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	info, err := e.ProcessSet(int32(id))
	if err != nil {
		return status(err)
	}
	if rank != nil {
		*rank = C.int32_t(info.Rank)
	}
	if size != nil {
		*size = C.int32_t(len(info.Ranks))
	}
	if ranks != nil && capacity > 0 {
		out := unsafe.Slice((*int32)(unsafe.Pointer(ranks)), int(capacity))
		for i := 0; i < len(info.Ranks) && i < len(out); i++ {
			out[i] = int32(info.Ranks[i])
		}
	}
	return statusOK
}

//export gorovodGoProcessSetIds
func gorovodGoProcessSetIds(ids *C.int32_t, capacity C.int32_t, n *C.int32_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if n == nil {
		return status(fmt.Errorf("%w: process set ids: NULL count", engine.ErrInvalid))
	}
	all := e.ProcessSets()
	*n = C.int32_t(len(all))
	if ids != nil && capacity > 0 {
		out := unsafe.Slice((*int32)(unsafe.Pointer(ids)), int(capacity))
		copy(out, all)
	}
	return statusOK
}

//export gorovodGoPoll
func gorovodGoPoll(h C.gorovod_handle, done *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if done == nil {
		return status(fmt.Errorf("%w: poll: NULL output", engine.ErrInvalid))
	}
	ok, err := e.Poll(engine.Handle(h))
	if err != nil {
		return status(err)
	}
	*done = 0
	if ok {
		*done = 1
	}
	return statusOK
}

//export gorovodGoWait
func gorovodGoWait(h C.gorovod_handle, timeoutUs C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	timeout := time.Duration(-1)
	if timeoutUs >= 0 {
		timeout = time.Duration(min(int64(timeoutUs), math.MaxInt64/1000)) * time.Microsecond
	}
	return status(e.Wait(engine.Handle(h), timeout))
}

//export gorovodGoCommit
func gorovodGoCommit() (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	h, err := e.Commit()
	if err != nil {
		return status(err)
	}
	return status(e.Wait(h, -1))
}

//export gorovodGoReset
func gorovodGoReset() (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	e.Reset()
	return statusOK
}

//export gorovodGoRequestLeave
func gorovodGoRequestLeave() (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return status(e.RequestLeave(ctx))
}

//export gorovodGoRecordSamples
func gorovodGoRecordSamples(n C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if n < 0 {
		return status(fmt.Errorf("%w: record_samples(%d)", engine.ErrInvalid, n))
	}
	e.RecordSamples(int64(n))
	return statusOK
}

//export gorovodGoSetTotalSteps
func gorovodGoSetTotalSteps(n C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if n < 0 {
		return status(fmt.Errorf("%w: set_total_steps(%d)", engine.ErrInvalid, n))
	}
	e.SetTotalSteps(int64(n))
	return statusOK
}
