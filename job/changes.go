// What the Job does about what its driver and its Discovery report: the
// driver's hooks (each proposed world, the step statistics, a member taken
// out), the host lists, and handle, which supervise runs to report the worlds
// and to stop the workers of dropped hosts and stuck members.

package job

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// onEpoch is the driver's hook for every proposed world, called on its
// proposing goroutine: it must not block.
func (j *Job) onEpoch(e epoch.World) {
	names := make([]string, len(e.Members))
	for i, m := range e.Members {
		names[i] = m.Name
	}
	j.start.formedWith(e, func(msg string) {
		j.cfg.Logger.Warn(msg)
		j.events.later(Notice{At: now(), Message: msg})
	})
	j.engine.OnWorld(heuristics.WorldChange{Epoch: e.Number, Members: names, At: time.Now()})
	j.stalls.world(e)
	j.inbox.addWorld(e)
	j.inbox.wake()
}

// onStats is the driver's hook for the workers' step statistics (on its
// proposing goroutine).
func (j *Job) onStats(worker string, b stats.Batch) {
	reps := stepReports(worker, b.Steps, b.TotalSteps)
	for _, s := range b.Steps {
		for last := j.lastStep.Load(); s.Step > last && !j.lastStep.CompareAndSwap(last, s.Step); last = j.lastStep.Load() {
		}
	}
	j.engine.OnReports(worker, reps)
	j.events.later(StepsReported{At: now(), Worker: worker, Steps: reps})
}

// handle reports the worlds proposed since the last call and acts on hosts
// the Discovery dropped; prev is the last world reported.
func (j *Job) handle(prev epoch.World) epoch.World {
	worlds, dropped, stuck := j.inbox.take()
	if len(worlds) > 0 {
		j.learnNames()
	}
	for _, w := range worlds {
		ev := WorldChanged{At: now(), World: w}
		for _, m := range w.Members {
			if prev.Rank(m.Name) < 0 {
				ev.Joined = append(ev.Joined, m.Name)
				if hand := j.roster.noteHandStarted(m.Name); hand {
					ev.ByHand = append(ev.ByHand, m.Name)
				}
			}
		}
		for _, m := range prev.Members {
			if w.Rank(m.Name) < 0 {
				ev.Left = append(ev.Left, m.Name)
			}
		}
		j.events.emit(ev)
		j.roster.followMembers(prev, w)
		prev = w
	}
	for _, host := range dropped {
		j.dropHost(host)
	}
	if len(stuck) > 0 {
		j.learnNames()
	}
	for _, name := range stuck {
		j.stopStuck(name)
	}
	return prev
}

// learnNames maps the driver's workers to the processes of the job.
func (j *Job) learnNames() { j.roster.learn(j.driver.Workers()) }

// discover follows the Discovery's host lists until ctx ends.
func (j *Job) discover(ctx context.Context) {
	var once sync.Once
	err := j.cfg.Discovery.Discover(ctx, func(hosts []Host) {
		hosts = slices.Clone(hosts)
		j.inbox.addDropped(j.roster.setHosts(hosts))
		once.Do(func() { close(j.hostsSeen) })
		j.events.emit(HostsChanged{At: now(), Hosts: hosts})
		j.inbox.wake()
	})
	if err != nil && ctx.Err() == nil {
		j.events.notice(fmt.Sprintf("host discovery failed (keeping the last host list): %v", err))
	}
}

// onRemoved is the driver's hook for the workers its proposer takes out of
// the job (on its proposing goroutine): supervise stops those removed as
// stuck (stopStuck).
func (j *Job) onRemoved(name string, why epoch.Reason) {
	if why == epoch.ReasonFinished {
		j.roster.addDoneEarly(name)
		return
	}
	if why != epoch.ReasonStuck {
		return
	}
	j.inbox.addStuck(name)
	j.inbox.wake()
}

// stopStuck stops the process behind a member the driver removed as stuck
// (end-of-job rule 3): blamed for the failures of several worlds in a row
// while it answered every probe, it is never admitted again under its name,
// and its process, alive, would count as a worker staying in the job: the
// floor would start no replacement, and a job at its minimum would wait
// for a world forever. Stopped, it is replaced like a lost worker (a host
// that keeps a stuck worker is treated as Horovod treats a failing one: the
// job goes on with other processes). StopSignal first; SIGKILL after
// Config.RemoveGrace if it ignored that (a deadlocked process may).
func (j *Job) stopStuck(name string) {
	ref, proc, ok := j.roster.stopStuck(name)
	if !ok {
		j.events.notice(fmt.Sprintf("worker %s was removed from the job as stuck (blamed for the failures of several worlds in a row while it answered its probes); it is not a running process of this job, so it is left to whoever started it", name))
		return
	}
	j.events.notice(fmt.Sprintf("worker %d (%s, pid %d) was removed from the job as stuck (blamed for the failures of several worlds in a row while it answered its probes): stopping it, and the job's minimum starts another in its place", ref.Index, name, ref.PID))
	go func() {
		// Bounded by the ladder (twice RemoveGrace); the launcher stops
		// the process anyway when the job ends.
		err := j.signalUntilExit(context.Background(), ref, name, ", removed as stuck,", proc,
			[]stopStep{{StopSignal, j.cfg.RemoveGrace}, {syscall.SIGKILL, j.cfg.RemoveGrace}})
		if err != nil {
			j.events.notice(fmt.Sprintf("worker %d (%s): %v", ref.Index, name, err))
		}
	}()
}

// dropHost stops the job's workers on a host the Discovery no longer lists
// (end-of-job rule 3): the driver moves on without them at once.
func (j *Job) dropHost(host string) {
	victims, names := j.roster.stopHost(host)
	if len(victims) == 0 {
		return
	}
	j.events.notice(fmt.Sprintf("host %q left the job: stopping its %d workers", host, len(victims)))
	for _, name := range names {
		j.driver.Remove(name)
	}
	for _, p := range victims {
		_ = launch.SignalAwake(p, StopSignal)
	}
}
