package job

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorovod/gorovod/membership"
)

// minimumCheck is how often the runner looks for a job below its minimum.
const minimumCheck = 500 * time.Millisecond

// keepMinimum is the runner's floor under an elastic job. The driver
// proposes no world with fewer than Config.MinWorkers members, and the
// autoscaling engine acts on worlds only: a job whose workers left or died
// below its minimum (a SIGTERM storm, preempted pods, steps cancelled by
// Slurm) would wait for more forever. So while training goes on, when the
// workers staying in the job — its running processes less those whose
// members announced that they are leaving, plus members started by hand that
// are not leaving — are fewer than MinWorkers, the runner launches
// replacements (within MaxWorkers and the hosts' slots; when those are full
// it tries again as processes exit). A shortage must be seen twice in a row,
// minimumCheck apart (a worker that finished training may exit just before
// the driver learns that training is over). It does nothing once every
// process has exited (the job is over: rule 4) or once a worker failed (the
// job has failed: rule 5).
//
// Replacements copy the training state from a member of the current world
// that stays. When every member is leaving or gone (a whole job preempted,
// every worker told to go at once), none is left to copy it from: new
// workers would start training over. The runner then starts none; the
// leavers leave at a committed step and the job ends with them.
func (j *Job) keepMinimum(ctx context.Context) {
	tick := time.NewTicker(minimumCheck)
	defer tick.Stop()
	short := false
	var told string
	for {
		select {
		case <-ctx.Done():
			return
		case <-j.driver.Finished():
			return
		case <-tick.C:
		}
		staying, holders, failed := j.staying()
		missing := j.cfg.MinWorkers - staying
		j.mu.Lock()
		replacing := j.replacing // replaceLost is starting some (rejoin.go)
		draining := j.draining   // LeaveAll
		j.mu.Unlock()
		if failed || missing <= 0 || replacing || draining {
			short = false
			continue
		}
		if holders == 0 {
			short = false
			msg := "every worker of the job's world is leaving or gone: no replacements (they would start training over); the job ends with the last committed step"
			if msg != told {
				told = msg
				j.notice(msg)
			}
			continue
		}
		if !short {
			short = true
			continue
		}
		err := j.AddWorkers(ctx, missing)
		var limit *LimitError
		switch {
		case err == nil:
			j.notice(fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d: started %d more", staying, j.cfg.MinWorkers, missing))
			short, told = false, ""
		case errors.Is(err, ErrEnded):
			return
		case errors.As(err, &limit) || errors.Is(err, ErrNoSlot):
			// Leaving workers still hold their slots: try again when they
			// have gone.
			if msg := err.Error(); msg != told {
				told = msg
				j.notice(fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d; no room for more yet (%v)", staying, j.cfg.MinWorkers, err))
			}
		default:
			j.notice(fmt.Sprintf("starting workers to restore the job's minimum of %d: %v", j.cfg.MinWorkers, err))
		}
	}
}

// staying counts the workers that stay in the job (keepMinimum), and of
// them the members of the current world, which hold the training state (all
// of them, before the first world: nobody has trained yet); and it says
// whether one of the job's processes failed.
func (j *Job) staying() (n, holders int, failed bool) {
	world := j.driver.Current()
	ws := j.driver.Workers()
	j.mu.Lock()
	defer j.mu.Unlock()
	n = j.running
	if len(world.Members) == 0 {
		holders = n
	}
	for _, w := range ws {
		p := j.matchLocked(w)
		switch {
		case p == nil && w.State != membership.StateLeaving:
			n++ // started by hand
		case p != nil && p.rec.State == Running && w.State == membership.StateLeaving:
			n--
		}
		staysAlive := w.State != membership.StateLeaving && (p == nil || p.rec.State == Running)
		if len(world.Members) > 0 && staysAlive && world.Rank(w.Name) >= 0 {
			holders++
		}
	}
	for _, p := range j.procs {
		if p != nil && p.rec.State == Failed {
			failed = true
		}
	}
	return n, holders, failed
}
