// The Job's worker processes: adding them (AddWorkers, the engine's and the
// floor's requests) within Config.MaxWorkers, launching each on a reserved
// slot, following each to its exit (await), and asking them all to leave
// (LeaveAll).

package job

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
)

// AddWorkers launches n more workers, which join the job by themselves. It
// refuses with a *LimitError beyond Config.MaxWorkers (counting the running
// processes of the job, joined or not, and the workers started by hand that
// the driver knows of), ErrNoSlot when the hosts are full and ErrEnded once
// the job has ended.
func (j *Job) AddWorkers(ctx context.Context, n int) error {
	if err := j.roomFor(n); err != nil {
		return err
	}
	return j.add(ctx, n, startedByHand)
}

// roomFor says whether n more workers fit under Config.MaxWorkers (a
// *LimitError when not).
func (j *Job) roomFor(n int) error {
	if max := j.cfg.MaxWorkers; max > 0 {
		if count := j.count(); count+n > max {
			return &LimitError{Workers: count, Max: max}
		}
	}
	return nil
}

// LeaveAll asks every running worker to leave the job gracefully
// (LeaveSignal: each trains on until its leave notice runs out or the others
// have moved on, and leaves at a committed step), and starts no worker after
// it: the job ends when they have gone. It is what a job preempted as a
// whole does (`gorovod run` under SIGTERM: a Slurm time limit or
// preemption, a Kubernetes eviction of the driver). Cancelling the job's
// context still stops them at once.
func (j *Job) LeaveAll() {
	for _, p := range j.roster.drain() {
		_ = p.Signal(LeaveSignal)
	}
}

// count is how many workers the job has: its processes still running (or
// starting) and the hand-started workers in the driver's view.
func (j *Job) count() int { return j.roster.count(j.driver.Workers()) }

// startedBy says who asked for a worker the job adds.
type startedBy int

const (
	startedByHand   startedBy = iota // AddWorkers
	startedByEngine                  // the autoscaling engine (provisioner.Start)
	startedByFloor                   // keepMinimum: a replacement
)

// add launches n workers, each on the first host with a free slot, for
// whoever asked for them.
func (j *Job) add(ctx context.Context, n int, by startedBy) error {
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		index, host, share, err := j.roster.reserve()
		if err != nil {
			return err
		}
		w, err := j.launch(index, host, share)
		if err != nil {
			return err
		}
		j.roster.markStartedBy(index, by)
		j.events.emit(WorkerStarted{At: now(), Worker: w})
	}
	return nil
}

// addReplacement launches one worker for the floor, within
// Config.MaxWorkers.
func (j *Job) addReplacement(ctx context.Context) error {
	if err := j.roomFor(1); err != nil {
		return err
	}
	return j.add(ctx, 1, startedByFloor)
}

// launch starts the reserved process index on host.
func (j *Job) launch(index int, host string, share int) (WorkerRef, error) {
	env := slices.Concat(j.env, []string{envconfig.EnvLaunchIndex + "=" + strconv.Itoa(index)}, j.cfg.Env)
	p, err := j.cfg.Launcher.Launch(j.workCtx, LaunchRequest{
		Index: index, Host: host, Argv: j.cfg.Argv, Env: env, Share: share,
		Output: func(stream string, line []byte) {
			j.events.emit(WorkerOutput{Worker: index, Stream: stream, Line: line})
		},
		Notice:    j.events.notice,
		OutputDir: j.cfg.OutputDir,
	})
	if err != nil {
		j.roster.unreserve(host)
		return WorkerRef{}, fmt.Errorf("job: starting worker %d: %w", index, err)
	}
	ref := WorkerRef{Index: index, Host: host, PID: p.PID()}
	j.record.started(ref)
	if s, ok := p.(interface{ Started() <-chan struct{} }); ok && ref.PID == 0 {
		// A remote worker's pid on its host is known once it runs there:
		// an adopting runner needs it (Config.Adopt).
		go func() {
			select {
			case <-s.Started():
				j.record.running(index, p.PID())
			case <-p.Done():
			}
		}()
	}
	j.roster.launched(index, ref, p)
	go j.await(index, p)
	return ref, nil
}

// await records the end of process index.
func (j *Job) await(index int, p Process) {
	<-p.Done()
	reported := false
	if errors.Is(p.Err(), ErrExitUnknown) { // an adopted worker
		reported = j.reportedEnd(index)
	}
	ev, lostStart := j.roster.exited(index, p, reported, j.floor.noteExitLocked)
	var lostHost *launch.HostError
	if !errors.As(ev.Err, &lostHost) {
		// The process is known to have ended (a broken connection to its
		// host is not proof: the host may be cut off, the worker training),
		// under every name it had.
		j.learnNames()
		for _, name := range j.roster.names(index) {
			j.driver.Exited(name)
		}
	}
	j.record.exited(ev)
	j.events.emit(ev)
	if lostStart {
		// A worker the engine started ended before it ever entered a
		// world: the engine's grow stops waiting for it.
		j.engine.OnStartLost()
	}
	if lostHost != nil && j.blacklist(lostHost.Host) {
		// Its host is out of the job: the runner stops its other workers
		// there and the driver takes them out for good (dropHost). This one
		// goes with them, now: left to the members' blame and the driver's
		// probes, a host's death cost the job a world with the dead worker
		// in it, which failed at its connect (at 16 workers, a quarter of a
		// second more before the survivors trained again).
		j.learnNames()
		for _, name := range j.roster.names(index) {
			j.driver.RemoveLost(name)
		}
	}
	j.roster.left()
	j.floor.wake()
	j.start.wake()
}

// waitLaunched waits for every process launched so far to exit (after
// stopWorkers), when Start fails.
func (j *Job) waitLaunched() {
	for _, p := range j.roster.processes() {
		<-p.Done()
	}
}
