package sync

import (
	"context"
	"fmt"
	"os"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
)

// DefaultLeaveNotice is a worker's default notice: from its leave signal to
// the moment it must be gone. Kubernetes kills a pod 30 s after its SIGTERM
// by default, Slurm a job KillWait (30 s by default) after its SIGTERM.
const DefaultLeaveNotice = 25 * time.Second

// maxCloseReserve bounds the part of the notice kept for leaving the job
// (the gossip leave, bounded by membership's LeaveTimeout) and exiting.
const maxCloseReserve = 5 * time.Second

// leaveNoticeFrom is the notice TrainConfig asks for: its own, else the
// launcher's (GOROVOD_LEAVE_NOTICE), else the default.
func leaveNoticeFrom(c TrainConfig) (time.Duration, error) {
	if c.LeaveNotice < 0 {
		return 0, fmt.Errorf("%w: TrainConfig.LeaveNotice %v < 0", ErrInvalidConfig, c.LeaveNotice)
	}
	if c.LeaveNotice > 0 {
		return c.LeaveNotice, nil
	}
	d, ok, err := envconfig.LeaveNotice(os.Getenv)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if ok {
		return d, nil
	}
	return DefaultLeaveNotice, nil
}

// leaveNotice is the clock a leave signal starts. The loop leaves the job as
// soon as the others have moved on without this worker; if they have not by
// the end of the notice (less a reserve for leaving and exiting: a fifth of
// it, at most maxCloseReserve) — every worker was told to leave at once, or
// the world cannot shrink below its minimum — the worker leaves anyway, at a
// step boundary: it starts no step it cannot finish in time (judged by the
// last step's duration). A step still running when time is up gets half the
// reserve to finish: its collectives may already have completed for the
// others, which then count it committed, and when every worker leaves at
// once (a job preempted as a whole) nobody redoes it, so abandoning it would
// leave the workers disagreeing on their last step by one. Only a step still
// running after that is abandoned, uncommitted; the others redo the step
// they were in without this worker.
type leaveNotice struct {
	notice    time.Duration
	cancel    context.CancelFunc // cancels the loop's step context
	signalled chan struct{}      // closed when the leave signal arrives
	done      chan struct{}      // closed when the loop ends

	mu        stdsync.Mutex
	stopAt    time.Time // zero until the signal
	expired   bool      // time is up: no new step
	cancelled bool      // the step context was cancelled for the notice
	lastStep  time.Duration
	timers    []*time.Timer
}

// watchLeave starts watching leave (nil: never) for the loop; steps run in
// the returned context, which ends with ctx or when the notice runs out.
func watchLeave(ctx context.Context, notice time.Duration, leave <-chan os.Signal) (*leaveNotice, context.Context) {
	stepCtx, cancel := context.WithCancel(ctx)
	n := &leaveNotice{notice: notice, cancel: cancel, signalled: make(chan struct{}), done: make(chan struct{})}
	go func() {
		select {
		case <-leave:
			n.start(time.Now())
		case <-n.done:
		}
	}()
	return n, stepCtx
}

func (n *leaveNotice) start(at time.Time) {
	reserve := min(n.notice/5, maxCloseReserve)
	n.mu.Lock()
	n.stopAt = at.Add(n.notice - reserve)
	n.timers = append(n.timers,
		time.AfterFunc(n.notice-reserve, func() {
			n.mu.Lock()
			n.expired = true
			n.mu.Unlock()
		}),
		time.AfterFunc(n.notice-reserve/2, func() {
			n.mu.Lock()
			n.expired, n.cancelled = true, true
			n.mu.Unlock()
			n.cancel()
		}))
	n.mu.Unlock()
	close(n.signalled)
}

// leaveSignalled is closed once the leave signal has arrived.
func (n *leaveNotice) leaveSignalled() <-chan struct{} { return n.signalled }

// stepTook records a committed step's duration.
func (n *leaveNotice) stepTook(d time.Duration) {
	n.mu.Lock()
	n.lastStep = d
	n.mu.Unlock()
}

// over says whether the notice leaves no time for another step (or was
// used up during the last one).
func (n *leaveNotice) over() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.expired || !n.stopAt.IsZero() && time.Now().Add(n.lastStep).After(n.stopAt)
}

// ranOut says whether the step context was cancelled because the notice ran
// out (an error from the step or the commit is then this worker leaving).
func (n *leaveNotice) ranOut() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cancelled
}

// stop ends the watch when the loop ends.
func (n *leaveNotice) stop() {
	close(n.done)
	n.mu.Lock()
	for _, t := range n.timers {
		t.Stop()
	}
	n.mu.Unlock()
	n.cancel()
}
