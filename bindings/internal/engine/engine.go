package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime/debug"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/fusion"
)

// DefaultIOTimeout is how long a peer may stay silent inside a collective
// before the engine gives up on it. It is far longer than a Go trainer's
// (sync.WorkerIOTimeout): a framework process spends unbounded time between
// collectives (loading data, evaluating, checkpointing on rank 0), during
// which its peers wait in their next collective, and a process that died or
// froze is found by gossip within about a second anyway. What is left for
// the timeout is a process alive but hung in the framework's own code.
const DefaultIOTimeout = 10 * time.Minute

// Config configures an Engine. A zero field means its default
// (DefaultConfig).
type Config struct {
	// Worker is how the process joins (see sync.JoinJob): the job it names
	// when Worker.JobID is set, else the launcher's job when a launcher
	// started the process, else a world of one. Its Transport.IOTimeout
	// defaults to DefaultIOTimeout.
	Worker gsync.WorkerConfig
	Logger *slog.Logger
	// InlineBytes: a call made through one of the Now forms (a caller that
	// would wait for it at once) runs on the caller's own goroutine when its
	// buffers hold at most this many bytes and nothing is queued or running
	// (see Engine.now). Zero means DefaultInlineBytes; negative: never.
	InlineBytes int
	// SkipAgreement leaves out the comparison of every call's description
	// across the ranks before it runs (see agree.go), which costs one small
	// allreduce per call, and leaves Join the barrier it was (see Join). Ranks that then call different collectives get a
	// *collective.MismatchError only where the collective's frames show the
	// difference, and the world must be rebuilt before the next collective
	// (sync.ErrWorldChanged on the ranks that did not see it). Without the
	// comparison there is no pairing by name either (negotiate.go): calls
	// pair by their position in each rank's queue, names or not.
	SkipAgreement bool
	// PairTimeout is how long ranks whose next calls differ in name wait
	// for calls that every rank has pending (see negotiate.go) before each
	// fails its next call with a *collective.MismatchError. Zero means
	// Worker.Transport.IOTimeout: as long as a peer may stay silent inside a
	// collective.
	PairTimeout time.Duration
	// OpenDevice opens an accelerator for calls given device memory
	// (DeviceBuffer); nil: the engine takes host memory only, and refuses
	// device memory with ErrNoDevices. The engine closes what it opened at
	// Close.
	OpenDevice OpenDevice
}

// DefaultInlineBytes is Config.InlineBytes' default: transport.InlinePayload.
// A collective of up to that many bytes per exchange sends and receives on
// the goroutine that calls it; above it, it sends from a goroutine of its own,
// and a caller locked to its thread (a cgo callback) would pay a hand-over
// to it and back at every chunk, more than the one hand-over to the executor
// it saves.
const DefaultInlineBytes = transport.InlinePayload

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	w := gsync.DefaultWorkerConfig()
	w.Transport.IOTimeout = DefaultIOTimeout
	return Config{Worker: w, InlineBytes: DefaultInlineBytes}
}

// The errors an engine call returns besides a collective's own, tested with
// errors.Is. A world change is sync.ErrWorldChanged, a worker the job went on
// without sync.ErrExcluded, and ranks that called different collectives a
// *collective.MismatchError.
var (
	// ErrInvalid is wrapped by the error of a call refused for its
	// arguments before anything was sent: the world is untouched.
	ErrInvalid = errors.New("gorovod: invalid argument")
	// ErrHostsUpdated is Commit's report that every member moved to a newer
	// world at this step boundary (workers joined or left): the trainer
	// re-synchronizes its state from the new rank 0, then calls Reset.
	ErrHostsUpdated = errors.New("gorovod: the job moved to a new world at this commit")
	// ErrNotDone is Wait's answer when the timeout passed first: the handle
	// stays valid.
	ErrNotDone = errors.New("gorovod: not done yet")
	// ErrUnknownHandle is a handle this engine never issued, or one already
	// collected.
	ErrUnknownHandle = errors.New("gorovod: unknown handle")
	// ErrClosed is every call after Close.
	ErrClosed = errors.New("gorovod: shut down")
	// ErrInternal is wrapped by a panic recovered inside the engine.
	ErrInternal = errors.New("gorovod: internal error")
	// ErrInterrupted is the error of a call running on its caller's
	// goroutine that Interrupt aborted: the world it ran in is broken, and
	// the next collective finds it rebuilt (sync.ErrWorldChanged).
	ErrInterrupted = errors.New("gorovod: interrupted while the collective ran")
)

