package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	stdsync "sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/sync/sampler"
)

// StepFunc is the trainer's part of one training step: compute the
// gradients of s.Batch (or of whatever the step trains on), reduce them with
// s.Session.Allreduce (or AllreduceAsync and WaitAll, overlapping the
// backward pass), and apply the update.
//
// Return the error of the allreduce as it is: ErrWorldChanged makes the loop
// redo the step from the state the world now holds (the update must not have
// been applied), ErrExcluded ends this worker's training cleanly. Any other
// error ends Train with it. The loop commits the step when StepFunc returns
// nil.
type StepFunc func(ctx context.Context, s *TrainStep) error

// TrainStep is one training step as the loop hands it to the StepFunc, and
// then, once it committed, to TrainConfig.Committed.
type TrainStep struct {
	// Number is the step's number: the committed steps before it plus one.
	// A step that is redone keeps its number (the world may have rolled back
	// to an earlier one, which then runs again).
	Number int64
	// Attempt counts the runs of this step number that did not commit
	// before this one: 0 the first time.
	Attempt int
	// Rank and Size place this worker in the world the step runs in; World
	// is that world's epoch number.
	Rank, Size int
	World      uint64
	// Plan is what the batch policy decided for this step, the same on every
	// worker.
	Plan BatchPlan
	// Batch is this worker's share of the step's samples when the loop owns
	// a sampler (TrainConfig.Data): Batch.Indices to train on, Batch.Global
	// the samples of the whole world (fewer than Plan.Global at the end of a
	// data epoch), Batch.Epoch the data epoch. Zero without a sampler.
	Batch sampler.Batch
	// Session is the world's session: its Allreduce is the gradient
	// allreduce; its Communicator serves other collectives.
	Session *Session
}

// EpochEnd is the end of a data epoch of the loop's sampler, as
// TrainConfig.EpochEnd receives it.
type EpochEnd struct {
	Epoch   uint64 // the data epoch that ended, from 0
	Step    int64  // the steps committed so far
	Rank    int
	Size    int
	Session *Session
}

// BatchPlan is how one step trains. Every worker must get the same plan for
// the same step.
type BatchPlan struct {
	// Global is the step's batch size summed over all workers.
	Global int
	// MicroBatch and Accum say how a worker trains its share when it
	// accumulates gradients: Accum+1 micro-batches of about MicroBatch
	// samples each (TrainStep.MicroBatches splits them), recorded with
	// Session.RecordMicroBatch. Accum 0: one micro-batch, the whole share
	// (MicroBatch is then informative, or 0).
	MicroBatch, Accum int
	// LRFactor multiplies the learning rate tuned for the initial batch
	// size (the adaptive policy's learning-rate rule); 0 means 1. Use
	// LRScale.
	LRFactor float64
}

// LRScale is the factor to multiply the learning rate by: LRFactor, or 1
// when the policy does not scale it.
func (p BatchPlan) LRScale() float64 {
	if p.LRFactor == 0 {
		return 1
	}
	return p.LRFactor
}

// Progress is where training stands when the loop asks its BatchPolicy for
// the next step's plan.
type Progress struct {
	Step      int64  // steps committed
	Size      int    // workers in the current world
	DataEpoch uint64 // the sampler's data epoch (0 without one)
}

// BatchPolicy decides each step's batch plan; the loop asks it before every
// step, so a policy may change the global batch size as training goes (an
// adaptive batch size). Its answer must be the same on every worker at the
// same step: base it on what all of them share (the Progress, decisions every
// worker receives) and nothing local.
type BatchPolicy interface {
	PlanBatch(Progress) BatchPlan
}

// FixedBatch is the policy of a global batch size that never changes (the
// default: TrainConfig.GlobalBatch).
type FixedBatch int

// PlanBatch returns the fixed size.
func (b FixedBatch) PlanBatch(Progress) BatchPlan { return BatchPlan{Global: int(b)} }

