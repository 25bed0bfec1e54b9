package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
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
	// (WorkerConfigFromEnv), Worker.MinWorkers is raised to the job's minimum
	// (GOROVOD_MIN_WORKERS) if lower, and the rest of Worker applies; otherwise it
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

// Train runs the training loop: it joins the job (or trains alone in a world
// of one when not started by a launcher), then runs step after step until
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
func (j jobMember) finish(ctx context.Context) error       { return j.w.Finish(ctx) }
func (j jobMember) close() error                           { return j.w.Close() }

// runLoop trains in m until cfg says training is over, the worker leaves or
// is left out, or an error ends it; it finishes or closes m.
func runLoop(ctx context.Context, cfg TrainConfig, m member, leave <-chan os.Signal, step StepFunc) (res TrainResult, err error) {
	sess := m.session()
	log := cfg.Worker.Logger
	leaving := false
	rejoined := 0
	end := func(o Outcome) {
		res = TrainResult{Outcome: o, Steps: sess.Step(), Rank: sess.Rank(), Size: sess.Size(), World: sess.World().Number, Rejoined: rejoined}
	}
	// comeBack is the loop's answer to an exclusion that was not asked for:
	// rejoin as a new member, unless the job will not admit this worker
	// again.
	comeBack := func(step int64) (bool, error) {
		if leaving {
			return false, nil
		}
		log.Warn("left out of the world (declared failed while unreachable?): rejoining as a new member", "step", step, "epoch", sess.World().Number)
		switch err := m.rejoin(ctx); {
		case errors.Is(err, ErrOutForGood):
			log.Info("the job will not admit this worker again: training ends here", "step", step)
			return false, nil
		case err != nil:
			return false, fmt.Errorf("sync: left out of the world at step %d, and could not come back: %w", step, err)
		}
		rejoined++
		sess = m.session()
		setTotalSteps(cfg, sess)
		if err := attachPolicy(cfg, sess); err != nil {
			return false, err
		}
		return true, nil
	}
	defer func() {
		end(res.Outcome)
		if res.Outcome == Completed && err == nil {
			// The end of training goes out even if ctx ends now.
			err = m.finish(context.WithoutCancel(ctx))
		} else {
			_ = m.close()
		}
	}()
	setTotalSteps(cfg, sess)
	notice, stepCtx := watchLeave(ctx, cfg.LeaveNotice, leave)
	defer notice.stop()
	if err := attachPolicy(cfg, sess); err != nil {
		return res, err
	}
	// sess, not its value now: a rejoin replaces the session.
	defer func() { detachPolicy(cfg, sess) }()
	defer startPolicy(ctx, cfg)()
	var last TrainStep
	for {
		if cfg.Steps > 0 && sess.Step() >= cfg.Steps || cfg.Epochs > 0 && cfg.Data.Epoch() >= cfg.Epochs {
			res.Outcome = Completed
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		select {
		case <-notice.leaveSignalled():
			if !leaving {
				leaving = true
				log.Info("leave signal: leaving the job once the others have moved on", "step", sess.Step(), "notice", cfg.LeaveNotice)
				if err := m.requestLeave(ctx); err != nil {
					return res, fmt.Errorf("sync: asking to leave: %w", err)
				}
			}
			if notice.over() {
				log.Info("leave notice running out: leaving without the others' world", "step", sess.Step())
				res.Outcome = Left
				return res, nil
			}
		default:
		}
		began := time.Now()
		s := TrainStep{Number: sess.Step() + 1, Rank: sess.Rank(), Size: sess.Size(), World: sess.World().Number, Session: sess}
		if s.Number == last.Number {
			s.Attempt = last.Attempt + 1
		}
		last = s
		var dataEpoch uint64
		if cfg.Data != nil {
			dataEpoch = cfg.Data.Epoch()
		}
		s.Plan = cfg.BatchPolicy.PlanBatch(Progress{Step: sess.Step(), Size: s.Size, DataEpoch: dataEpoch})
		sess.SetGlobalBatch(s.Plan.Global)
		if cfg.Data != nil {
			b, err := cfg.Data.Batch(s.Rank, s.Size, s.Plan.Global)
			if err != nil {
				return res, fmt.Errorf("sync: the batch of step %d (global batch %d): %w", s.Number, s.Plan.Global, err)
			}
			if b.Global == 0 {
				if err := endEpoch(ctx, cfg, sess); err != nil {
					return res, err
				}
				continue
			}
			s.Batch = b
			sess.RecordSamples(len(b.Indices))
			sess.SetGlobalBatch(b.Global)
		}
		switch err := step(stepCtx, &s); {
		case err != nil && notice.ranOut():
			log.Info("leave notice ran out during the step: leaving with the last committed step", "step", sess.Step())
			res.Outcome = Left
			return res, nil
		case errors.Is(err, ErrWorldChanged):
			log.Info("the world changed during the step: redoing it", "step", s.Number, "attempt", s.Attempt)
			continue
		case errors.Is(err, ErrExcluded):
			if back, err := comeBack(sess.Step()); back || err != nil {
				if err != nil {
					return res, err
				}
				continue
			}
			res.Outcome = excluded(leaving)
			return res, nil
		case err != nil:
			return res, err
		}
		if cfg.Data != nil {
			if err := cfg.Data.Advance(s.Batch.Global); err != nil {
				return res, err
			}
		}
		err := sess.Commit(stepCtx)
		out := errors.Is(err, ErrExcluded) // the step counted; the world goes on without us
		switch {
		case err != nil && !out && notice.ranOut():
			log.Info("leave notice ran out during the commit: leaving", "step", sess.Step())
			res.Outcome = Left
			return res, nil
		case errors.Is(err, ErrWorldChanged):
			continue // carry on from the state of the new world's rank 0
		case err != nil && !out:
			return res, err
		}
		notice.stepTook(time.Since(began))
		s.Number = sess.Step()
		if cfg.Committed != nil {
			if err := cfg.Committed(ctx, &s); err != nil {
				return res, err
			}
		}
		if out {
			if back, err := comeBack(s.Number); back || err != nil {
				if err != nil {
					return res, err
				}
				continue
			}
			res.Outcome = excluded(leaving)
			log.Info("left out of the next world: training ends here", "step", s.Number, "outcome", res.Outcome)
			return res, nil
		}
	}
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
