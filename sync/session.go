package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/fusion"
	"github.com/gorovod/gorovod/sync/stats"
)

// Config configures a Session. A zero field means its default
// (DefaultConfig); JobID and Self are required.
type Config struct {
	JobID      string
	Self       epoch.Member // this worker: its unique name and collective address
	Collective collective.Config
	// FusionBytes bounds one fused allreduce (Horovod's fusion threshold).
	FusionBytes int
	// RecoveryTimeout bounds the wait for the next world after a failure (for
	// example while fewer than the minimum number of workers remain).
	RecoveryTimeout time.Duration
	// ConnectTimeout bounds connecting a new world's members (default
	// 30 s, the transports' I/O timeout): a member that never connects — its
	// gossip answers, its training is stuck — is then blamed, and the next
	// world goes on without it (epoch.ProposerConfig.BlameLimit) instead of
	// the others waiting for it until RecoveryTimeout.
	ConnectTimeout time.Duration
	// OnStats, if set, receives the worker's step statistics in batches of
	// about StatsEvery steps (default stats.DefaultEvery), for the driver's
	// autoscaling engine. It is called on the training goroutine inside
	// Commit, so it must hand the batch off without blocking.
	OnStats    func(stats.Batch)
	StatsEvery int
	// GradientNoise measures the gradient noise scale in the gradient
	// allreduce (goodput; see NoiseConfig). Train turns it on.
	GradientNoise NoiseConfig
	Logger        *slog.Logger
	// Timeline, if set, records the session's steps, gradient allreduces
	// (and the queueing of asynchronous ones), world switches, state
	// broadcasts and recoveries, and, through Collective.Tracer, every
	// collective with its phases. Its owner closes it after the session.
	Timeline *timeline.Timeline
	// StallCheck is how long a collective may wait for ranks that have not
	// entered it before the stall inspector warns (Logger, Timeline and
	// OnStallSnapshot): default DefaultStallCheck; negative turns it off.
	StallCheck time.Duration
	// OnStallSnapshot, if set, receives the stall inspector's snapshot at
	// every warning and every StallCheck/2 (the driver finds the missing
	// ranks from every rank's snapshot). It is called on the inspector's
	// goroutine and must not block.
	OnStallSnapshot func(stall.Snapshot)
}

// ErrInvalidConfig is wrapped by every error about a Config or WorkerConfig
// that cannot work.
var ErrInvalidConfig = errors.New("sync: invalid configuration")