// MicroBatches splits this worker's Batch.Indices into the plan's Accum+1
// micro-batches, in order, as evenly as sampler.Split divides (the last step
// of a data epoch may leave some empty). Without a sampler it returns nil.
func (s *TrainStep) MicroBatches() [][]int {
	if s.Batch.Indices == nil {
		return nil
	}
	n := s.Plan.Accum + 1
	out := make([][]int, n)
	for i := range n {
		off, l := sampler.Split(len(s.Batch.Indices), i, n)
		out[i] = s.Batch.Indices[off : off+l : off+l]
	}
	return out
}

// TrainConfig configures Train. A zero field means its default; Steps or
// Epochs must be set.
type TrainConfig struct {
	// Steps ends training once this many steps have committed (the state's
	// Step; 0: no step limit).
	Steps int64
	// Data, if set, is the elastic sampler the loop draws each step's batch
	// from: it registers the sampler's position in the state (blob
	// "sync.sampler"), asks it for this worker's share of every step,
	// advances it when a step commits and moves to the next data epoch when
	// one ends, so that however the world changes every sample of a data
	// epoch is trained on once.
	Data *sampler.Sampler
	// Epochs ends training after this many data epochs of Data (0: no
	// epoch limit).
	Epochs uint64
	// GlobalBatch is each step's batch size over all workers; BatchPolicy,
	// if set, decides it instead, step by step. Data needs one of them.
	GlobalBatch int
	BatchPolicy BatchPolicy
	// NoGradientNoise turns off the gradient noise measurement the loop
	// otherwise runs in the gradient allreduce (Config.GradientNoise, for the
	// goodput heuristic and the adaptive batch size, which needs it; about a
	// percent of a step). Every worker of a job must set it alike.
	NoGradientNoise bool
	// Committed, if set, is called after every step that committed, with
	// the step as it ran (its rank, size and world), for logging and
	// checkpoints. It is also called for the step at whose end this worker
	// leaves the job.
	Committed func(ctx context.Context, s *TrainStep) error
	// EpochEnd, if set, is called when a data epoch of Data is over, before
	// the next begins: on rank 0 only (an evaluation reported once), or on
	// every worker with EpochEndOnAllRanks (to evaluate in parallel with the
	// session's collectives).
	EpochEnd           func(ctx context.Context, e EpochEnd) error
	EpochEndOnAllRanks bool
	// Final, if set, writes the job's result (a last evaluation, the
	// model): once training is over it runs on the last world's rank 0,
	// and every member then waits at a barrier before it reports the end.
	// A rank 0 that dies before the barrier (kill -9 just after the last
	// step) breaks it: the world is formed again without it, and the new
	// rank 0 runs Final. So the result is written at least once by a
	// process that finished, twice only when a rank 0 died after writing
	// it; each process runs Final at most once. Without Final, rank 0
	// writes the result after Train returns (TrainResult.Rank), and a
	// rank 0 that dies first takes it along. Keep it short: the others
	// wait for it.
	Final func(ctx context.Context, r TrainResult) error
	// LeaveSignal makes this worker leave the job gracefully: it keeps
	// training until the others have moved to a world without it, and Train
	// returns with Outcome Left. Default SIGTERM (what `gorovod run` and
	// cluster schedulers send); NoLeaveSignal turns it off.
	LeaveSignal   os.Signal
	NoLeaveSignal bool
	// LeaveNotice is how long this worker has from its leave signal until
	// it must be gone (the SIGKILL a cluster sends after its SIGTERM). If
	// the others have not moved on without it by then (all were told to
	// leave at once, or the world is at its minimum), it leaves anyway at a
	// step boundary, its last step committed (notice.go). Default: the
	// launcher's (GOROVOD_LEAVE_NOTICE), else DefaultLeaveNotice (25 s).
	LeaveNotice time.Duration
	// Worker is how this process joins the job. With Worker.JobID set it
	// joins that job; otherwise, when the launcher started it (UnderLauncher),
	// the job, secret, seeds, launch name and addresses (the transport's
	// listen address, the gossip bind address) come from the environment
	// (WorkerConfigFromEnv), Worker.MinWorkers and Worker.FirstWorld are
	// raised to the job's minimum (GOROVOD_MIN_WORKERS) and its first
	// workers (GOROVOD_NP) if lower, Worker.ProbeTimeout is the driver's
	// (GOROVOD_PROBE_TIMEOUT) unless set, and the rest of Worker applies; otherwise it
	// trains alone, in a world of one, through the same session (Worker.Session
	// applies).
	Worker WorkerConfig
}

