package job

import (
	"github.com/gorovod/gorovod/sync/epoch"
)

// followMembers is end-of-job rule 6 for one new world: a running process of
// the job whose member name prev had and w has not, while training is not
// over, was left out (declared failed while paused or cut off) — unless the
// runner stopped or removed it, or it was leaving on its own; a process whose
// new name w admits after that came back (Worker.Rejoin: a new name, the
// same launch index).
func (j *Job) followMembers(prev, w epoch.World) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.trainingOver {
		for _, m := range prev.Members {
			p := j.byName[m.Name]
			if w.Rank(m.Name) >= 0 || p == nil || p.rec.State != Running || p.stopped || p.removed || p.leaving[m.Name] || p.out {
				continue
			}
			p.out = true
			p.rec.Excluded++
		}
	}
	for _, m := range w.Members {
		p := j.byName[m.Name]
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

// reclassify applies rule 6 to a process that exited with status 0, with
// what the runner knows by then (called with j.mu held).
func (j *Job) reclassifyLocked(p *proc) {
	if p.rec.State != Finished {
		return
	}
	switch {
	case p.out:
		p.rec.State = Excluded
	case !p.everIn && j.trainingOver:
		p.rec.State = Stopped // told it would never be admitted: training was over
	}
}