// Handle names a submitted call until Wait collects it. Handles are never
// reused; 0 is none.
type Handle uint64

// Topology places the process in the current world, as Horovod's rank,
// size, local_rank, local_size, cross_rank and cross_size do: local ranks
// are the members on this host (members whose collective address has this
// one's host), in rank order; the cross world of a process is the members
// with its local rank, one per host.
type Topology struct {
	Rank, Size           int
	LocalRank, LocalSize int
	CrossRank, CrossSize int
	// World is the world's epoch number: it changes whenever the world does.
	World uint64
}

// Engine is one process's gorovod. Its methods may be called from any
// goroutine (any thread, through the C ABI).
type Engine struct {
	log     *slog.Logger
	mem     *gsync.JobMember
	sess    *gsync.Session // the executor's alone once Start returns
	ctx     context.Context
	cancel  context.CancelFunc
	wake    chan struct{} // a submission or Close for the executor
	stopped chan struct{} // closed when the executor has exited

	samples atomic.Int64 // recorded since the last commit, for the autoscaler
	total   atomic.Int64 // the planned steps, -1 when not set since the last commit

	// adaptive is the adaptive batch size, once started (adaptive.go).
	adaptive atomic.Pointer[gsync.AdaptiveBatch]

	inlineBytes int
	agreement   bool // compare each call's description across the ranks first
	pairTimeout time.Duration

	// stuckSince is when negotiations began to pair nothing (zero: the last
	// one paired a call), and backoff the pause before the next one
	// (negotiate.go). The running call's alone (see running).
	stuckSince time.Time
	backoff    time.Duration

	mu      stdsync.Mutex
	queue   []*call
	handles map[Handle]*call
	next    Handle
	// running: a call is running, the executor's or one on its caller's
	// goroutine (now); the executor starts the next queued call only when
	// none is.
	running bool
	// inline is the context of a call running on its caller's goroutine
	// that Interrupt may abort (nil when none is), and abort ends it;
	// interrupts is that call's Caller.Interrupts (-1: none runs);
	// reported the largest count Interrupt was given.
	inline     context.Context
	abort      context.CancelFunc
	interrupts int64
	reported   uint64
	gen        uint64 // counts world changes: a call belongs to the world of its gen
	// unnamed counts the calls without a name submitted on each process
	// set in this world: the number that pairs each with the other ranks'
	// (keyLocked).
	unnamed map[int32]int64
	stale   error // a world change the trainer has not acknowledged (Reset)
	gone    error // nothing more can run: closed, or excluded from the job
	closing bool
	topo    Topology
	// sets are the process sets besides the world's (processset.go), and
	// nextSet the highest id given so far.
	sets    map[int32]*processSet
	nextSet int32
	// setFuser packs the allreduces on process sets (the world's go
	// through the session's own fuser); the executing goroutine's alone.
	setFuser *fusion.Fuser
	// comm is the world's communicator as of the last call that ran, for
	// point-to-point calls (p2p.go), which run beside the executor;
	// p2pRunning counts those still running.
	comm       *collective.Communicator
	p2pRunning stdsync.WaitGroup
	// devices are the accelerators calls named (device.go).
	devices devices
	// afterFinish, when set (by tests, under mu before the first
	// submission), is called by the executor after each call it completed,
	// before it looks at the queue again: it holds the executor in the
	// window where that call's caller, woken, makes its next call.
	afterFinish func()
}

// call is one submitted collective (or commit).
type call struct {
	what   string
	name   string // what pairs it with the other ranks' calls ("": its number; see negotiate.go)
	gen    uint64
	set    int32 // the process set it runs on (0: the world)
	commit bool
	// desc is what every rank must agree on before the call runs (not for
	// commit).
	desc description
	// layout is an allreduce's tensors (layoutOf), for ranks that joined;
	// joins marks Join, which takes part in the comparison its own way.
	layout []int64
	joins  bool
	// ready, when set, is waited for after the ranks paired the call and
	// before run touches its buffers: the event behind the work that
	// produces them on an accelerator (AfterEvent).
	ready func(ctx context.Context) error
	run   func(ctx context.Context, s *gsync.Session) error
	done  chan struct{}
	err   error
}

