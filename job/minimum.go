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

// floor is the runner's floor under an elastic job, the one place that
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
// three replacements in a row were lost (or stopped as unresponsive:
// unresponsive.go) before they joined a world. In the first and the last
// case a job below its minimum could then never form a world again: its
// other workers would wait for one forever, so the floor ends the job
// (giveUp: its running processes are stopped and count as Stopped, for
// StopStranded), once the shortage has been seen on two ticks in a row. And it
// starts none while nobody holds the training state: replacements copy it
// from a member of the current world that stays, and when every member is
// leaving or gone (a whole job preempted, every worker told to go at once)
// new workers would start training over; the leavers then leave at a
// committed step and the job ends with them.
type floor struct {
	min         int  // Config.MinWorkers
	replaceLost bool // Config.ReplaceLost
	roster      *roster
	driver      Driver
	events      *eventStream
	// grow starts one replacement worker within Config.MaxWorkers (a
	// *LimitError, ErrNoSlot or ErrEnded when it cannot).
	grow func(ctx context.Context) error
	// giveUp stops every running process of the job, which can no longer
	// reach its minimum (a worker failed, or replacements struck out).
	giveUp func()
	poke   chan struct{} // run looks at once

	// Under roster.mu, updated as processes exit (noteExitLocked).
	anyFailed bool // a worker failed: the job fails, nothing is replaced
	strikes   int  // replacements lost before they entered a world, in a row
	toReplace int  // workers lost and not replaced yet (Config.ReplaceLost)
}

// run keeps the floor until ctx ends, training is over or the job has
// ended: it looks at every minimumCheck and whenever poked.
func (f *floor) run(ctx context.Context) {
	tick := time.NewTicker(minimumCheck)
	defer tick.Stop()
	var s floorState
	for {
		confirmed := false
		select {
		case <-ctx.Done():
			return
		case <-f.driver.Finished():
			return
		case <-f.poke:
		case <-tick.C:
			confirmed = true
		}
		if !f.restore(ctx, &s, confirmed) {
			return
		}
	}
}

// floorState is what run remembers between looks.
type floorState struct {
	short  bool   // the previous tick saw a shortage
	told   string // the last notice about the shortage (said once)
	gaveUp bool   // stranded ended the job
}