// DefaultConfig returns the defaults; JobID and Self must still be set.
func DefaultConfig() Config {
	return Config{
		Collective:      collective.DefaultConfig(),
		FusionBytes:     fusion.DefaultBytes,
		RecoveryTimeout: 10 * time.Minute,
		ConnectTimeout:  transport.DefaultIOTimeout,
		StatsEvery:      stats.DefaultEvery,
	}
}

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.JobID == "" || c.Self.Name == "" || c.Self.Addr == "" {
		return c, fmt.Errorf("%w: Config needs JobID and Self (name and address)", ErrInvalidConfig)
	}
	if err := c.Collective.Validate(); err != nil {
		return c, err
	}
	c.Collective = c.Collective.WithDefaults()
	if c.FusionBytes == 0 {
		c.FusionBytes = d.FusionBytes
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.RecoveryTimeout == 0 {
		c.RecoveryTimeout = d.RecoveryTimeout
	}
	if c.StatsEvery == 0 {
		c.StatsEvery = d.StatsEvery
	}
	if c.StallCheck == 0 {
		c.StallCheck = DefaultStallCheck
	}
	if c.Timeline != nil {
		c.Collective.Tracer = collective.Tracers(c.Collective.Tracer, c.Timeline.CollectiveTracer())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.FusionBytes < 0 || c.RecoveryTimeout < 0 || c.ConnectTimeout < 0 || c.StatsEvery < 0 {
		return c, fmt.Errorf("%w: FusionBytes, RecoveryTimeout, ConnectTimeout and StatsEvery must not be negative", ErrInvalidConfig)
	}
	return c, nil
}

// Session is the trainer's handle on the elastic world: it reduces gradients
// among the current members, and at step boundaries moves every member to the
// next agreed epoch together, bringing joiners up to date and repairing the
// world after a failure. Train runs the loop below for a trainer; a binding
// that drives training step by step calls these methods itself.
//
// The training loop:
//
//	for sess.Step() < steps {
//		compute(params, batch, grads)
//		if err := sess.Allreduce(ctx, sync.Reduction{}, collective.SliceBuffer(grads)); errors.Is(err, sync.ErrWorldChanged) {
//			continue // state was re-synchronized: recompute this step
//		} else if err != nil {
//			return err
//		}
//		apply(params, grads)
//		if err := sess.Commit(ctx); err != nil && !errors.Is(err, sync.ErrWorldChanged) {
//			return err
//		}
//	}
type Session struct {
	cfg   Config
	t     transport.Transport
	src   epoch.Source
	state *State
	fuser *fusion.Fuser
	log   *slog.Logger

	// mu guards epoch and comm against AbortIfMember, which runs on another
	// goroutine; the training goroutine is the only writer.
	mu    stdsync.Mutex
	epoch epoch.World
	comm  *collective.Communicator

	// newest is the highest epoch number any member knew of during this
	// step's gradient allreduce (carried in its frames, see collective.MaxTag);
	// tagged says whether a gradient allreduce has run since the last Commit.
	newest uint64
	tagged bool

	// Asynchronous allreduces: their own fuser (they run beside the trainer's
	// goroutine), the last one started (the next waits for it), and the
	// epoch number they carried back.
	asyncFuser  *fusion.Fuser
	lastAsync   *Handle
	asyncNewest uint64
	asyncTagged bool

	clock stats.Clock
	// noise measures the gradient noise (nil when off).
	noise *gradNoise
	// synced: this session holds the job's state (it entered a world, and
	// received the state or gave it); a joiner's is its own initial one.
	synced bool
	closed bool // Close was called (guarded by mu)
	obs    *observer
	// entering is how the last entry into a world spent its time
	// (connecting its members, agreeing on the state and receiving it),
	// for the log line that reports it.
	entering struct {
		connect, state time.Duration
		rekeyed        int // links carried over from the last world
	}
	// next is the next world's links being connected ahead of the
	// step boundary (Prepare); guarded by mu.
	next *preconnect
	// enteringNumber is the epoch enter is connecting (guarded by mu), for
	// Prepare, which leaves it alone.
	enteringNumber uint64
	// carried is the links of the world left at the last step boundary,
	// by member, for the next world to keep (enter); nil after a failure.
	carried map[epoch.Member]transport.Link
	// moving is set from the step boundary where the links are handed
	// over until the next world is entered (guarded by mu), for Prepare.
	moving bool
	// handedOver, when set (by tests), runs in Commit after the links are
	// handed over and before the next world is entered: the window in which
	// a Prepare from the worker's epoch watcher must plan nothing.
	handedOver func()
}

// preconnect is a world's links connected in the background while the
// current one trains: those to the members that are not in the current
// world (the others' links are carried over at the step boundary), or all
// of them when the transport cannot connect a world in part. done closes
// once links or err is set.
type preconnect struct {
	number uint64
	cancel context.CancelFunc
	done   chan struct{}
	links  []transport.Link
	err    error
}

// discard abandons p: its connect is stopped and its links, if it got
// them, closed.
func (p *preconnect) discard() {
	p.cancel()
	go func() {
		<-p.done
		closeLinks(p.links)
	}()
}

func closeLinks(ls []transport.Link) {
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
}

// releaseCarried closes the links carried from the last world that no
// world took.
func (s *Session) releaseCarried() {
	for _, l := range s.carried {
		l.Close()
	}
	s.carried = nil
}

// takeCarried returns the carried links to ep's members, indexed by their
// rank in ep (nil when there are none), and closes the others.
func (s *Session) takeCarried(ep epoch.World) []transport.Link {
	if len(s.carried) == 0 {
		s.carried = nil
		return nil
	}
	kept := make([]transport.Link, len(ep.Members))
	for r, m := range ep.Members {
		if l, ok := s.carried[m]; ok {
			kept[r] = l
			delete(s.carried, m)
		}
	}
	s.releaseCarried()
	return kept
}

// Prepare starts connecting world ep, newer than the current one, in the
// background while this worker trains on: at the step boundary where the
// members move to it (Commit) its links are then ready, and only the state
// still has to agree. The membership layer calls it when an epoch is
// adopted; it returns at once. It does nothing for a world without this
// worker, before the session has entered its first world, or after Close;
// a newer ep replaces an older one being prepared.
func (s *Session) Prepare(ep epoch.World) {
	rank := ep.Rank(s.cfg.Self.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.comm == nil || s.closed || ep.Number <= s.epoch.Number || ep.Number <= s.enteringNumber || rank < 0 || s.moving {
		// (A world being left or entered (moving) is no base to plan from:
		// its communicator has handed its links over, which reads as a
		// failure and would dial all of ep, and s.epoch is the world being
		// left, not the one ep follows. ep is then connected at its own
		// step boundary, keeping what it can.)
		// (An epoch being entered already is connected by enter: a second
		// Connect of the same world on this transport would fail.)
		return
	}
	if s.next != nil {
		if s.next.number >= ep.Number {
			return
		}
		s.next.discard()
		s.next = nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &preconnect{number: ep.Number, cancel: cancel, done: make(chan struct{})}
	s.next = p
	// The links to members of the current world are carried over at the
	// step boundary; only the others are dialled now. A world that has
	// failed already carries nothing: all of ep is dialled.
	var want []bool
	if _, ok := s.t.(transport.PartialConnector); ok && s.comm.Err() == nil {
		want = make([]bool, len(ep.Members))
		for r, m := range ep.Members {
			want[r] = r != rank && !slices.Contains(s.epoch.Members, m)
		}
	}
	log := s.log
	go func() {
		defer close(p.done)
		defer cancel()
		began := time.Now()
		p.links, p.err = s.connectSome(ctx, ep, rank, want)
		log.Debug("connected the next world's new members ahead of the step boundary", "epoch", ep.Number, "took", time.Since(began), "err", p.err)
	}()
}

// connectSome connects this worker, rank, to the members r of world ep
// with want[r] set (all of them when want is nil), within
// Config.ConnectTimeout.
func (s *Session) connectSome(ctx context.Context, ep epoch.World, rank int, want []bool) ([]transport.Link, error) {
	w := transport.World{JobID: s.cfg.JobID, Epoch: ep.Number, Rank: rank, Addrs: ep.Addrs()}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if want == nil {
		return s.t.Connect(ctx, w)
	}
	return s.t.(transport.PartialConnector).ConnectSome(ctx, w, want)
}

// connect connects this worker, rank, to the members of world ep within
// Config.ConnectTimeout: it keeps the links carried over from the last
// world to ep's members (kept, by rank in ep; each re-keyed to ep inside
// its own stream), takes those connected ahead (fresh), and dials the rest.
// linked hears of each rank whose link is ready, as it is.
func (s *Session) connect(ctx context.Context, ep epoch.World, rank int, kept, fresh []transport.Link, linked func(rank int)) (*collective.Communicator, error) {
	w := transport.World{JobID: s.cfg.JobID, Epoch: ep.Number, Rank: rank, Addrs: ep.Addrs()}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	links, rekeyed, err := transport.CarryWatched(ctx, s.t, w, kept, fresh, s.log, linked)
	if err != nil {
		return nil, err
	}
	s.entering.rekeyed = rekeyed
	comm, err := collective.NewFromLinks(w, links, s.cfg.Collective)
	if err != nil {
		closeLinks(links)
		return nil, err
	}
	return comm, nil
}

// takeNext hands over the world being prepared if it is ep (nil otherwise;
// one for another epoch is discarded).
func (s *Session) takeNext(number uint64) *preconnect {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.next
	s.next = nil
	if p != nil && p.number != number {
		p.discard()
		return nil
	}
	return p
}

// openSession waits for the first epoch that includes cfg.Self, connects to
// its members and receives the current state from its rank 0 (the oldest
// member). It is the bottom of the ways into a job (StartWorker, and a world
// of one): a Session is what a Worker or JoinJob's Membership hands out.
func openSession(ctx context.Context, cfg Config, t transport.Transport, src epoch.Source, state *State) (*Session, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := state.check(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	s := &Session{cfg: cfg, t: t, src: src, state: state, fuser: fusion.NewFuser(cfg.FusionBytes), asyncFuser: fusion.NewFuser(cfg.FusionBytes), log: log.With("worker", cfg.Self.Name)}
	s.clock = stats.NewClock(cfg.StatsEvery, cfg.OnStats)
	if cfg.GradientNoise.Measure {
		if s.noise, err = newGradNoise(cfg.GradientNoise); err != nil {
			return nil, err
		}
		state.replaceBlob(noiseBlob, s.noise.marshal, s.noise.unmarshal)
	}
	s.obs = startObserver(cfg, cfg.Self.Name)
	if err := s.advance(ctx, 0); err != nil {
		s.obs.close()
		return nil, err
	}
	return s, nil
}

// Rank is this worker's rank in the current epoch.
func (s *Session) Rank() int { return s.comm.Rank() }

// Size is the number of workers in the current epoch.
func (s *Session) Size() int { return s.comm.Size() }

// World is the current world epoch.
func (s *Session) World() epoch.World { return s.epoch }

// Self is this worker as the worlds list it: its member name and collective
// address.
func (s *Session) Self() epoch.Member { return s.cfg.Self }

// Step is the number of committed steps, identical on every worker.
func (s *Session) Step() int64 { return s.state.Step }

// Communicator is the current epoch's communicator, for collectives beyond
// gradient averaging. It is replaced at epoch changes.
func (s *Session) Communicator() *collective.Communicator { return s.comm }

// RecordSamples adds n to the samples this worker processes in the current
// step. The autoscaling engine measures throughput in samples per second when
// trainers report them, in steps per second otherwise.
func (s *Session) RecordSamples(n int) { s.clock.AddSamples(n) }

// SetGlobalBatch tells the gradient noise measurement the current step's
// global batch, the samples of all workers together (Train does, each step).
// A step it is not told is not measured.
func (s *Session) SetGlobalBatch(n int) {
	if s.noise != nil {
		s.noise.setGlobalBatch(n)
	}
}

// RecordMicroBatch records one micro-batch's gradients for the gradient
// noise measurement when a step accumulates several: call it for each
// micro-batch, with that micro-batch's mean gradient (the loss averaged over
// its samples), before adding it into the accumulated gradient; then reduce
// the micro-batches' mean with Allreduce as usual. Without accumulation do
// not call it: the allreduce measures its own input. Tensors in device
// memory leave the step unmeasured. Without the measurement it does
// nothing.
func (s *Session) RecordMicroBatch(tensors ...collective.Buffer) error {
	if s.noise == nil {
		return nil
	}
	if err := fusion.Check(tensors); err != nil {
		return err
	}
	s.noise.recordMicroBatch(tensors)
	return nil
}

// GradientNoise returns the job's smoothed gradient statistics (the
// gradient's square and variance; see goodput.GradParams) after the last
// committed step; ok is false before the first estimate or without the
// measurement (Config.GradientNoise).
func (s *Session) GradientNoise() (grad goodput.GradParams, ok bool) {
	if s.noise == nil {
		return grad, false
	}
	s.noise.mu.Lock()
	defer s.noise.mu.Unlock()
	return s.noise.params()
}

// RecordLoss reports the trainer's training loss of the current step: the
// mean loss per sample over this worker's share of the step's batch, so that
// it compares across world sizes. It travels with the step statistics to the
// driver (`gorovod run` shows it in its progress records, metrics and run
// report); several calls in one step are averaged, and a loss that is not
// finite is left out.
func (s *Session) RecordLoss(mean float64) { s.clock.AddLoss(mean) }

// SetTotalSteps tells the autoscaling engine how many steps the job plans to
// train in all (policies weighing the remaining work need it).
func (s *Session) SetTotalSteps(n int64) { s.clock.SetTotal(n) }

// Reduction says how a gradient allreduce combines the workers' tensors. The
// zero value averages (Horovod's default).
type Reduction struct {
	// Op combines the workers' elements; zero means collective.Average.
	Op collective.ReduceOp
	// Prescale multiplies each worker's tensors before they are combined, and
	// Postscale the result (Horovod's prescale_factor and postscale_factor;
	// with Average the division by the world size comes on top). Zero means 1.
	Prescale, Postscale float64
}

// Sum returns the Reduction that adds the workers' tensors.
func Sum() Reduction { return Reduction{Op: collective.Sum} }

// check refuses an invalid reduction and returns it with the defaults filled
// in.
func (r Reduction) check() (Reduction, error) {
	if r.Op == 0 {
		r.Op = collective.Average
	}
	if !r.Op.Valid() {
		return r, fmt.Errorf("sync: invalid reduce op %v", r.Op)
	}
	for _, f := range []*float64{&r.Prescale, &r.Postscale} {
		switch {
		case *f == 0:
			*f = 1
		case math.IsNaN(*f) || math.IsInf(*f, 0):
			return r, fmt.Errorf("sync: scale factor %v is not finite", *f)
		}
	}
	return r, nil
}

// Allreduce reduces the gradient tensors in place across the current world:
// any dtype, host or device memory, fused into few collectives (see
// fusion.Fuser). Every worker must pass the same dtypes and sizes in the same
// order. If the world breaks meanwhile, the session rebuilds it,
// re-synchronizes the state from the new rank 0 and returns ErrWorldChanged.
// Malformed tensors (see fusion.Check) or an invalid reduction are refused
// with an error before anything is sent; the world is untouched.
func (s *Session) Allreduce(ctx context.Context, how Reduction, tensors ...collective.Buffer) error {
	how, err := how.check()
	if err != nil {
		return err
	}
	began := time.Now()
	defer s.clock.Wait(began)
	bytes := s.obs.gradients(tensors)
	newest := s.src.Latest()
	err = reduceGradients(ctx, s.fuser, s.comm, tensors, how, &newest, s.noise)
	if s.obs.tl != nil {
		s.obs.reduced("allreduce gradients", began, time.Now(), len(tensors), bytes, err)
	}
	if err == nil {
		s.clock.AddBytes(bytes)
		if len(tensors) > 0 {
			s.newest, s.tagged = max(s.newest, newest), true
		}
		return nil
	}
	return s.failed(ctx, s.comm, err)
}

// reduceGradients is the one place every gradient allreduce goes through, the
// synchronous one and AllreduceAsync's. Besides the gradients it carries the
// highest world epoch any member knows of (newest, in the frames' tags) and,
// when noise is measured, the gradient noise side-car (gns.go): each
// worker's squared norm before the reduction and rank 0's batch decision,
// in one of the gradients' own buckets — no extra collective.
func reduceGradients(ctx context.Context, f *fusion.Fuser, comm *collective.Communicator, tensors []collective.Buffer, how Reduction, newest *uint64, noise *gradNoise) error {
	opts := [3]collective.Option{collective.MaxTag(newest)} // on the stack: this runs every step
	n := 1
	if how.Prescale != 1 {
		opts[n], n = collective.Prescale(how.Prescale), n+1
	}
	if how.Postscale != 1 {
		opts[n], n = collective.Postscale(how.Postscale), n+1
	}
	if noise == nil {
		return f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...)
	}
	var x [numExtras]float64
	if !noise.before(tensors, how, comm.Rank(), comm.Size(), &x) {
		noise.uncarried(tensors)
		return f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...)
	}
	if comm.Size() == 1 {
		// Alone, the side-car would come back as it went (only scaled,
		// which after undoes): it stays here, and the gradients are reduced
		// in place instead of being packed into a bucket with it.
		if err := f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...); err != nil {
			return err
		}
		noise.afterAlone(tensors, &x)
		return nil
	}
	carried, err := f.AllreduceExtra(ctx, comm, tensors, x[:], how.Op, opts[:n]...)
	switch {
	case err != nil:
		return err
	case carried:
		noise.after(tensors, how, comm.Size(), &x)
	default:
		noise.uncarried(tensors)
	}
	return nil
}

// failed handles an error of a gradient allreduce on comm. An error that left
// the communicator working (the context ended before anything was sent, a
// device refused a copy before the collective) is returned as it is: the
// world is intact. Workers that called different collectives (a
// MismatchError) get that error: rebuilding the world cannot repair it, and
// the others see this worker leave. Any other failure broke the world: it is
// rebuilt and ErrWorldChanged returned.
func (s *Session) failed(ctx context.Context, comm *collective.Communicator, err error) error {
	if comm.Err() == nil {
		return err
	}
	s.tagged = false
	var mismatch *collective.MismatchError
	if errors.As(err, &mismatch) {
		return fmt.Errorf("sync: the workers' tensors differ: %w", err)
	}
	if ctx.Err() != nil {
		return err
	}
	if rerr := s.recover(ctx, err); rerr != nil {
		return rerr
	}
	return worldChanged(err)
}

// Handle is a gradient allreduce started with AllreduceAsync.
type Handle struct {
	done chan struct{}
	err  error
}

// AllreduceAsync starts reducing tensors in place and returns at once, so a
// trainer can hand over each layer's gradients as the backward pass produces
// them and overlap their communication with the rest of the computation.
// Allreduces run one at a time in the order they were started, on every rank
// in the same order. WaitAll collects them before the step is applied; until
// then the tensors' memory must not be touched. Malformed tensors and invalid
// reductions fail the handle before anything is sent; later handles still run.
func (s *Session) AllreduceAsync(ctx context.Context, how Reduction, tensors ...collective.Buffer) *Handle {
	p := &Handle{done: make(chan struct{})}
	how, err := how.check()
	if err != nil {
		p.err = err
		close(p.done)
		return p
	}
	prev := s.lastAsync
	s.lastAsync = p
	comm := s.comm
	bytes := s.obs.gradients(tensors)
	s.clock.AddBytes(bytes) // a failure restarts the step's account
	tl, queued := s.obs.tl, time.Time{}
	if tl != nil {
		queued = time.Now()
	}
	go func() {
		defer close(p.done)
		if prev != nil {
			<-prev.done
			if prev.err != nil && comm.Err() != nil {
				p.err = prev.err // a spent world: the later ones cannot run either
				return
			}
		}
		newest := s.src.Latest()
		var began time.Time
		if tl != nil {
			began = time.Now()
			tl.Complete(timeline.TrackTraining, "queued", "gradients", queued, began, timeline.Int("tensors", int64(len(tensors))))
		}
		p.err = reduceGradients(ctx, s.asyncFuser, comm, tensors, how, &newest, s.noise)
		if tl != nil {
			s.obs.reduced("allreduce gradients (async)", began, time.Now(), len(tensors), bytes, p.err)
		}
		if p.err == nil && len(tensors) > 0 {
			s.mu.Lock()
			s.asyncNewest = max(s.asyncNewest, newest)
			s.asyncTagged = true
			s.mu.Unlock()
		}
	}()
	return p
}

// WaitAll waits for allreduces started with AllreduceAsync. If any failed
// because the world broke, the session rebuilds the world as Allreduce does
// and returns ErrWorldChanged: recompute the step. A handle refused for bad
// input returns that error, the world untouched.
func (s *Session) WaitAll(ctx context.Context, pending ...*Handle) error {
	defer s.clock.Wait(time.Now())
	var failed error
	for _, p := range pending {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.err != nil && failed == nil {
			failed = p.err
		}
	}
	if s.lastAsync != nil && pendingIn(s.lastAsync, pending) {
		s.lastAsync = nil
	}
	if failed == nil {
		s.mu.Lock()
		if s.asyncTagged {
			s.newest, s.tagged = max(s.newest, s.asyncNewest), true
		}
		s.asyncNewest, s.asyncTagged = 0, false
		s.mu.Unlock()
		return nil
	}
	return s.failed(ctx, s.comm, failed)
}

func pendingIn(p *Handle, list []*Handle) bool {
	for _, q := range list {
		if q == p {
			return true
		}
	}
	return false
}

// Commit ends a step on this worker: it counts the step and, if a newer epoch
// has been agreed, moves every member to it at this same boundary (all members
// learn of it from one tiny allreduce, so none finishes a step in another
// world). A failure found here is repaired before Commit returns
// ErrWorldChanged: the state is then whatever the new rank 0 held, this step
// committed or not, and the trainer carries on from it.
//
// Moving to the next world also returns ErrWorldChanged when its rank 0 had
// not committed this step: an allreduce can complete on some ranks while it
// fails on others (a peer dies after sending its last chunk to some but not
// all), so the next world's rank 0 may be a step behind. The state is then
// rolled back to rank 0's, and the step was not committed after all.
func (s *Session) Commit(ctx context.Context) error {
	began := time.Now()
	s.state.Step++
	committed := s.state.Step
	if s.noise != nil {
		elapsed, waited := s.clock.Lap(began)
		accum, grad := s.noise.commit(s.Rank(), s.Size(), elapsed, waited)
		s.clock.SetGrad(accum, grad.Sqr, grad.Var)
	}
	newest := s.newest
	if !s.tagged {
		// No gradient allreduce carried the news this step: ask explicitly.
		newest = s.src.Latest()
		var none []float32
		if err := collective.Allreduce(ctx, s.comm, none, none, collective.Max, collective.MaxTag(&newest)); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if rerr := s.recover(ctx, err); rerr != nil {
				return rerr
			}
			return worldChanged(err)
		}
	}
	s.newest, s.tagged = 0, false
	s.clock.Wait(began)
	s.clock.Commit(s.epoch.Number, s.state.Step, newest > s.epoch.Number)
	if s.obs.tl != nil {
		s.obs.committed(s.state.Step, s.epoch.Number, time.Now())
	}
	if newest <= s.epoch.Number {
		return nil
	}
	// The links to members that stay are carried into the next world.
	left := s.epoch
	s.mu.Lock()
	s.moving = true
	links := s.comm.Release(func(int) bool { return true })
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.moving = false
		s.mu.Unlock()
	}()
	if s.handedOver != nil {
		s.handedOver()
	}
	if links != nil {
		s.carried = make(map[epoch.Member]transport.Link, len(links))
		for r, l := range links {
			if l != nil {
				s.carried[left.Members[r]] = l
			}
		}
	}
	err := s.advance(ctx, s.epoch.Number)
	s.releaseCarried()
	if err != nil {
		return err
	}
	if s.state.Step != committed {
		s.log.Info("the next world's rank 0 had not committed this step: rolled back", "step", committed, "now", s.state.Step)
		return ErrWorldChanged
	}
	return nil
}