// Start joins the job (see Config.Worker) and returns once a world admits
// this process.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.Worker.Transport.IOTimeout == 0 {
		cfg.Worker.Transport.IOTimeout = DefaultIOTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.Worker.Logger = log
	mem, err := gsync.JoinJob(ctx, cfg.Worker, gsync.NewState())
	if err != nil {
		return nil, err
	}
	ectx, cancel := context.WithCancel(context.Background())
	if cfg.InlineBytes == 0 {
		cfg.InlineBytes = DefaultInlineBytes
	}
	if cfg.PairTimeout <= 0 {
		cfg.PairTimeout = cfg.Worker.Transport.IOTimeout
	}
	e := &Engine{
		log: log, mem: mem, sess: mem.Session(), ctx: ectx, cancel: cancel, inlineBytes: cfg.InlineBytes, interrupts: -1,
		agreement: !cfg.SkipAgreement, pairTimeout: cfg.PairTimeout, unnamed: make(map[int32]int64),
		wake: make(chan struct{}, 1), stopped: make(chan struct{}), handles: make(map[Handle]*call),
		sets: make(map[int32]*processSet), setFuser: fusion.NewFuser(cfg.Worker.Session.FusionBytes),
		devices: devices{open: cfg.OpenDevice},
	}
	e.total.Store(-1)
	e.topo = topology(e.sess)
	e.comm = e.sess.Communicator()
	go e.loop()
	return e, nil
}

// NewestWorld is the number of the newest world this process has been
// told of: Topology().World, or above it while a world change is under way
// (the job has agreed on a world that the engine moves to at its next
// call, or at the commit where every member does). breaking says that
// world goes on without a member of the current one that this process's
// gossip declared dead: the next call on the current world fails with
// ErrWorldChanged. A caller waiting outside the engine for the other ranks
// (on a store) asks it to learn that one of them will never come. It does
// not block.
func (e *Engine) NewestWorld() (number uint64, breaking bool) { return e.sess.Newest() }

// LeftRanks is the ranks, in the session's current world, of the members
// that left the job gracefully (their processes shut the library down):
// they will call nothing more in this world, whether or not the job forms
// one without them. A caller waiting outside the engine for the other
// ranks asks it, as NewestWorld. It does not block.
func (e *Engine) LeftRanks() []int { return e.sess.Left() }

// Topology is where the process stands in the current world (as of the last
// collective that completed).
func (e *Engine) Topology() Topology {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.topo
}

// topology computes the Topology of the session's current world.
func topology(s *gsync.Session) Topology {
	w, self := s.World(), s.Self()
	host := func(addr string) string {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			return h
		}
		return addr
	}
	t := Topology{Rank: w.Rank(self.Name), Size: len(w.Members), World: w.Number}
	mine := host(self.Addr)
	local := make([]int, len(w.Members)) // each member's local rank
	perHost := map[string]int{}
	for i, m := range w.Members {
		h := host(m.Addr)
		local[i] = perHost[h]
		perHost[h]++
		if h == mine {
			t.LocalSize++
		}
	}
	t.LocalRank = local[t.Rank]
	for i := range w.Members {
		if local[i] == t.LocalRank {
			if i < t.Rank {
				t.CrossRank++
			}
			t.CrossSize++
		}
	}
	return t
}

// submit queues c and returns its handle; it refuses at once what cannot
// run.
func (e *Engine) submit(c *call) (Handle, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.refused(); err != nil {
		return 0, err
	}
	return e.queueLocked(c), nil
}

// refused says why nothing can be submitted now, if so (under mu).
func (e *Engine) refused() error {
	switch {
	case e.gone != nil:
		return e.gone
	case e.closing:
		return ErrClosed
	case e.stale != nil:
		return e.stale
	}
	return nil
}

// queueLocked queues c for the executor (under mu) and returns its handle.
func (e *Engine) queueLocked(c *call) Handle {
	c.gen = e.gen
	e.keyLocked(c)
	return e.handleLocked(c, false)
}

// handleLocked gives c a handle and queues it (under mu): first when
// front (a call that began on its caller's goroutine, older than every
// queued one), else last.
func (e *Engine) handleLocked(c *call, front bool) Handle {
	c.done = make(chan struct{})
	e.next++
	e.handles[e.next] = c
	if front {
		e.queue = slices.Insert(e.queue, 0, c)
	} else {
		e.queue = append(e.queue, c)
	}
	e.wakeExecutor()
	return e.next
}

