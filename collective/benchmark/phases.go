package benchmark

import (
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective"
)

// PhaseTimes is a collective.Tracer that adds up, per message size, how long
// each phase of this rank's collectives took, so that a benchmark can say
// where the time of an algorithm of several phases goes (the hierarchical
// allreduce's local and cross-host phases). Install it as the communicator's
// Config.Tracer and read it with Take after each size.
type PhaseTimes struct {
	mu    sync.Mutex
	sizes map[int64]*phaseSums
}

type phaseSums struct {
	ops   int
	total time.Duration
	phase map[string]time.Duration
}

// NewPhaseTimes returns an empty PhaseTimes.
func NewPhaseTimes() *PhaseTimes { return &PhaseTimes{sizes: map[int64]*phaseSums{}} }

func (t *PhaseTimes) sums(bytes int64) *phaseSums {
	s := t.sizes[bytes]
	if s == nil {
		s = &phaseSums{phase: map[string]time.Duration{}}
		t.sizes[bytes] = s
	}
	return s
}

// CollectiveStart implements collective.Tracer.
func (t *PhaseTimes) CollectiveStart(collective.OpInfo, time.Time) {}

// CollectivePhase implements collective.Tracer.
func (t *PhaseTimes) CollectivePhase(op collective.OpInfo, ph collective.PhaseInfo) {
	t.mu.Lock()
	t.sums(op.Bytes).phase[ph.Phase.String()] += ph.End.Sub(ph.Start)
	t.mu.Unlock()
}

// CollectiveEnd implements collective.Tracer.
func (t *PhaseTimes) CollectiveEnd(op collective.OpInfo, start, end time.Time, err error) {
	if err != nil {
		return
	}
	t.mu.Lock()
	s := t.sums(op.Bytes)
	s.ops++
	s.total += end.Sub(start)
	t.mu.Unlock()
}

// Take returns, and forgets, the mean time in microseconds per collective of
// bytes bytes of each phase ("total": the whole collective), over every
// such collective since the last Take; nil when none ran or none reported
// phases. Phases that overlap add up to more than the total.
func (t *PhaseTimes) Take(bytes int) map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sizes[int64(bytes)]
	delete(t.sizes, int64(bytes))
	if s == nil || s.ops == 0 || len(s.phase) == 0 {
		return nil
	}
	out := map[string]float64{"total": float64(s.total.Microseconds()) / float64(s.ops)}
	for name, d := range s.phase {
		out[name] = float64(d.Microseconds()) / float64(s.ops)
	}
	return out
}