// Close leaves the current world's communicator and frees the device fusion
// buffers. Leaving the job for good is the membership layer's business (a
// graceful leave starts the next epoch).
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.next != nil {
		s.next.discard()
		s.next = nil
	}
	s.mu.Unlock()
	s.obs.close()
	var err error
	if s.comm != nil {
		err = s.comm.Close()
	}
	if s.lastAsync != nil {
		<-s.lastAsync.done // the async fuser is in use until then
	}
	return errors.Join(err, s.fuser.Close(), s.asyncFuser.Close())
}

// AbortIfMember stops the collective in progress if name is a member of the
// current world: the membership layer calls it when gossip declares a worker
// dead, which on a frozen worker comes sooner than the collective's I/O
// timeout. The collective then fails and the session recovers as usual.
func (s *Session) AbortIfMember(name string, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.comm != nil && s.epoch.Rank(name) >= 0 {
		s.comm.Abort(cause)
	}
}

// recover handles a collective failure: report it, drop the broken world and
// join the next one.
func (s *Session) recover(ctx context.Context, cause error) error {
	blamed := epoch.Member{}
	var pe *collective.PeerError
	if errors.As(cause, &pe) && pe.Rank >= 0 && pe.Rank < len(s.epoch.Members) {
		blamed = s.epoch.Members[pe.Rank]
	}
	s.log.Warn("collective failed; waiting for the next world", "epoch", s.epoch.Number, "blamed", blamed.Name, "err", cause)
	s.src.ReportFailure(s.epoch.Number, blamed, cause)
	s.comm.Abort(cause)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RecoveryTimeout)
	defer cancel()
	start, failed := time.Now(), s.epoch.Number
	if err := s.advance(ctx, s.epoch.Number); err != nil {
		return fmt.Errorf("sync: recovering from %v: %w", cause, err)
	}
	s.obs.recovered(failed, blamed.Name, cause, start, time.Now())
	return nil
}

