package timeline

import (
	"time"

	"github.com/gorovod/gorovod/collective"
)

type collectiveOp = collective.OpInfo

// CollectiveTracer returns a collective.Tracer that records every
// collective of the communicators it is set on (collective.Config.Tracer)
// on TrackCollectives: one complete event per collective, its phases nested
// inside. A nil Timeline gives a nil Tracer, which costs nothing.
func (t *Timeline) CollectiveTracer() collective.Tracer {
	if t == nil {
		return nil
	}
	return collectiveTracer{t}
}

type collectiveTracer struct{ t *Timeline }

// CollectiveStart records nothing: the complete event, written at the end,
// has the start time.
func (collectiveTracer) CollectiveStart(collective.OpInfo, time.Time) {}

func (ct collectiveTracer) CollectivePhase(op collective.OpInfo, ph collective.PhaseInfo) {
	ev := event{ph: 'X', kind: evPhase, track: TrackCollectives, cat: "phase",
		ts: ph.Start.UnixNano(), dur: ph.End.Sub(ph.Start).Nanoseconds(), op: op, phase: ph}
	ct.t.record(&ev)
}

func (ct collectiveTracer) CollectiveEnd(op collective.OpInfo, start, end time.Time, err error) {
	ev := event{ph: 'X', kind: evCollective, track: TrackCollectives, cat: "collective",
		ts: start.UnixNano(), dur: end.Sub(start).Nanoseconds(), op: op, err: err}
	ct.t.record(&ev)
}