// wake has run look at once (a worker exited, hosts changed).
func (f *floor) wake() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// restore is one look of run; tick says it is a tick's (a shortage seen on
// two ticks in a row is confirmed). It returns false once the job has
// ended.
func (f *floor) restore(ctx context.Context, s *floorState, tick bool) bool {
	staying, holders, failed := f.staying()
	missing := f.min - staying
	r := f.roster
	r.mu.Lock()
	over := r.standing.draining || r.standing.trainingOver || r.standing.ended || ctx.Err() != nil
	failed = failed || f.anyFailed
	struck := f.strikes >= maxReplacementStrikes
	lost := 0
	if f.replaceLost {
		lost = min(missing, f.toReplace)
	}
	r.mu.Unlock()
	if !over && missing > 0 && (failed || struck) {
		f.stranded(s, tick, staying, failed)
		return true
	}
	if over || missing <= 0 { // (short after a failure or strikes: stranded, above)
		s.short = false
		return true
	}
	if holders == 0 {
		s.short = false
		s.say(f.events, "every worker of the job's world is leaving or gone: no replacements (they would start training over); the job ends with the last committed step")
		return true
	}
	n := lost
	if n == 0 {
		if !s.confirmed(tick) {
			return true
		}
		n = missing
	}
	started, err := f.replace(ctx, n)
	if started > 0 {
		f.events.notice(fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d: started %d more", staying, f.min, started))
		s.short, s.told = false, ""
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
		s.say(f.events, fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d; no room for more yet (%v)", staying, f.min, err))
	default:
		s.say(f.events, fmt.Sprintf("starting workers to restore the job's minimum of %d: %v", f.min, err))
	}
	return true
}

// stranded is a job below its minimum that the floor will not restore (a
// worker failed, or three replacements in a row were lost): confirmed on two
// ticks in a row (a worker that finished training may exit just before the
// driver learns that training is over), it ends the job once, saying why.
func (f *floor) stranded(s *floorState, tick bool, staying int, failed bool) {
	if s.gaveUp || !s.confirmed(tick) {
		return
	}
	s.gaveUp = true
	why := "a worker failed, and failed workers are not replaced"
	if !failed {
		why = fmt.Sprintf("%d replacements in a row were lost before they joined (killed, or stopped as unresponsive)", maxReplacementStrikes)
	}
	f.events.notice(fmt.Sprintf("%d workers staying in the job, fewer than its minimum %d, and %s: no world can form, so the job ends (stopping its other workers)", staying, f.min, why))
	f.giveUp()
}

// confirmed reports whether a shortage is seen on the second tick in a row
// (a look that is not a tick's confirms nothing); the first tick marks it.
func (s *floorState) confirmed(tick bool) bool {
	if !tick {
		return false
	}
	if !s.short {
		s.short = true
		return false
	}
	return true
}

// say gives a notice about the shortage once.
func (s *floorState) say(events *eventStream, msg string) {
	if msg != s.told {
		s.told = msg
		events.notice(msg)
	}
}

// replace launches up to n replacement workers within MaxWorkers, and says
// how many it started.
func (f *floor) replace(ctx context.Context, n int) (started int, err error) {
	for range n {
		if err := f.grow(ctx); err != nil {
			return started, err
		}
		started++
		f.roster.mu.Lock()
		f.toReplace = max(0, f.toReplace-1)
		f.roster.mu.Unlock()
	}
	return started, nil
}

// noteExitLocked is the floor's account of a process that has exited
// (called with roster.mu held): a failure stops the floor, a replacement
// lost, or stopped as unresponsive, before it entered any world is a strike
// (one that trained resets the count), and a worker lost, or stopped with
// its host, while training went on and that the engine did not take out is
// one to replace at once (Config.ReplaceLost).
func (f *floor) noteExitLocked(p *proc) {
	f.anyFailed = f.anyFailed || p.rec.State == Failed
	switch {
	case !p.replacement:
	case p.everIn:
		f.strikes = 0
	case p.rec.State == Lost || p.stopped == StopUnresponsive:
		if f.strikes++; f.strikes == maxReplacementStrikes {
			go f.events.notice(fmt.Sprintf("%d replacements in a row were lost before they joined: no more replacements", f.strikes))
		}
	}
	if p.removed || f.roster.standing.trainingOver {
		return
	}
	if p.rec.State == Lost || p.rec.State == Stopped || p.rec.State == Unknown {
		f.toReplace++
	}
}

// staying counts the workers that stay in the job, and of them the members
// of the current world, which hold the training state (all of them, before
// the first world: nobody has trained yet); and it says whether one of the
// job's processes failed.
func (f *floor) staying() (n, holders int, failed bool) {
	world := f.driver.Current()
	ws := f.driver.Workers()
	r := f.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	n = r.standing.running
	if len(world.Members) == 0 {
		holders = n
	}
	for _, w := range ws {
		p, ours := r.matchLocked(w)
		switch {
		case !ours && w.State != membership.StateLeaving:
			n++ // started by hand
		case p != nil && p.rec.State == Running && w.State == membership.StateLeaving:
			n--
		}
		// A process of the job whose record was dropped has exited.
		staysAlive := w.State != membership.StateLeaving && (!ours || p != nil && p.rec.State == Running)
		if len(world.Members) > 0 && staysAlive && world.Rank(w.Name) >= 0 {
			holders++
		}
	}
	failed = r.earlier.Failed > 0
	for _, p := range r.procs {
		if p.rec.State == Failed {
			failed = true
		}
	}
	return n, holders, failed
}