// enter connects epoch ep's world and receives the state from its rank 0. A
// newer epoch abandons the attempt: a member of ep that died after ep was
// proposed would otherwise keep the others dialling it until the recovery
// timeout, while the proposer has already replaced ep.
func (s *Session) enter(ctx context.Context, ep epoch.World, rank int) (*collective.Communicator, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if _, err := s.src.Await(ctx, ep.Number); err == nil {
			cancel(errSuperseded)
		}
	}()
	superseded := func(err error) error {
		if context.Cause(ctx) == errSuperseded {
			return fmt.Errorf("%w: %w", errSuperseded, err)
		}
		return err
	}
	began := time.Now()
	stopWatch := func() {}
	linked := make([]atomic.Bool, len(ep.Members)) // by rank: the link is ready
	if r, ok := s.src.(memberReacher); ok {
		// A member that died after the world was proposed keeps the others
		// dialling it; when connecting takes a while, look for one among
		// the members not linked yet (the others have shown they are there).
		watch := time.AfterFunc(reachAfter, func() {
			waiting := epoch.World{Number: ep.Number}
			for i, m := range ep.Members {
				if i != rank && !linked[i].Load() {
					waiting.Members = append(waiting.Members, m)
				}
			}
			if len(waiting.Members) > 0 {
				r.reachMembers(ctx, waiting)
			}
		})
		stopWatch = func() { watch.Stop() }
		defer stopWatch()
	}
	s.mu.Lock()
	s.enteringNumber = ep.Number
	s.mu.Unlock()
	kept := s.takeCarried(ep)
	var fresh []transport.Link
	var err error
	if p := s.takeNext(ep.Number); p != nil {
		// Connected (or being connected) since the epoch was adopted.
		select {
		case <-p.done:
			fresh, err = p.links, p.err
		case <-ctx.Done():
			p.discard()
			err = context.Cause(ctx)
		}
	}
	var comm *collective.Communicator
	if err == nil {
		comm, err = s.connect(ctx, ep, rank, kept, fresh, func(r int) { linked[r].Store(true) })
	} else {
		closeLinks(kept)
	}
	if err != nil {
		return nil, superseded(err)
	}
	// Connected: nobody is dialled any more, and a member that dies now
	// fails the state agreement on its link. Looking for gone members
	// would only load the machine at the moment every member of the world
	// is busy entering it (one connection to each member's gossip port).
	stopWatch()
	start := time.Now()
	s.entering.connect = start.Sub(began)
	root, read, holders, same, err := s.stateRoot(ctx, comm)
	if err == nil && !same {
		err = s.state.broadcast(ctx, comm, root, read, holders)
	}
	s.obs.broadcast(ep.Number, start, time.Now(), err)
	s.entering.state = time.Since(start)
	if err != nil {
		comm.Abort(err)
		return nil, superseded(err)
	}
	s.synced = true
	return comm, nil
}