func (e *Engine) wakeExecutor() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// now runs c, which holds bytes bytes of buffers, for a caller about to wait
// for it. When nothing is queued or running and bytes is at most
// Config.InlineBytes, c runs right here, on the caller's goroutine, and now
// returns handle 0 and c's result: no hand-over to the executor and back.
// (For a caller that is a thread calling in from C, a cgo callback locked to
// that thread, each hand-over parks the thread and wakes another: two
// thread wake-ups per call, tens of microseconds each on an idle virtual
// machine, against a few microseconds for a small collective.) Otherwise c
// is queued as the asynchronous forms queue it and its handle returned.
// Order is kept: c runs here only when every call submitted before it has
// completed, and the executor starts nothing while it runs.
//
// Caller says how a call made through a Now form may run on its caller's
// goroutine.
type Caller struct {
	// Interruptible: Interrupt aborts the call while it runs there, when
	// its count is above Interrupts, the count the caller had seen when it
	// made the call: an interrupt from before the call (handled by the
	// caller between two calls, and reported late) leaves it alone.
	Interruptible bool
	Interrupts    uint64
	// LockedThread: the goroutine is locked to its OS thread, as a cgo
	// callback's is. The transports' waits then poll without yielding to
	// other goroutines (transport.OnLockedThread): from a locked goroutine a
	// yield costs two thread wake-ups.
	LockedThread bool
}

// now runs c as caller says.
func (e *Engine) now(c *call, bytes int, caller Caller) (Handle, error) {
	e.mu.Lock()
	if err := e.refused(); err != nil {
		e.mu.Unlock()
		return 0, err
	}
	if bytes > e.inlineBytes || e.running || len(e.queue) > 0 {
		h := e.queueLocked(c)
		e.mu.Unlock()
		return h, nil
	}
	if caller.Interruptible && e.reported > caller.Interrupts {
		// Interrupted between the caller's count and now.
		e.mu.Unlock()
		return 0, fmt.Errorf("%w: %s (before it started)", ErrInterrupted, c.what)
	}
	e.running = true
	c.gen = e.gen
	e.keyLocked(c)
	ctx := e.ctx
	if caller.Interruptible {
		// The context is made once and kept until an Interrupt uses it up.
		if e.abort == nil {
			e.inline, e.abort = context.WithCancel(e.ctx)
		}
		ctx = e.inline
		e.interrupts = int64(min(caller.Interrupts, math.MaxInt64))
	}
	e.mu.Unlock()
	run := ctx
	if caller.LockedThread {
		run = transport.OnLockedThread(ctx)
	}
	ran, err := e.execute(run, c)
	e.mu.Lock()
	e.running = false
	e.interrupts = -1
	if ran == c && caller.Interruptible && ctx.Err() != nil && e.ctx.Err() == nil && err != nil {
		err = fmt.Errorf("%w: %s (%v)", ErrInterrupted, c.what, err)
	}
	var h Handle
	if ran != c {
		// The ranks paired another call (or none yet): c waits in front of
		// the queue for the executor, and the caller for its handle.
		if ran != nil {
			e.dequeueLocked(ran)
		}
		h = e.handleLocked(c, true)
	}
	if len(e.queue) > 0 || e.closing {
		e.wakeExecutor() // what came meanwhile, or Close waiting for the loop
	}
	e.mu.Unlock()
	if ran != c {
		if ran != nil {
			ran.finish(err)
		}
		return h, nil
	}
	c.run = nil
	return 0, err
}

// Interrupt reports interrupts in all (a count that only grows: the C
// ABI's SIGINT watch counts a Python script's Ctrl-Cs). It aborts the call
// running on its caller's goroutine, if one is, it was made interruptible,
// and interrupts is above the count its caller had seen (Caller): it fails
// with ErrInterrupted, and the world it ran in breaks (the peers see this
// worker abort). Calls the executor runs are not touched: their callers
// wait in slices and can give up on their own.
func (e *Engine) Interrupt(interrupts uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reported = max(e.reported, interrupts)
	if e.running && e.abort != nil && e.interrupts >= 0 && interrupts > uint64(e.interrupts) {
		e.abort()
		e.inline, e.abort = nil, nil
	}
}

