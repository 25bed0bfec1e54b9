package job

import (
	"context"
	"errors"
	"fmt"

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

// maxReplacementStrikes bounds the replacements that are lost before they
// ever enter a world, in a row: a host that kills every worker it gets must
// not make the runner start workers forever.
const maxReplacementStrikes = 3

// replaceLost is Config.ReplaceLost: while training is not over and no
// worker failed, a worker lost (killed, lost with its host, or stopped with
// a host the discovery dropped) is replaced on a free slot, as Horovod's
// elastic driver refills its slots, as long as the job has fewer than
// MinWorkers workers (hand-started ones count). A worker that exited by
// itself is not replaced.
func (j *Job) replaceLost() {
	have := j.count()
	if _, holders, _ := j.staying(); holders == 0 && len(j.driver.Current().Members) > 0 {
		// Nobody left holds the training state: replacements would train
		// over from the start (keepMinimum says so once).
		return
	}
	j.mu.Lock()
	need := min(j.cfg.MinWorkers-have, j.toReplace)
	if !j.cfg.ReplaceLost || need <= 0 || j.ended || j.trainingOver || j.draining || j.replacing || j.anyFailed ||
		j.strikes >= maxReplacementStrikes || j.workCtx.Err() != nil {
		j.mu.Unlock()
		return
	}
	j.replacing = true
	j.mu.Unlock()
	go func() {
		var err error
		for range need {
			if err = j.add(j.workCtx, 1, true); err != nil {
				break
			}
			j.mu.Lock()
			j.toReplace--
			j.mu.Unlock()
		}
		j.mu.Lock()
		j.replacing = false
		noSlot := errors.Is(err, ErrNoSlot) && !j.waitingForSlot
		j.waitingForSlot = errors.Is(err, ErrNoSlot)
		j.mu.Unlock()
		switch {
		case noSlot:
			j.notice(fmt.Sprintf("fewer than %d workers, and no free slot for a replacement: waiting for a host", j.cfg.MinWorkers))
		case err != nil && !errors.Is(err, ErrNoSlot) && !errors.Is(err, ErrEnded) && !errors.Is(err, context.Canceled):
			j.notice(fmt.Sprintf("starting a replacement: %v", err))
		}
	}()
}

// noteLossLocked counts a worker to replace (Config.ReplaceLost): one lost,
// or stopped with its host while training went on, that the engine did not
// take out. Called with j.mu held.
func (j *Job) noteLossLocked(p *proc) {
	if p.removed || j.trainingOver {
		return
	}
	if p.rec.State == Lost || p.rec.State == Stopped {
		j.toReplace++
	}
}

// countStrike notes a replacement lost before it entered any world (called
// with j.mu held); one that trained resets the count.
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