// reachAfter is how long connecting a world may take before the session
// looks for members that are gone (memberReacher); once connected, it
// does not look.
const reachAfter = 50 * time.Millisecond

// memberReacher is a Source that can look whether the members of a world
// still listen and report, as a failure of that world, one whose process
// is gone: a host that dies takes all its workers with it while a failed
// collective blames only one, and the next world's connect would otherwise
// dial the others until gossip declares them dead (most of a second).
type memberReacher interface {
	reachMembers(ctx context.Context, ep epoch.World)
}

// stateRoot agrees on the member whose state the world takes, and on the
// members that hold it already, in one small gather of every member's
// [holds the job's state, digest readable, digest] (an allreduce by
// recursive doubling, or an allgather where the Config forces another
// algorithm).
//
// The root is rank 0 (the oldest survivor), unless it never received the
// job's state — a joiner whose admission failed, left ahead of the members
// that trained when they were all declared dead and came back after it —
// while another member did. Then the lowest rank that holds the state is
// the root: a world must never take a fresh worker's initial state over
// the job's.
//
// holders are the root and the members whose digest (State.digest: step,
// registrations, every byte) equals the root's: they hold its state
// already, byte for byte, and can feed the others (State.broadcast). A
// member that cannot take a digest (state in device memory) is not one.
// same reports that every member is a holder: no transfer is needed (a
// world that only lost members, at a step boundary). read is this
// worker's blobs as the digest read them, for a broadcast that follows.
func (s *Session) stateRoot(ctx context.Context, comm *collective.Communicator) (root int, read [][]byte, holders []int, same bool, err error) {
	const fields = 4 // holds the state, digest readable, digest's two halves
	p := comm.Size()
	mine := make([]int64, fields)
	if s.synced {
		mine[0] = 1
		if p > 1 {
			sum, blobs, ok, err := s.state.digest()
			if err != nil {
				return 0, nil, nil, false, err
			}
			if ok {
				read = blobs
				mine[1], mine[2], mine[3] = 1, int64(sum&0xffffffff), int64(sum>>32)
			}
		}
	}
	all := make([]int64, fields*p)
	if comm.AllreduceAlgorithm(collective.Int64, len(all)) == string(collective.AlgorithmRecursiveDoubling) {
		// The same gather as one small allreduce: each rank fills its own
		// slot of all and the sum fills the others. Recursive doubling
		// takes log2 p rounds where the allgather's ring takes p-1 steps,
		// one after the other, each waiting for the next process to run;
		// at 16 ranks on a busy machine that chain was most of the
		// agreement's time. Every rank has the same collective Config,
		// so every rank chooses alike.
		copy(all[fields*comm.Rank():], mine)
		if err := collective.Allreduce(ctx, comm, all, all, collective.Sum); err != nil {
			return 0, nil, nil, false, err
		}
	} else if err := collective.Allgather(ctx, comm, mine, all); err != nil {
		return 0, nil, nil, false, err
	}
	root = -1
	for r := range p {
		if all[fields*r] == 1 {
			root = r
			break
		}
	}
	if root < 0 {
		return 0, nil, nil, false, nil // a new job: nobody holds a state yet
	}
	if root != 0 {
		s.log.Warn("rank 0 of the new world never received the job's state: taking it from another member", "rank", root)
	}
	ref := all[fields*root : fields*root+fields]
	for r := range p {
		got := all[fields*r : fields*r+fields]
		if r == root || (ref[1] == 1 && got[0] == 1 && got[1] == 1 && got[2] == ref[2] && got[3] == ref[3]) {
			holders = append(holders, r)
		}
	}
	return root, read, holders, len(holders) == p, nil
}

