package sync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/epoch"
)

// What a language binding (bindings/c, and the Python package over it)
// needs beyond what a Go trainer uses: the binding drives its own loop, so it
// joins the job as Train does but holds the membership itself, and it runs
// every collective of the framework it serves (broadcasts, allgathers,
// alltoalls, barriers), not only gradient allreduces, through the session's
// failure handling.

// JobMember is a process's place in a job, as a binding that drives its own
// training loop holds it: the Worker of an elastic job, or a world of one when
// no launcher started the process.
type JobMember struct{ m member }

// JoinJob joins a job as Train does, without Train's loop: the way in for a
// binding that drives its own loop (a trainer calls Train). It joins the job
// cfg names (cfg.JobID set), else
// the launcher's job when a launcher started the process (UnderLauncher: the
// job, secret, seeds, launch name and addresses come from the environment and
// the rest of cfg applies), else a world of one. It returns once a world
// admits this process and the state has arrived from its rank 0.
func JoinJob(ctx context.Context, cfg WorkerConfig, state *State) (*JobMember, error) {
	m, err := join(ctx, cfg, state)
	if err != nil {
		return nil, err
	}
	return &JobMember{m}, nil
}

// Session is the job member's session. Its methods are for one goroutine at
// a time (AbortIfMember and Newest aside).
func (m *JobMember) Session() *Session { return m.m.session() }

// RequestLeave asks to leave the job gracefully: a world without this process
// is proposed, and Commit returns ErrExcluded at the step boundary where the
// others move to it. Keep training until then.
func (m *JobMember) RequestLeave(ctx context.Context) error { return m.m.requestLeave(ctx) }

// Finish tells the job that training is over (see Worker.Finish), then leaves.
func (m *JobMember) Finish(ctx context.Context) error { return m.m.finish(ctx) }

// Close leaves the job without reporting the end of training (an error, an
// interruption, or a worker the job went on without).
func (m *JobMember) Close() error { return m.m.close() }

// Newest is the number of the newest world this worker has been told of:
// the session's own world's, or above it while the job has agreed on a
// next world that the session has not moved to yet; breaking says that
// world goes on without a member of the session's world that this
// worker's gossip declared dead. The session moves at its next collective
// or commit: with breaking, the next collective on the old world fails (a
// running one is aborted) and the session recovers into the newest world;
// without (workers joining or leaving gracefully), it moves at the commit
// where every member does. Unlike the session's other methods it may be
// called from any goroutine, at any time: a binding that waits outside the
// session (on a store, for its peers) asks it whether the world it waits
// in is breaking, as a collective would learn.
func (s *Session) Newest() (number uint64, breaking bool) {
	if d, ok := s.src.(deadLeftOut); ok {
		return d.deadLeftOut(s.currentWorld())
	}
	return s.src.Latest(), false
}

// Left is the ranks, in the session's world, of its members that left the
// job gracefully: their processes shut the library down (gossip was told
// goodbye, not a failure), so they will take part in nothing more of this
// world, though the job may form no world without them (a member that
// reported training finished ends the job's worlds). A member that asked
// to leave (RequestLeave) and still trains is not among them. Like Newest,
// it may be called from any goroutine: a binding waiting outside the
// session for its peers asks it whether one of them is gone for good.
func (s *Session) Left() []int {
	if l, ok := s.src.(leftOf); ok {
		return l.leftOf(s.currentWorld())
	}
	return nil
}

// leftOf is an epoch source that knows which members left the gossip
// cluster gracefully (a worker's memberSource).
type leftOf interface {
	leftOf(current epoch.World) []int
}

// deadLeftOut is an epoch source that also knows gossip's verdicts (a
// worker's memberSource): it reports the newest world it holds, and whether
// that world is newer than current and leaves out a member of current that
// gossip declared dead.
type deadLeftOut interface {
	deadLeftOut(current epoch.World) (newest uint64, breaking bool)
}

// Collective runs collectives beyond gradient averaging (broadcasts,
// allgathers, alltoalls, barriers) on the current world's communicator, and
// handles their failures as Allreduce does: an error that left the world
// intact (bad arguments refused before anything was sent) is returned as it
// is; a MismatchError (the workers called different collectives) is returned
// wrapped; any other failure broke the world, which is rebuilt and the state
// re-synchronized from the new rank 0 before ErrWorldChanged is returned.
//
// fn must run all its collectives on the communicator it is given and keep
// nothing of it: the next world has another. Its time counts as the step's
// time blocked on the other workers, as Allreduce's does: a binding that
// checks each call with a small collective first waits there for the
// slowest worker, and that wait is not the step's compute.
func (s *Session) Collective(ctx context.Context, fn func(ctx context.Context, c *collective.Communicator) error) error {
	defer s.clock.Wait(time.Now())
	comm := s.comm
	if err := fn(ctx, comm); err != nil {
		return s.failed(ctx, comm, err)
	}
	return nil
}

// worldChanged is ErrWorldChanged with the failure that changed the world,
// so that a worker whose collective failed because of another worker's
// mistake (a peer that aborted on mismatched tensors says why) can tell its
// user.
func worldChanged(cause error) error {
	if cause == nil || errors.Is(cause, ErrWorldChanged) {
		return ErrWorldChanged
	}
	return fmt.Errorf("%w (%v)", ErrWorldChanged, cause)
}