// DefaultTrainConfig returns the defaults; set Steps or Data and Epochs.
func DefaultTrainConfig() TrainConfig {
	return TrainConfig{LeaveSignal: syscall.SIGTERM}
}

// TrainResult is how training ended for this worker.
type TrainResult struct {
	// Outcome is zero when Train returns an error.
	Outcome Outcome
	// Steps is the number of committed steps at the end (the state's Step).
	Steps int64
	// Rank, Size and World place the worker in the last world it was a
	// member of: for example, report the final result on rank 0 only.
	Rank, Size int
	World      uint64
	// Rejoined counts the times this worker was left out of a world while it
	// was unreachable (paused, cut off) and came back as a new member.
	Rejoined int
}

// Outcome says why Train returned without an error.
type Outcome uint8

const (
	// Completed: Steps or Epochs were reached; the job was told training is
	// over (Worker.Finish).
	Completed Outcome = iota + 1
	// Left: this worker left gracefully on its leave signal.
	Left
	// Excluded: the job went on without this worker for good: the driver
	// removed it (a scale-down), or training was over when it came back. (A
	// worker left out because it was unreachable rejoins as a new member and
	// trains on.)
	Excluded
)

func (o Outcome) String() string {
	switch o {
	case Completed:
		return "completed"
	case Left:
		return "left"
	case Excluded:
		return "excluded"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// samplerBlob is the state name under which the loop registers its sampler.
const samplerBlob = "sync.sampler"

// Train runs the training loop, and is the entry into a job for trainers
// (JoinJob and StartWorker are its join without the loop, for bindings and
// loops of their own): it joins the job (or trains alone in a world of one
// when not started by a launcher), then runs step after step until
// cfg.Steps steps have committed or cfg.Epochs data epochs are over, and
// reports the end to the job. It owns what every elastic trainer needs:
//
//   - a step whose world changed is redone from the state the world holds
//     then (ErrWorldChanged); a step counts only once it committed;
//   - the leave signal (SIGTERM by default) leaves the job gracefully;
//   - a worker the job goes on without ends cleanly (Outcome Excluded);
//   - with cfg.Data it owns the sampler: each step's batch, advancing it,
//     data epochs and their end (cfg.EpochEnd);
//   - the global batch size comes from a policy each step (cfg.BatchPolicy);
//   - the samples and the planned length go to the autoscaling engine.
//
// state holds what a joining worker must receive; register everything in it
// before calling Train. It returns an error when training could not go on
// (the context ended, the step failed, the job could not be joined).
func Train(ctx context.Context, cfg TrainConfig, state *State, step StepFunc) (TrainResult, error) {
	cfg, err := cfg.prepare(state, step)
	if err != nil {
		return TrainResult{}, err
	}
	leave := make(chan os.Signal, 1)
	if !cfg.NoLeaveSignal {
		signal.Notify(leave, cfg.LeaveSignal)
		defer signal.Stop(leave)
	}
	// A leave signal while waiting to be admitted ends the wait.
	jctx, cancel := context.WithCancel(ctx)
	watched := make(chan bool, 1)
	go func() {
		select {
		case <-leave:
			cancel()
			watched <- true
		case <-jctx.Done():
			watched <- false
		}
	}()
	m, err := join(jctx, cfg.Worker, state)
	cancel()
	if <-watched {
		if m != nil {
			_ = m.close()
		}
		return TrainResult{Outcome: Left, Steps: state.Step}, nil
	}
	if errors.Is(err, ErrOutForGood) {
		// Training was over before this worker was admitted.
		cfg.Worker.Logger.Info("the job will not admit this worker: training is over")
		return TrainResult{Outcome: Excluded, Steps: state.Step}, nil
	}
	if err != nil {
		return TrainResult{}, err
	}
	return runLoop(ctx, cfg, m, leave, step)
}

// prepare checks the configuration, fills in the defaults and registers the
// sampler's position in the state.
func (c TrainConfig) prepare(state *State, step StepFunc) (TrainConfig, error) {
	switch {
	case state == nil || step == nil:
		return c, fmt.Errorf("%w: Train needs a state and a step function", ErrInvalidConfig)
	case c.Steps < 0:
		return c, fmt.Errorf("%w: TrainConfig.Steps %d < 0", ErrInvalidConfig, c.Steps)
	case c.Epochs > 0 && c.Data == nil:
		return c, fmt.Errorf("%w: TrainConfig.Epochs counts the data epochs of Data, which is not set", ErrInvalidConfig)
	case c.Steps == 0 && c.Epochs == 0:
		return c, fmt.Errorf("%w: TrainConfig needs Steps, or Data and Epochs, to know when training ends", ErrInvalidConfig)
	case c.GlobalBatch < 0:
		return c, fmt.Errorf("%w: TrainConfig.GlobalBatch %d < 0", ErrInvalidConfig, c.GlobalBatch)
	case c.GlobalBatch > 0 && c.BatchPolicy != nil:
		return c, fmt.Errorf("%w: TrainConfig sets both GlobalBatch and BatchPolicy", ErrInvalidConfig)
	case c.Data != nil && c.GlobalBatch == 0 && c.BatchPolicy == nil:
		return c, fmt.Errorf("%w: TrainConfig.Data needs GlobalBatch or BatchPolicy", ErrInvalidConfig)
	case c.NoLeaveSignal && c.LeaveSignal != nil:
		return c, fmt.Errorf("%w: TrainConfig sets both LeaveSignal and NoLeaveSignal", ErrInvalidConfig)
	}
	if c.BatchPolicy == nil {
		c.BatchPolicy = FixedBatch(c.GlobalBatch)
	}
	if c.LeaveSignal == nil {
		c.LeaveSignal = DefaultTrainConfig().LeaveSignal
	}
	var err error
	if c.LeaveNotice, err = leaveNoticeFrom(c); err != nil {
		return c, err
	}
	if c.Worker.Logger == nil {
		o, err := envconfig.LoadObservability(os.Getenv)
		if err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if c.Worker.Logger, err = envLogger(o); err != nil {
			return c, err
		}
	}
	if c.Worker.Logger == nil {
		c.Worker.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Data != nil {
		state.replaceBlob(samplerBlob, c.Data.MarshalBinary, c.Data.UnmarshalBinary)
	}
	if err := c.prepareNoise(state); err != nil {
		return c, err
	}
	return c, nil
}

// replaceBlob registers a blob, replacing one of the same name (a state
// trained by Train twice registers its sampler once).
func (s *State) replaceBlob(name string, get func() ([]byte, error), set func([]byte) error) {
	s.blobs = slices.DeleteFunc(s.blobs, func(b namedBlob) bool { return b.name == name })
	s.RegisterBlob(name, get, set)
}

// member is what the loop trains in: a job's Worker, or a world of one.
type member interface {
	session() *Session
	requestLeave(ctx context.Context) error
	// rejoin comes back as a new member after an exclusion (Worker.Rejoin).
	rejoin(ctx context.Context) error
	// outForGood says the job will not admit this worker again
	// (Worker.OutForGood): its exclusion is a removal, not a failure.
	outForGood() bool
	finish(ctx context.Context) error
	close() error
}

// join joins the job cfg names, the launcher's job, or a world of one.
func join(ctx context.Context, cfg WorkerConfig, state *State) (member, error) {
	if cfg.JobID == "" && UnderLauncher() {
		env, err := WorkerConfigFromEnv()
		if err != nil {
			return nil, err
		}
		cfg.JobID, cfg.Secret, cfg.Seeds, cfg.Launch = env.JobID, env.Secret, env.Seeds, env.Launch
		// The job's minimum is a floor: a trainer's own MinWorkers may only
		// raise it, or a worker that takes over proposing could train below
		// what the job was started with.
		cfg.MinWorkers = max(cfg.MinWorkers, env.MinWorkers)
		// Likewise the job's first workers, the voters of its first world.
		cfg.FirstWorld = max(cfg.FirstWorld, env.FirstWorld)
		// The driver's probe timeout, so that a worker that takes over
		// leaves a blamed worker out no sooner than the driver would.
		if cfg.ProbeTimeout == 0 {
			cfg.ProbeTimeout = env.ProbeTimeout
		}
		cfg.Transport.ListenAddr = env.Transport.ListenAddr
		if cfg.Session.RecoveryTimeout == 0 {
			cfg.Session.RecoveryTimeout = env.Session.RecoveryTimeout
		}
		m := &cfg.Membership
		m.BindAddr, m.BindPort, m.AdvertiseAddr, m.AdvertisePort = env.Membership.BindAddr, env.Membership.BindPort, env.Membership.AdvertiseAddr, env.Membership.AdvertisePort
		observeLikeEnv(&cfg, env)
		algorithmsLikeEnv(&cfg.Session.Collective, env.Session.Collective)
	}
	if cfg.JobID == "" {
		if err := aloneFromEnv(&cfg, os.Getenv); err != nil {
			return nil, err
		}
		return startAlone(ctx, cfg, state)
	}
	w, err := StartWorker(ctx, cfg, state)
	if err != nil {
		return nil, err
	}
	return jobMember{w}, nil
}

// jobMember is a Worker of an elastic job.
type jobMember struct{ w *Worker }

func (j jobMember) session() *Session                      { return j.w.Session }
func (j jobMember) requestLeave(ctx context.Context) error { return j.w.RequestLeave(ctx) }
func (j jobMember) rejoin(ctx context.Context) error       { return j.w.Rejoin(ctx) }
func (j jobMember) outForGood() bool                       { return j.w.OutForGood() }
func (j jobMember) finish(ctx context.Context) error       { return j.w.Finish(ctx) }
func (j jobMember) close() error                           { return j.w.Close() }

// runLoop trains in m until cfg says training is over, the worker leaves or
// is left out, or an error ends it; it finishes or closes m.
func runLoop(ctx context.Context, cfg TrainConfig, m member, leave <-chan os.Signal, step StepFunc) (res TrainResult, err error) {
	l := &trainLoop{ctx: ctx, cfg: cfg, m: m, sess: m.session(), log: cfg.Worker.Logger, step: step}
	defer func() { err = l.close(&res, err) }()
	setTotalSteps(cfg, l.sess)
	l.notice, l.stepCtx = watchLeave(ctx, cfg.LeaveNotice, leave)
	defer l.notice.stop()
	l.asked = make(chan struct{})
	go l.askToLeave()
	if err := attachPolicy(cfg, l.sess); err != nil {
		return res, err
	}
	// l.sess, not its value now: a rejoin replaces the session.
	defer func() { detachPolicy(cfg, l.sess) }()
	defer startPolicy(ctx, cfg)()
	for {
		f, err := l.attempt()
		if err != nil || f == finish {
			res.Outcome = l.outcome
			return res, err
		}
	}
}

// trainLoop is runLoop's state: the member it trains in (its session
// replaced on a rejoin), the leave notice, and how the loop stands.
type trainLoop struct {
	ctx     context.Context
	stepCtx context.Context // ctx, or ended when the leave notice runs out
	cfg     TrainConfig
	m       member
	sess    *Session
	log     *slog.Logger
	step    StepFunc
	notice  *leaveNotice

	leaving bool          // the worker asked to leave (the leave signal)
	asked   chan struct{} // closed once askToLeave has asked (askErr its answer)
	askErr  error

	// mmu serializes askToLeave's request with the loop's changes to the
	// member (a rejoin replaces its incarnation; finish and close end it).
	mmu      stdsync.Mutex
	ended    bool      // under mmu: the member was finished or closed
	rejoined int       // times it came back as a new member
	last     TrainStep // the previous attempt, to count attempts at a step
	finalRan bool      // this process ran cfg.Final
	outcome  Outcome   // how training ended, once an attempt says finish
}

// flow is what the loop does after one of its steps.
type flow int

const (
	proceed flow = iota // on to the attempt's next step
	again               // to the next attempt: the step is redone, or a new data epoch or member begins
	finish              // training ends here, with trainLoop.outcome
)

// attempt is one attempt at a step: it checks whether training is over and
// heeds the leave signal, plans the step and takes its batch, runs the step
// function, advances the sampler and commits; then it reports the committed
// step and acts on an exclusion that came with the commit.
func (l *trainLoop) attempt() (flow, error) {
	if l.trainingOver() {
		if f, err := l.final(); f != proceed || err != nil {
			return f, err
		}
		l.outcome = Completed
		return finish, nil
	}
	if err := l.ctx.Err(); err != nil {
		return finish, err
	}
	if f, err := l.heedLeaveSignal(); f != proceed || err != nil {
		return f, err
	}
	began := time.Now()
	s := l.planStep()
	if f, err := l.takeBatch(&s); f != proceed || err != nil {
		return f, err
	}
	if f, err := l.runStep(&s); f != proceed || err != nil {
		return f, err
	}
	if l.cfg.Data != nil {
		if err := l.cfg.Data.Advance(s.Batch.Global); err != nil {
			return finish, err
		}
	}
	out, f, err := l.commit()
	if f != proceed || err != nil {
		return f, err
	}
	l.notice.stepTook(time.Since(began))
	s.Number = l.sess.Step()
	if l.cfg.Committed != nil {
		if err := l.cfg.Committed(l.ctx, &s); err != nil {
			return finish, err
		}
	}
	if out {
		if f, err := l.leftOut(s.Number); f != finish || err != nil {
			return f, err
		}
		l.log.Info("left out of the next world: training ends here", "step", s.Number, "outcome", l.outcome)
		return finish, nil
	}
	return again, nil
}

// final runs cfg.Final on the rank 0 of the world in which training is
// over (unless this process ran it already) and waits at a barrier for the
// other members: a world that breaks meanwhile is formed again and the
// attempt starts over (again), its new rank 0 running Final if it has not.
func (l *trainLoop) final() (flow, error) {
	if l.cfg.Final == nil {
		return proceed, nil
	}
	sess := l.sess
	if sess.Rank() == 0 && !l.finalRan {
		l.finalRan = true
		if err := l.cfg.Final(l.ctx, l.result(Completed)); err != nil {
			return finish, err
		}
	}
	switch err := sess.Barrier(l.stepCtx); {
	case err == nil:
		return proceed, nil
	case errors.Is(err, ErrWorldChanged):
		l.log.Info("the world changed before every member saw the job's result written: its new rank 0 writes it", "step", sess.Step())
		return again, nil
	case errors.Is(err, ErrExcluded):
		return l.leftOut(sess.Step())
	default:
		return finish, err
	}
}

// trainingOver says whether cfg.Steps steps have committed or cfg.Epochs
// data epochs are over.
func (l *trainLoop) trainingOver() bool {
	return l.cfg.Steps > 0 && l.sess.Step() >= l.cfg.Steps || l.cfg.Epochs > 0 && l.cfg.Data.Epoch() >= l.cfg.Epochs
}

// askToLeave asks the job to let the worker leave as soon as the leave
// signal comes, while the step in progress runs on: the proposer's next
// world without this worker is then under way before the step ends, not
// only once the loop reaches the top of the next one.
func (l *trainLoop) askToLeave() {
	select {
	case <-l.notice.leaveSignalled():
	case <-l.notice.done:
		return
	}
	l.log.Info("leave signal: leaving the job once the others have moved on", "notice", l.cfg.LeaveNotice)
	l.mmu.Lock()
	if !l.ended {
		l.askErr = l.m.requestLeave(l.ctx)
	}
	l.mmu.Unlock()
	close(l.asked)
}

// heedLeaveSignal notes that the worker is leaving once the leave signal
// came (askToLeave has asked the job), and ends training when the leave
// notice is over.
func (l *trainLoop) heedLeaveSignal() (flow, error) {
	select {
	case <-l.notice.leaveSignalled():
		if !l.leaving {
			l.leaving = true
			<-l.asked // asked at once by askToLeave: this waits for its answer only
			l.log.Info("leaving at a step boundary once the others have moved on", "step", l.sess.Step())
			if l.askErr != nil {
				return finish, fmt.Errorf("sync: asking to leave: %w", l.askErr)
			}
		}
		if l.notice.over() {
			l.log.Info("leave notice running out: leaving without the others' world", "step", l.sess.Step())
			l.outcome = Left
			return finish, nil
		}
	default:
	}
	return proceed, nil
}

// planStep describes the next step (counting the attempts at a step that is
// redone) and plans its global batch with cfg.BatchPolicy.
func (l *trainLoop) planStep() TrainStep {
	sess := l.sess
	s := TrainStep{Number: sess.Step() + 1, Rank: sess.Rank(), Size: sess.Size(), World: sess.World().Number, Session: sess}
	if s.Number == l.last.Number {
		s.Attempt = l.last.Attempt + 1
	}
	l.last = s
	var dataEpoch uint64
	if l.cfg.Data != nil {
		dataEpoch = l.cfg.Data.Epoch()
	}
	s.Plan = l.cfg.BatchPolicy.PlanBatch(Progress{Step: sess.Step(), Size: s.Size, DataEpoch: dataEpoch})
	sess.SetGlobalBatch(s.Plan.Global)
	return s
}

// takeBatch gives the step its share of the sampler's next batch (with
// cfg.Data); at the end of a data epoch it ends the epoch and the attempt.
func (l *trainLoop) takeBatch(s *TrainStep) (flow, error) {
	if l.cfg.Data == nil {
		return proceed, nil
	}
	b, err := l.cfg.Data.Batch(s.Rank, s.Size, s.Plan.Global)
	if err != nil {
		return finish, fmt.Errorf("sync: the batch of step %d (global batch %d): %w", s.Number, s.Plan.Global, err)
	}
	if b.Global == 0 {
		if err := endEpoch(l.ctx, l.cfg, l.sess); err != nil {
			return finish, err
		}
		return again, nil
	}
	s.Batch = b
	l.sess.RecordSamples(len(b.Indices))
	l.sess.SetGlobalBatch(b.Global)
	return proceed, nil
}

// runStep runs the step function: a step whose world changed is redone, an
// exclusion is answered by leftOut, and a leave notice that ran out during
// the step ends training with the last committed step.
func (l *trainLoop) runStep(s *TrainStep) (flow, error) {
	switch err := l.step(l.stepCtx, s); {
	case err != nil && l.notice.ranOut():
		l.log.Info("leave notice ran out during the step: leaving with the last committed step", "step", l.sess.Step())
		l.outcome = Left
		return finish, nil
	case errors.Is(err, ErrWorldChanged):
		l.log.Info("the world changed during the step: redoing it", "step", s.Number, "attempt", s.Attempt)
		return again, nil
	case errors.Is(err, ErrExcluded):
		return l.leftOut(l.sess.Step())
	case err != nil:
		return finish, err
	}
	return proceed, nil
}

// commit commits the step; out says it counted but the world goes on
// without this worker (ErrExcluded). A world that changed during the commit
// has the step redone from the state of the new world's rank 0.
func (l *trainLoop) commit() (out bool, f flow, err error) {
	err = l.sess.Commit(l.stepCtx)
	out = errors.Is(err, ErrExcluded)
	switch {
	case err != nil && !out && l.notice.ranOut():
		l.log.Info("leave notice ran out during the commit: leaving", "step", l.sess.Step())
		l.outcome = Left
		return out, finish, nil
	case errors.Is(err, ErrWorldChanged):
		return out, again, nil
	case err != nil && !out:
		return out, finish, err
	}
	return out, proceed, nil
}

// leftOut answers an exclusion at step: a worker that was leaving has left;
// any other rejoins as a new member (again), unless the job will not admit
// it again (Excluded).
func (l *trainLoop) leftOut(step int64) (flow, error) {
	select {
	case <-l.notice.leaveSignalled():
		// askToLeave may have asked before the loop came back to its top:
		// this is the exclusion it asked for, not one to come back from.
		l.leaving = true
	default:
	}
	back, err := l.comeBack(step)
	switch {
	case err != nil:
		return finish, err
	case back:
		return again, nil
	}
	l.outcome = excluded(l.leaving)
	return finish, nil
}

// comeBack is the loop's answer to an exclusion that was not asked for:
// rejoin as a new member, unless the job will not admit this worker again.
func (l *trainLoop) comeBack(step int64) (bool, error) {
	if l.leaving {
		return false, nil
	}
	if l.m.outForGood() {
		// Removed by the job (a scale-down): no failure to warn of, and
		// the worker logged its removal when it learned of it.
		return false, nil
	}
	l.log.Warn("left out of the world (declared failed while unreachable?): rejoining as a new member", "step", step, "epoch", l.sess.World().Number)
	l.mmu.Lock()
	err := l.m.rejoin(l.ctx)
	l.mmu.Unlock()
	switch {
	case errors.Is(err, ErrOutForGood):
		l.log.Info("the job will not admit this worker again: training ends here", "step", step)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sync: left out of the world at step %d, and could not come back: %w", step, err)
	}
	l.rejoined++
	l.sess = l.m.session()
	setTotalSteps(l.cfg, l.sess)
	if err := attachPolicy(l.cfg, l.sess); err != nil {
		return false, err
	}
	return true, nil
}

// result is the TrainResult of an end with outcome o, in the session the
// loop is in now.
func (l *trainLoop) result(o Outcome) TrainResult {
	sess := l.sess
	return TrainResult{Outcome: o, Steps: sess.Step(), Rank: sess.Rank(), Size: sess.Size(), World: sess.World().Number, Rejoined: l.rejoined}
}

// close fills in res from the session the loop ended in and ends the
// membership: a completed training reports its end to the job (even if ctx
// ends now), any other end closes the member.
func (l *trainLoop) close(res *TrainResult, err error) error {
	*res = l.result(res.Outcome)
	l.mmu.Lock()
	defer l.mmu.Unlock()
	l.ended = true
	if res.Outcome == Completed && err == nil {
		return l.m.finish(context.WithoutCancel(l.ctx))
	}
	_ = l.m.close()
	return err
}

func excluded(leaving bool) Outcome {
	if leaving {
		return Left
	}
	return Excluded
}

// endEpoch runs the EpochEnd callback where it is due and moves the sampler
// to the next data epoch.
func endEpoch(ctx context.Context, cfg TrainConfig, sess *Session) error {
	if cfg.EpochEnd != nil && (cfg.EpochEndOnAllRanks || sess.Rank() == 0) {
		e := EpochEnd{Epoch: cfg.Data.Epoch(), Step: sess.Step(), Rank: sess.Rank(), Size: sess.Size(), Session: sess}
		if err := cfg.EpochEnd(ctx, e); err != nil {
			return err
		}
	}
	cfg.Data.NextEpoch()
	return nil
}

// setTotalSteps tells the autoscaling engine the job's planned length when
// it is known: Steps, or the data epochs in steps of a fixed batch size.
func setTotalSteps(cfg TrainConfig, sess *Session) {
	fixed, ok := cfg.BatchPolicy.(FixedBatch)
	switch {
	case cfg.Steps > 0:
		sess.SetTotalSteps(cfg.Steps)
	case ok && fixed > 0 && cfg.Epochs > 0:
		n, b := int64(cfg.Data.Config().N), int64(fixed)
		perEpoch := (n + b - 1) / b
		if cfg.Data.Config().DropLast {
			perEpoch = n / b
		}
		sess.SetTotalSteps(int64(cfg.Epochs) * perEpoch)
	}
}
