package job

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
)

// The runner's bound on a worker process that runs but is out of the job's
// view: the driver's gossip lists none of its member names. It may be paused
// (SIGSTOP, a suspended job step), hung before it joined, or cut off from
// the driver. While it runs, the floor counts it as a worker staying in the
// job and starts nobody in its place, and the driver forms no world without
// it when the job is at its minimum: the job would wait for it forever (and
// the workers that wait for a world give up after Config.ElasticTimeout,
// failing the job). So, well within ElasticTimeout:
//
//   - out of view for Config.WakeAfter after the driver last listed it
//     (half of ElasticTimeout for one that never joined), it is woken
//     (SIGCONT). A paused worker then comes back, as a member of the world
//     or as a new one (sync's Worker.Rejoin), with the training state it
//     holds, which may be the job's only copy. A signal that wakes nothing
//     does no harm, so a worker that left the view is woken soon after
//     gossip declared it dead; one that never joined may only be slow to
//     start (a Python trainer importing torch), and gets longer before the
//     runner says so;
//   - still out a quarter of ElasticTimeout after that, it is stopped
//     (StopSignal, then SIGKILL after Config.RemoveGrace) as
//     StopUnresponsive, and the floor replaces it like a lost worker, from
//     the members that hold the state.
//
// The clock starts at the job's first world (start.go gives up on a job
// whose first world never forms), at the process's launch, or when the
// driver last listed it, whichever is latest. Workers started by hand are
// not the runner's to signal.

// view is what the runner knows of one process's presence in the driver's
// view; a part of its proc, under the roster's mu.
type view struct {
	seen  time.Time // the driver last listed one of its member names
	woken time.Time // woken as unresponsive, not seen since (zero: not woken)
}

// listedAt notes that a driver listed process index at t (an adopted
// worker, which the job's earlier driver listed).
func (r *roster) listedAt(index int, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.findLocked(index); p != nil {
		p.view = view{seen: t}
	}
}

// unresponsiveProc is a process the bound acts on.
type unresponsiveProc struct {
	ref  WorkerRef
	name string // its last member name ("" if it never joined)
	p    Process
	out  time.Duration // how long it has been out of view
}

// watchUnresponsive applies the bound from the job's first world until ctx
// ends or training is over (the end of the job has its own rules).
func (j *Job) watchUnresponsive(ctx context.Context) {
	select {
	case <-j.start.formed:
	case <-ctx.Done():
		return
	case <-j.driver.Finished():
		return
	}
	from := time.Now()
	wakeAfter := wakeBounds{left: min(j.cfg.WakeAfter, j.cfg.ElasticTimeout/2), neverJoined: j.cfg.ElasticTimeout / 2}
	stopAfter := j.cfg.ElasticTimeout / 4
	tick := time.NewTicker(minimumCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-j.driver.Finished():
			return
		case <-tick.C:
		}
		wake, stop := j.roster.unresponsive(j.driver.Workers(), from, time.Now(), wakeAfter, stopAfter)
		for _, u := range wake {
			j.events.notice(fmt.Sprintf("worker %d (%s) has been out of the job's view for %v (paused, hung or cut off): waking it (SIGCONT); if it is still out %v from now, it is stopped and replaced",
				u.ref.Index, u.describe(), u.out.Round(time.Millisecond), stopAfter))
			_ = u.p.Signal(syscall.SIGCONT) // an error: it has exited since
		}
		for _, u := range stop {
			j.events.notice(fmt.Sprintf("worker %d (%s) is still out of the job's view %v after it was woken: stopping it as unresponsive, and the job's minimum starts another in its place",
				u.ref.Index, u.describe(), stopAfter))
			go func() {
				// Bounded by the ladder (twice RemoveGrace); the launcher
				// stops the process anyway when the job ends.
				err := j.signalUntilExit(context.Background(), u.ref, u.describe(), ", unresponsive,", u.p,
					[]stopStep{{StopSignal, j.cfg.RemoveGrace}, {syscall.SIGKILL, j.cfg.RemoveGrace}})
				if err != nil {
					j.events.notice(fmt.Sprintf("worker %d (%s): %v", u.ref.Index, u.describe(), err))
				}
			}()
		}
	}
}

// describe names the process for a notice: its member name and pid.
func (u unresponsiveProc) describe() string {
	if u.name == "" {
		return fmt.Sprintf("pid %d, never joined", u.ref.PID)
	}
	return fmt.Sprintf("%s, pid %d", u.name, u.ref.PID)
}

// wakeBounds is how long a running process may be out of the driver's view
// before it is woken.
type wakeBounds struct {
	left        time.Duration // it was listed once (it joined), and left the view
	neverJoined time.Duration // the driver never listed it
}

// unresponsive notes which processes ws, the driver's workers at now, lists,
// and returns the running processes out of view for wakeAfter since from
// (the first world), their launch or when last listed, which it marks as
// woken, and those woken stopAfter ago and not listed since, which it
// marks as stopped (StopUnresponsive). Once training is over, or every
// worker was asked to leave, it returns none.
func (r *roster) unresponsive(ws []driver.WorkerInfo, from, now time.Time, wakeAfter wakeBounds, stopAfter time.Duration) (wake, stop []unresponsiveProc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if p, _ := r.matchLocked(w); p != nil {
			p.view = view{seen: now}
		}
	}
	if r.standing.trainingOver || r.standing.draining || r.standing.ended {
		return nil, nil
	}
	for _, p := range r.procs {
		if p.rec.State != Running || p.stopped != NoStopReason || p.removed {
			continue
		}
		since := from
		for _, t := range []time.Time{p.rec.Started, p.seen} {
			if t.After(since) {
				since = t
			}
		}
		u := unresponsiveProc{ref: p.rec.WorkerRef, name: p.rec.Name, p: p.p, out: now.Sub(since)}
		// Joined: this bound saw the driver list it, or the roster learned
		// its member name from a listing between the bound's looks (a
		// worker paused within a tick of joining).
		wakeAt := wakeAfter.left
		if p.seen.IsZero() && p.rec.Name == "" {
			wakeAt = wakeAfter.neverJoined
		}
		switch {
		case p.woken.IsZero() && u.out >= wakeAt:
			p.woken = now
			wake = append(wake, u)
		case !p.woken.IsZero() && now.Sub(p.woken) >= stopAfter:
			p.stop(StopUnresponsive)
			p.midway = true
			stop = append(stop, u)
		}
	}
	return wake, stop
}
