package job

import (
	"cmp"
	"slices"

	"github.com/gorovod/gorovod/sync/epoch"
)

// presence is end-of-job rule 6 for one process: whether its members were
// in the job's worlds. A process left out of a world (declared failed while
// paused or cut off) comes back as a new member (sync's Worker.Rejoin: a new
// name, the same launch index); one that exits with status 0 while left out
// was excluded, not finished. It is a part of the process's proc, so the
// roster's mu guards it like the rest of the proc.
type presence struct {
	// leaving holds the member names it published as leaving: one or
	// two, so a slice (a map cost a job ~250 bytes per launched worker).
	leaving []string
	out     bool // left out of a world, not back yet
	everIn  bool // one of its names was a member of a world
}

// announceLeaving notes that its member name is leaving the job on its own.
func (s *presence) announceLeaving(name string) {
	if !slices.Contains(s.leaving, name) {
		s.leaving = append(s.leaving, name)
	}
}

// leftOut is a new world without name, one of its member names, while the
// process runs on and training is not over: it was left out unless it was
// leaving on its own or is out already. It reports whether that is a new
// exclusion.
func (s *presence) leftOut(name string) bool {
	if s.out || slices.Contains(s.leaving, name) {
		return false
	}
	s.out = true
	return true
}

// admitted is a new world with one of its names: it reports whether the
// process came back after it was left out.
func (s *presence) admitted() (back bool) {
	s.everIn = true
	back, s.out = s.out, false
	return back
}

// final is the state of a process that exited in state st, rule 6 applied:
// status 0 while left out is Excluded, and status 0 without ever being in a
// world once training was over (it was told it would never be admitted) is
// Stopped.
func (s *presence) final(st WorkerState, trainingOver bool) WorkerState {
	if st != Finished {
		return st
	}
	switch {
	case s.out:
		return Excluded
	case !s.everIn && trainingOver:
		return Stopped
	}
	return st
}

// followMembers is rule 6 for one new world: a running process of the job
// whose member name prev had and w has not, while training is not over, was
// left out — unless the runner stopped or removed it (presence.leftOut
// decides the rest); a process whose new name w admits after that came back.
func (r *roster) followMembers(prev, w epoch.World) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.standing.trainingOver {
		for _, m := range prev.Members {
			p := r.byName[m.Name]
			if w.Rank(m.Name) >= 0 || p == nil || p.rec.State != Running || p.stopped != NoStopReason || p.removed {
				continue
			}
			if p.leftOut(m.Name) {
				p.rec.Excluded++
			}
		}
	}
	for _, m := range w.Members {
		p := r.byName[m.Name]
		if prev.Rank(m.Name) >= 0 || p == nil {
			continue
		}
		if p.admitted() {
			p.rec.Rejoined++
		}
	}
}

// reclassifyLocked applies rule 6 to a process that has exited, with what
// the runner knows by then (called with r.mu held). One it makes Stopped
// was not needed any more: it was never admitted, training being over
// (unless the runner had stopped it for a reason of its own).
func (r *roster) reclassifyLocked(p *proc) {
	st := p.final(p.rec.State, r.standing.trainingOver)
	if st == Stopped && p.rec.State != Stopped {
		p.rec.StopReason = cmp.Or(p.stopped, StopNotNeeded)
	}
	p.rec.State = st
}
