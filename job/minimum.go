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

// maxReplacementStrikes bounds the replacements that are lost before they
// ever enter a world, in a row: a host that kills every worker it gets must
// not make the runner start workers forever.
const maxReplacementStrikes = 3

// keepMinimum is the runner's floor under an elastic job, the one place that
// starts workers to keep it at Config.MinWorkers, whatever took it below:
// workers lost (killed, lost with their host, stopped with a host the
// Discovery dropped), leaving (a SIGTERM storm, preempted pods, steps
// cancelled by Slurm) or excluded and gone. The driver proposes no world with
// fewer than MinWorkers members and the autoscaling engine acts on worlds
// only, so without the floor such a job would wait for more forever.
//
// The count is of the workers staying in the job (staying): its running
// processes less those whose members announced that they are leaving, plus
// members started by hand that are not leaving. When they are fewer than
// MinWorkers while training goes on, the runner launches the difference
// (within MaxWorkers and the hosts' slots; when those are full it tries again
// as processes exit and hosts appear). What differs by cause is only how
// sure the runner must be:
//
//   - a lost worker (Config.ReplaceLost) is replaced at once, when its
//     process exits: a killed process is not a worker finishing training;
//   - any other shortage must be seen twice in a row, minimumCheck apart: a
//     worker that finished training may exit just before the driver learns
//     that training is over.
//
// It starts none once training is over, once a worker failed (the job has
// failed: rule 5), once every worker was asked to leave (LeaveAll), or once
// three replacements in a row were lost before they joined a world. And it
// starts none while nobody holds the training state: replacements copy it
// from a member of the current world that stays, and when every member is
// leaving or gone (a whole job preempted, every worker told to go at once)
// new workers would start training over; the leavers then leave at a
// committed step and the job ends with them.
func (j *Job) keepMinimum(ctx context.Context) {
	tick := time.NewTicker(minimumCheck)
	defer tick.Stop()
	var f floorState
	for {
		confirmed := false
		select {
		case <-ctx.Done():
			return
		case <-j.driver.Finished():
			return
		case <-j.floorPoke:
		case <-tick.C:
			confirmed = true
		}
		if !j.restoreMinimum(ctx, &f, confirmed) {
			return
		}
	}
}

// floorState is what keepMinimum remembers between looks.
type floorState struct {
	short bool   // the previous tick saw a shortage
	told  string // the last notice about the shortage (said once)
}

// pokeFloor has keepMinimum look at once (a worker exited, hosts changed).
func (j *Job) pokeFloor() {
	select {
	case j.floorPoke <- struct{}{}:
	default:
	}
}

// restoreMinimum is one look of keepMinimum; tick says it is a tick's (a
// shortage seen on two ticks in a row is confirmed). It returns false once
// the job has ended.
func (j *Job) restoreMinimum(ctx context.Context, f *floorState, tick bool) bool {
	staying, holders, failed := j.staying()
	missing := j.cfg.MinWorkers - staying
	j.mu.Lock()
	stop := failed || j.anyFailed || j.draining || j.trainingOver || j.ended || ctx.Err() != nil
	struck := j.strikes >= maxReplacementStrikes
	lost := 0
	if j.cfg.ReplaceLost {
		lost = min(missing, j.toReplace)
	}
	j.mu.Unlock()
	if stop || missing <= 0 || struck {
		f.short = false
		return true
	}
	if holders == 0 {
		f.short = false
		f.say(j, "every worker of the job's world is leaving or gone: no replacements (they would start training over); the job ends with the last committed step")
		return true
	}
	n := lost
	if n == 0 {
		if !tick {
			return true
		}
		if !f.short {
			f.short = true
			return true
		}
		n = missing
	}
	started, err := j.replace(ctx, n)
	if started > 0 {
		j.notice(fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d: started %d more", staying, j.cfg.MinWorkers, started))
		f.short, f.told = false, ""
	}
	var limit *LimitError
	switch {
	case err == nil:
	case errors.Is(err, ErrEnded):
		return false
	case errors.Is(err, context.Canceled):
	case errors.As(err, &limit) || errors.Is(err, ErrNoSlot):
		// Leaving workers still hold their slots, or a host is gone: try
		// again when they have gone, or a host comes.
		f.say(j, fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d; no room for more yet (%v)", staying, j.cfg.MinWorkers, err))
	default:
		f.say(j, fmt.Sprintf("starting workers to restore the job's minimum of %d: %v", j.cfg.MinWorkers, err))
	}
	return true
}

// say gives a notice about the shortage once.
func (f *floorState) say(j *Job, msg string) {
	if msg != f.told {
		f.told = msg
		j.notice(msg)
	}
}

// replace launches up to n replacement workers within MaxWorkers, and says
// how many it started.
func (j *Job) replace(ctx context.Context, n int) (started int, err error) {
	for range n {
		if err := j.roomFor(1); err != nil {
			return started, err
		}
		if err := j.add(ctx, 1, startedByFloor); err != nil {
			return started, err
		}
		started++
		j.mu.Lock()
		j.toReplace = max(0, j.toReplace-1)
		j.mu.Unlock()
	}
	return started, nil
}

// noteLossLocked counts a worker to replace at once (Config.ReplaceLost):
// one lost, or stopped with its host while training went on, that the
// engine did not take out. Called with j.mu held.
func (j *Job) noteLossLocked(p *proc) {
	if p.removed || j.trainingOver {
		return
	}
	if p.rec.State == Lost || p.rec.State == Stopped {
		j.toReplace++
	}
}

// countStrikeLocked notes a replacement lost before it entered any world
// (called with j.mu held); one that trained resets the count.
func (j *Job) countStrikeLocked(p *proc) {
	switch {
	case !p.replacement:
	case p.everIn:
		j.strikes = 0
	case p.rec.State == Lost:
		if j.strikes++; j.strikes == maxReplacementStrikes {
			go j.notice(fmt.Sprintf("%d replacements in a row were lost before they joined: no more replacements", j.strikes))
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
