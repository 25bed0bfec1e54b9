package job

import (
	"github.com/gorovod/gorovod/sync/epoch"
)

// presence is end-of-job rule 6 for one process: whether its members were
// in the job's worlds. A process left out of a world (declared failed while
// paused or cut off) comes back as a new member (sync's Worker.Rejoin: a new
// name, the same launch index); one that exits with status 0 while left out
// was excluded, not finished.
type presence struct {
	leaving map[string]bool // member names it published as leaving
	out     bool            // left out of a world, not back yet
	everIn  bool            // one of its names was a member of a world
}

// announceLeaving notes that its member name is leaving the job on its own.
func (s *presence) announceLeaving(name string) {
	if s.leaving == nil {
		s.leaving = map[string]bool{}
	}
	s.leaving[name] = true
}

// followMembers is rule 6 for one new world: a running process of the job
// whose member name prev had and w has not, while training is not over, was
// left out — unless the runner stopped or removed it, or it was leaving on
// its own; a process whose new name w admits after that came back.
func (r *roster) followMembers(prev, w epoch.World) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.trainingOver {
		for _, m := range prev.Members {
			p := r.byName[m.Name]
			if w.Rank(m.Name) >= 0 || p == nil || p.rec.State != Running || p.stopped || p.removed || p.leaving[m.Name] || p.out {
				continue
			}
			p.out = true
			p.rec.Excluded++
		}
	}
	for _, m := range w.Members {
		p := r.byName[m.Name]
		if prev.Rank(m.Name) >= 0 || p == nil {
			continue
		}
		p.everIn = true
		if p.out {
			p.out = false
			p.rec.Rejoined++
		}
	}
}

// reclassifyLocked applies rule 6 to a process that exited with status 0,
// with what the runner knows by then (called with r.mu held).
func (r *roster) reclassifyLocked(p *proc) {
	if p.rec.State != Finished {
		return
	}
	switch {
	case p.out:
		p.rec.State = Excluded
	case !p.everIn && r.trainingOver:
		p.rec.State = Stopped // told it would never be admitted: training was over
	}
}
