// The Session: its Config, how one is opened, what it tells the trainer, and
// the step boundary (Commit) and Close. The gradient allreduces are in
// session_reduce.go, the move from one world to the next in session_worlds.go.

package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
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
	// JoinHold is how long at most the members of a world train on in it,
	// once a next world with new members (joiners) is known, while they
	// connect to those members ahead (Prepare): they move at the end of the
	// first step after one of them has its links to the joiners, or after
	// JoinHold, so the connect overlaps training instead of stalling it
	// at the step boundary. Default DefaultJoinHold; negative: no hold
	// (the members move at the first step boundary after one of them is
	// told of the next world, and the links still being connected are
	// waited for there).
	JoinHold time.Duration
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

// DefaultJoinHold is Config.JoinHold's default: well above a joiner's
// connect to 15 members on a loaded 2-core machine (docs/multihost.md,
// "Transition times": under 140 ms), and short enough that a joiner that
// cannot connect costs the job little more than it did without the hold.
const DefaultJoinHold = time.Second

// DefaultConfig returns the defaults; JobID and Self must still be set.
func DefaultConfig() Config {
	return Config{
		Collective:      collective.DefaultConfig(),
		FusionBytes:     fusion.DefaultBytes,
		RecoveryTimeout: 10 * time.Minute,
		ConnectTimeout:  transport.DefaultIOTimeout,
		JoinHold:        DefaultJoinHold,
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
	// A failed world's links to the members that survive it are salvaged
	// into the next world (recover, enter) rather than dialled again; the
	// session ends every communicator with Salvage, Abort, Release or
	// Close, as the setting asks.
	c.Collective.KeepLinksOnFailure = true
	if c.FusionBytes == 0 {
		c.FusionBytes = d.FusionBytes
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.RecoveryTimeout == 0 {
		c.RecoveryTimeout = d.RecoveryTimeout
	}
	if c.JoinHold == 0 {
		c.JoinHold = d.JoinHold
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
	// carriedAt is when this step's gradient allreduce brought a newer
	// epoch (zero when none did), for the step boundary's debug line.
	carriedAt time.Time

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
		stateBytes     int64 // the tensors' bytes that moved (State.broadcast)
		rekeyed        int   // links carried over from the last world
	}
	// next is the next world's links being connected ahead of the
	// step boundary (Prepare); guarded by mu.
	next *preconnect
	// hold is the move to a world with joiners held back while they are
	// connected ahead (tagEpoch); guarded by mu.
	hold joinHold
	// enteringNumber is the epoch enter is connecting (guarded by mu), for
	// Prepare, which leaves it alone.
	enteringNumber uint64
	// carried is the links of the world left at the last step boundary,
	// by member, for the next world to keep (enter); after a failure,
	// enter fills it from salvaged (takeSalvaged).
	carried map[epoch.Member]transport.Link
	// salvaged is the links of the world that failed last, still being
	// read up to their peers' abort frames (collective.Salvage), and that
	// world; the next world's enter takes those to its members (guarded
	// by mu).
	salvaged     *collective.Salvaged
	salvagedFrom epoch.World
	// moving is set from the step boundary where the links are handed
	// over until the next world is entered (guarded by mu), for Prepare.
	moving bool
	// handedOver, when set (by tests), runs in Commit after the links are
	// handed over and before the next world is entered: the window in which
	// a Prepare from the worker's epoch watcher must plan nothing.
	handedOver func()
}

// openSession waits for the first epoch that includes cfg.Self, connects to
// its members and receives the current state from its rank 0 (the oldest
// member). It is the bottom of the ways into a job (StartWorker, and a world
// of one): a Session is what a Worker or JoinJob's JobMember hands out.
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

// currentWorld is World for the goroutines other than the training one
// (the membership layer's, a binding's).
func (s *Session) currentWorld() epoch.World {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

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
		newest = s.tagEpoch()
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
	carriedAt := s.carriedAt
	s.carriedAt = time.Time{}
	s.clock.Wait(began)
	s.clock.Commit(s.epoch.Number, s.state.Step, newest > s.epoch.Number)
	if s.obs.tl != nil {
		s.obs.committed(s.state.Step, s.epoch.Number, time.Now())
	}
	if newest <= s.epoch.Number {
		return nil
	}
	// known < newest: this member has the next world's number from the
	// allreduce's tag only, and waits for its content (advance).
	attrs := []any{"step", committed, "epoch", s.epoch.Number, "newest", newest, "known", s.src.Latest()}
	if !carriedAt.IsZero() {
		attrs = append(attrs, "since_allreduce", time.Since(carriedAt))
	}
	s.log.Debug("step boundary: moving to a newer world", attrs...)
	return s.moveToNext(ctx, committed)
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
	s.mu.Lock()
	s.salvaged.Close()
	s.salvaged = nil
	s.mu.Unlock()
	if s.lastAsync != nil {
		<-s.lastAsync.done // the async fuser is in use until then
	}
	return errors.Join(err, s.fuser.Close(), s.asyncFuser.Close())
}