// loop is the executor: it runs the queued calls one at a time, in order
// (but for the calls the ranks pair by name: see negotiate.go), never while
// a call runs on its caller's goroutine (now).
func (e *Engine) loop() {
	defer close(e.stopped)
	for {
		e.mu.Lock()
		if len(e.queue) == 0 || e.running {
			done := e.closing && len(e.queue) == 0 && !e.running
			e.mu.Unlock()
			if done {
				return
			}
			<-e.wake
			continue
		}
		head := e.queue[0]
		gen, gone := e.gen, e.gone
		e.running = true
		e.mu.Unlock()
		var (
			ran *call
			err error
		)
		switch {
		case gone != nil:
			ran, err = head, gone
		case e.ctx.Err() != nil:
			ran, err = head, ErrClosed
		case head.gen != gen:
			ran, err = head, fmt.Errorf("%w: this %s was submitted before the world changed, and was not run", gsync.ErrWorldChanged, head.what)
		default:
			ran, err = e.execute(e.ctx, head)
		}
		// Nothing runs any more before ran's caller hears of it: a caller
		// that makes its next call through a Now form as soon as ran
		// completes must find the engine idle, as it would had ran run on
		// its own goroutine, and run that call on its goroutine, as the
		// other ranks do with theirs.
		e.mu.Lock()
		e.running = false
		if ran != nil {
			e.dequeueLocked(ran)
		}
		hook := e.afterFinish
		e.mu.Unlock()
		if ran == nil {
			e.pause()
			continue
		}
		ran.finish(err)
		if hook != nil {
			hook()
		}
	}
}

// execute runs head, or the pending call that the ranks pair (see
// negotiate.go), on the session with ctx, and records what happened to the
// world. It returns the call that ran (or failed) and its result; nil when
// no call paired yet.
func (e *Engine) execute(ctx context.Context, head *call) (c *call, err error) {
	before := e.sess.World().Number
	c = head
	if c.commit {
		if n := e.samples.Swap(0); n > 0 {
			e.sess.RecordSamples(int(n))
		}
		if n := e.total.Swap(-1); n >= 0 {
			e.sess.SetTotalSteps(n)
		}
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("%w: panic in %s: %v\n%s", ErrInternal, c.what, p, debug.Stack())
			}
		}()
		// Calls that are not collectives (the adaptive batch size's
		// bookkeeping: its start, the global batch, a micro-batch's norm)
		// have no description and nothing to agree on.
		if e.agreement && head.agrees() {
			c, err = e.pair(ctx, head)
			if c != nil {
				e.stuckSince, e.backoff = time.Time{}, 0 // a call paired
			}
			if err != nil || c == nil {
				return
			}
		}
		if c.ready != nil {
			if err = c.ready(ctx); err != nil {
				// The other ranks are about to run the call with this one:
				// breaking the world tells them at once (they rebuild it
				// without waiting out the I/O timeout), as any failure of a
				// rank inside a collective does.
				if comm := e.sess.Communicator(); comm != nil && ctx.Err() == nil {
					comm.Abort(err)
				}
				return
			}
		}
		err = c.run(ctx, e.sess)
	}()
	after := e.sess.World().Number
	if c == nil {
		if after == before && err == nil {
			return nil, nil
		}
		c = head
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.comm = e.sess.Communicator()
	if errors.Is(err, gsync.ErrExcluded) {
		e.gone = err
		return c, err
	}
	if e.ctx.Err() != nil && err != nil {
		return c, ErrClosed
	}
	if after == before {
		return c, err
	}
	e.gen++
	clear(e.unnamed)
	e.topo = topology(e.sess)
	e.dropSets() // their ranks were the old world's
	if err == nil && c.commit {
		err = ErrHostsUpdated
	}
	e.stale = fmt.Errorf("%w: the world changed (now %d workers, world %d) and the trainer has not re-synchronized its state yet (Reset)", gsync.ErrWorldChanged, e.topo.Size, e.topo.World)
	e.log.Info("the world changed", "call", c.what, "world", after, "rank", e.topo.Rank, "size", e.topo.Size, "err", err)
	return c, err
}

func (c *call) finish(err error) {
	c.err = err
	c.run, c.ready = nil, nil // nothing of the caller's memory is kept past completion
	close(c.done)
}

// Wait waits up to timeout (negative: until done) for h to complete and
// returns its result; a completed handle is forgotten. ErrNotDone means the
// timeout came first and h is still valid.
func (e *Engine) Wait(h Handle, timeout time.Duration) error {
	e.mu.Lock()
	c, ok := e.handles[h]
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %d", ErrUnknownHandle, h)
	}
	switch {
	case timeout < 0:
		<-c.done
	case timeout == 0:
		select {
		case <-c.done:
		default:
			return ErrNotDone
		}
	default:
		t := time.NewTimer(timeout)
		select {
		case <-c.done:
			t.Stop()
		case <-t.C:
			return ErrNotDone
		}
	}
	e.mu.Lock()
	delete(e.handles, h)
	e.mu.Unlock()
	return c.err
}