// errSuperseded marks an attempt to enter a world abandoned because a newer
// one was proposed meanwhile (workers that join together make a few worlds
// in quick succession): no failure.
var errSuperseded = errors.New("a newer world was proposed")

// advance moves to the newest epoch after the given one: connect its members,
// then copy the state from its rank 0. A failure on the way moves on to the
// epoch after that.
func (s *Session) advance(ctx context.Context, after uint64) error {
	for {
		ep, err := s.src.Await(ctx, after)
		if err != nil {
			return err
		}
		rank := ep.Rank(s.cfg.Self.Name)
		if rank < 0 {
			if s.comm == nil {
				// Not admitted yet: a joiner waits for an epoch with it.
				after = ep.Number
				continue
			}
			return fmt.Errorf("%w (%v)", ErrExcluded, ep)
		}
		start := time.Now()
		comm, err := s.enter(ctx, ep, rank)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrStateMismatch) {
				// This worker's state cannot join rank 0's: a retry would fail alike.
				return err
			}
			level := slog.LevelWarn
			if errors.Is(err, errSuperseded) {
				level = slog.LevelInfo // not a failure: a newer world came (workers joining together)
			}
			s.log.Log(ctx, level, "entering the next world failed", "epoch", ep.Number, "err", err)
			var pe *collective.PeerError
			blamed := epoch.Member{}
			if errors.As(err, &pe) && pe.Rank >= 0 && pe.Rank < len(ep.Members) {
				blamed = ep.Members[pe.Rank]
			}
			s.src.ReportFailure(ep.Number, blamed, err)
			after = ep.Number
			continue
		}
		s.mu.Lock()
		s.epoch, s.comm = ep, comm
		s.mu.Unlock()
		now := time.Now()
		s.clock.Entered(now, now.Sub(start))
		if s.noise != nil {
			s.noise.reset()
		}
		s.obs.entered(ep, rank, comm, start, now)
		s.log.Info("entered world", "epoch", ep.Number, "rank", rank, "size", len(ep.Members), "took", now.Sub(start),
			"connect", s.entering.connect, "state", s.entering.state, "links_kept", s.entering.rekeyed)
		return nil
	}
}
