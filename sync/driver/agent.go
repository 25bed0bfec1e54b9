package driver

import (
	"context"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/epoch"
)

// finishHold bounds how long a worker that proposes stays after it finished
// training, for the members of its world that are still finishing.
const finishHold = time.Minute

// holdPoll is how often Finish looks whether those members are done, or
// whether its report has reached a proposer.
const holdPoll = 50 * time.Millisecond

// finishReportWait bounds how long Finish waits for a proposer to take its
// report when none is in view (the driver out of this worker's gossip view
// for a moment under load, as a frozen or starved process is): long enough
// for gossip to bring the driver back, or for a worker to take over from a
// driver that is gone (epoch.DefaultTakeoverGrace, plus
// epoch.DefaultMinorityGrace without a quorum).
const finishReportWait = 15 * time.Second

// AgentConfig configures a worker's side of the epoch protocol.
type AgentConfig struct {
	// MinWorkers is what the worker requires of a world if it takes over
	// proposing (the job's driver is gone); default 1.
	MinWorkers int
	// FirstWorld is the number of workers the job was started with (0: not
	// known): if the worker takes over before any world reached it, it
	// proposes a first world only with a strict majority of them
	// (epoch.CheckFirstQuorum), and waits the minority grace too before it
	// takes over while it sees no more than half of them.
	FirstWorld int
	// TakeoverGrace: how long no driver must have been in view before the
	// worker may take over (default epoch.DefaultTakeoverGrace).
	TakeoverGrace time.Duration
	// ProbeTimeout is what the worker's proposer, once it took over, waits
	// for the answer to its liveness probe of a blamed worker, or of one
	// gossip declared dead, before it leaves it out of the next world
	// (epoch.ReasonUnanswered, epoch.ReasonFailed): driver.Config's
	// ProbeTimeout for the proposer that replaces the driver. A job's workers
	// should have their driver's, or one that takes over leaves a worker
	// starved of CPU (or behind a slow link) out sooner than the driver
	// would. Default 500 ms (epoch.DefaultProposerConfig).
	ProbeTimeout time.Duration
	// OnAdopt receives every epoch newer than the ones before, in order.
	// OnPeerFailed is told when gossip declares a member dead (a collective
	// stuck on it can stop once the proposer leaves it out), OnPeerAlive
	// when gossip hears from a member again (it joined, came back or
	// published new metadata), OnPeerLeft when a member left the gossip
	// cluster gracefully (its process shut its library down: it will not
	// take part in a collective again, though no world need replace it, as
	// when it reported training finished). All four are called on the
	// agent's goroutine and must not block.
	OnAdopt      func(epoch.World)
	OnPeerFailed func(name string)
	OnPeerAlive  func(name string)
	OnPeerLeft   func(name string)
	// OnOutForGood is told that the proposer will not admit this worker
	// again (it was evicted, or training is over), before the epoch that
	// leaves it out reaches OnAdopt. Called on the agent's goroutine.
	OnOutForGood func()
	Logger       *slog.Logger
}

// Agent is a worker's side of the epoch protocol: a thin loop around an
// epoch.Follower over the worker's gossip member. It delivers the epochs
// announced to the worker (OnAdopt), answers liveness probes, sends the
// worker's reports to the proposer, and, when the job has no driver and this
// is its oldest ready worker, proposes epochs itself.
type Agent struct {
	fol  *epoch.Follower // touched only on the loop's goroutine
	loop *loop
}

// StartAgent starts the protocol on member m.
func StartAgent(m *membership.Member, cfg AgentConfig) *Agent {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fol := epoch.NewFollower(epoch.FollowerConfig{
		Self: m.Name(), TakeoverGrace: cfg.TakeoverGrace,
		Proposer: epoch.ProposerConfig{MinWorkers: cfg.MinWorkers, FirstWorld: cfg.FirstWorld, ProbeTimeout: cfg.ProbeTimeout},
	}, time.Now())
	a := &Agent{fol: fol, loop: newLoop(m, fol, log)}
	a.loop.notify = func(o epoch.Output) {
		switch o := o.(type) {
		case epoch.Adopted:
			if cfg.OnAdopt != nil {
				cfg.OnAdopt(o.World)
			}
		case epoch.OutForGood:
			if cfg.OnOutForGood != nil {
				cfg.OnOutForGood()
			}
		}
	}
	a.loop.onEvent = func(ev membership.Event) {
		switch {
		case ev.Kind == membership.EventFailed && cfg.OnPeerFailed != nil:
			cfg.OnPeerFailed(ev.Node.Name)
		case ev.Kind == membership.EventLeft && cfg.OnPeerLeft != nil:
			cfg.OnPeerLeft(ev.Node.Name)
		case (ev.Kind == membership.EventJoined || ev.Kind == membership.EventUpdated) && cfg.OnPeerAlive != nil:
			cfg.OnPeerAlive(ev.Node.Name)
		}
	}
	a.loop.start()
	return a
}

// ReportFailure tells the proposer that a collective of epoch number failed,
// blaming member blamed ("" when none). It returns at once; the report is
// sent again until a newer epoch arrives.
func (a *Agent) ReportFailure(number uint64, blamed string, cause error) {
	c := ""
	if cause != nil {
		c = cause.Error()
	}
	a.loop.do(func(now time.Time) []epoch.Output {
		return a.fol.Step(now, epoch.ReportFailure{Number: number, Blamed: blamed, Cause: c})
	})
}

// Finish tells the proposer that training finished on this worker, at epoch
// number, and returns once the message is sent. When no proposer is in view,
// or the send fails, it tries again until one takes it, for at most
// finishReportWait: a worker that left without telling would leave the job
// unaware that training is over (it would then fail for "training did not
// finish"). A worker that proposes
// epochs itself stays until the members of its world that are still
// training have finished or gone (at most a minute): its successor would not
// know that training is over.
func (a *Agent) Finish(ctx context.Context, number uint64) error {
	sent := a.loop.do(func(now time.Time) []epoch.Output {
		return a.fol.Step(now, epoch.ReportDone{Number: number})
	})
	select {
	case <-sent:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := a.awaitDoneTaken(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, finishHold)
	defer cancel()
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	for {
		training, err := query(ctx, a.loop, func() []string {
			if p := a.fol.Proposer(); p != nil {
				return p.StillTraining()
			}
			return nil
		})
		if err != nil || len(training) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil // the hold is a courtesy: its end is no failure
		}
	}
}

// awaitDoneTaken waits, at most finishReportWait, until the end-of-training
// report has been handed to a proposer (epoch.Follower.DonePending). Only
// ctx's end is an error: a report that could not be delivered in time is
// given up (the job then learns the end from the other workers, if any).
func (a *Agent) awaitDoneTaken(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, finishReportWait)
	defer cancel()
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	for {
		pending, err := query(wctx, a.loop, a.fol.DonePending)
		if err != nil || !pending {
			return ctx.Err()
		}
		select {
		case <-tick.C:
		case <-wctx.Done():
			return ctx.Err()
		}
	}
}

// Stop stops the protocol (call it once the member has left).
func (a *Agent) Stop() { a.loop.stop() }