// Poll reports whether h has completed, without collecting it.
func (e *Engine) Poll(h Handle) (bool, error) {
	e.mu.Lock()
	c, ok := e.handles[h]
	e.mu.Unlock()
	if !ok {
		return false, fmt.Errorf("%w %d", ErrUnknownHandle, h)
	}
	select {
	case <-c.done:
		return true, nil
	default:
		return false, nil
	}
}

// Pending is how many handles have not been collected.
func (e *Engine) Pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.handles)
}

// Commit ends a step (see sync.Session.Commit): it returns nil when the
// world stayed as it was, ErrHostsUpdated when every member moved to a newer
// world here, sync.ErrWorldChanged when a failure was found and repaired (or
// the new world's rank 0 had not committed the step), and sync.ErrExcluded
// when the job goes on without this process. It runs after every call
// submitted before it.
func (e *Engine) Commit() (Handle, error) {
	return e.submit(&call{what: "commit", commit: true, run: func(ctx context.Context, s *gsync.Session) error {
		return s.Commit(ctx)
	}})
}

// Reset acknowledges a world change: the caller's next collectives are for
// the new world (its state re-synchronization first). Calls submitted
// before the change that are still queued fail anyway.
func (e *Engine) Reset() {
	e.mu.Lock()
	e.stale = nil
	e.mu.Unlock()
}

// RequestLeave asks to leave the job gracefully: a later Commit returns
// sync.ErrExcluded at the step boundary where the others move on without
// this process.
func (e *Engine) RequestLeave(ctx context.Context) error {
	return e.mem.RequestLeave(ctx)
}

// RecordSamples adds n to the samples this process trained on in the
// current step (the autoscaling engine measures throughput in samples).
func (e *Engine) RecordSamples(n int64) { e.samples.Add(n) }

// SetTotalSteps tells the autoscaling engine how many steps (commits) the
// job plans in all.
func (e *Engine) SetTotalSteps(n int64) { e.total.Store(max(n, 0)) }

// Close leaves the job. With finished (the trainer completed normally) the
// calls still queued run first and the job is told that training is over;
// otherwise the call in progress is aborted and the queued ones fail with
// ErrClosed. ctx bounds the wait for the queue in the finished case.
func (e *Engine) Close(ctx context.Context, finished bool) error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		<-e.stopped
		return nil
	}
	e.closing = true
	excluded := e.gone != nil
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	if !finished {
		e.cancel()
	}
	select {
	case <-e.stopped:
	case <-ctx.Done():
		e.cancel()
		<-e.stopped
		finished = false
	}
	e.cancel()
	e.p2pRunning.Wait() // the context's end fails them
	e.mu.Lock()
	if e.gone == nil {
		e.gone = ErrClosed
	}
	e.dropSets()
	e.mu.Unlock()
	e.setFuser.Close()
	var err error
	if finished && !excluded {
		err = e.mem.Finish(context.WithoutCancel(ctx))
	} else {
		err = e.mem.Close()
	}
	// The session has freed its fusion buffers on the devices by now.
	return errors.Join(err, e.devices.close())
}

// checkReduce validates a reduction before it is queued and fills in its
// defaults as sync.Reduction does: op 0 averages, scale factors 0 are 1.
func checkReduce(how gsync.Reduction) (gsync.Reduction, error) {
	if how.Op == 0 {
		how.Op = collective.Average
	}
	if !how.Op.Valid() {
		return how, fmt.Errorf("%w: reduce op %d (want sum 1, average 2, min 3, max 4, product 5 or adasum 6)", ErrInvalid, how.Op)
	}
	for _, f := range []*float64{&how.Prescale, &how.Postscale} {
		if *f == 0 {
			*f = 1
		}
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			return how, fmt.Errorf("%w: scale factor %v is not finite", ErrInvalid, *f)
		}
	}
	return how, nil
}

// checkBuffers validates host buffers before they are queued.
func checkBuffers(what string, bufs ...collective.Buffer) error {
	for i, b := range bufs {
		switch {
		case !b.DType.Valid():
			return fmt.Errorf("%w: %s tensor %d has dtype %d (want 1 to 7: float32, float64, float16, bfloat16, int32, int64, uint8)", ErrInvalid, what, i, b.DType)
		case b.Count < 0:
			return fmt.Errorf("%w: %s tensor %d has %d elements", ErrInvalid, what, i, b.Count)
		case b.Device == nil && len(b.Host) != b.Bytes():
			return fmt.Errorf("%w: %s tensor %d: %d bytes for %d %v elements", ErrInvalid, what, i, len(b.Host), b.Count, b.DType)
		}
	}
	return nil
}
