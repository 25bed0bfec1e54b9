package epoch

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// FollowerConfig configures a Follower. A zero field means its default.
type FollowerConfig struct {
	// Self is the worker's member name. Required.
	Self string
	// TakeoverGrace is how long no driver must have been in view before the
	// worker, if it is the oldest ready one, proposes instead (default 2 s):
	// a worker that has just joined, or whose view briefly lacks the driver,
	// must not start a second proposer.
	TakeoverGrace time.Duration
	// MinorityGrace is how much longer than TakeoverGrace a worker that sees
	// only a minority of its newest world waits before it takes over
	// (default 10 s; see quorum): a short partition heals meanwhile without
	// a takeover. Once it has taken over, its proposer still proposes only a
	// world that holds the quorum (CheckQuorum): members known to be gone
	// (left, exited) do not count, so a job whose driver died with most of
	// its workers goes on when their deaths are known, and waits when they
	// may be alive behind a partition.
	MinorityGrace time.Duration
	// ReportEvery: a failure report is sent again this often until an epoch
	// newer than the failed one arrives (default 1 s).
	ReportEvery time.Duration
	// Proposer configures the proposer the worker runs when it takes over;
	// its Self is set to the worker's.
	Proposer ProposerConfig
}

// DefaultMinorityGrace is FollowerConfig.MinorityGrace's default.
const DefaultMinorityGrace = 10 * time.Second

// DefaultTakeoverGrace is FollowerConfig.TakeoverGrace's default.
const DefaultTakeoverGrace = 2 * time.Second

// Follower is a worker's side of the epoch protocol as a pure state machine,
// like Proposer (no I/O, no goroutines, no clock; not safe for concurrent
// use). It keeps the newest epoch announced to the worker (a number lower
// than or equal to the one it holds is old news: announcements may arrive
// late, twice, or out of order), answers liveness probes with that epoch,
// sends the worker's reports (a failed collective, the end of training) to
// the member that proposes, and elects: when no driver has been in its view
// for TakeoverGrace and the worker is the oldest ready one, it runs a
// Proposer itself (see Resume), continuing the numbering, until a driver or
// an older worker is back in view.
type Follower struct {
	cfg  FollowerConfig
	view map[string]Peer // the gossip cluster as this worker sees it, itself included
	// lead is Elect of the view and drivers the number of drivers in it,
	// kept as the view changes: a gossip event must not cost a pass over a
	// thousand-member view (every member gets every member's changes).
	lead       string
	drivers    int
	latest     World
	driverSeen time.Time // last time a driver was in view (start: creation)
	// driverEver: a driver was in view once. Then only a worker that sees a
	// majority of its newest world may take over (see quorum).
	driverEver bool
	electAt    time.Time // end of the takeover grace, when an election is due
	prop       *Proposer // non-nil while this worker proposes
	// pending is a failure report not yet answered by a newer epoch: it is
	// sent again every ReportEvery, as the network may lose it.
	pending  *Message
	resendAt time.Time
	// done is the end-of-training report while no proposer has it yet: no
	// proposer was in view (the driver briefly out of this worker's gossip
	// view, a load spike), or its send failed. It is routed again every
	// ReportEvery and as soon as a proposer comes into view: without it the
	// job would never learn that training is over (see DonePending).
	done       *Message
	doneAt     time.Time
	doneWarned bool // Unroutable was said for it once
	// outForGood: the proposer said this worker will not be admitted again.
	outForGood bool
	// departed are the workers known to be gone (left gracefully, or their
	// process exited): a proposer this worker starts does not count them
	// as voters of its quorum (CheckQuorum).
	departed map[string]bool
	out      []Output
}

// NewFollower returns the protocol state of worker cfg.Self, which knows no
// epoch yet, created at now (the takeover grace runs from then).
func NewFollower(cfg FollowerConfig, now time.Time) *Follower {
	cfg.TakeoverGrace = cmp.Or(cfg.TakeoverGrace, DefaultTakeoverGrace)
	cfg.ReportEvery = cmp.Or(cfg.ReportEvery, time.Second)
	cfg.MinorityGrace = cmp.Or(cfg.MinorityGrace, DefaultMinorityGrace)
	cfg.Proposer.Self = cfg.Self
	return &Follower{cfg: cfg, view: map[string]Peer{}, driverSeen: now, departed: map[string]bool{}}
}

// Latest is the newest epoch this worker has heard of.
func (f *Follower) Latest() World { return f.latest }

// Proposer is this worker's own proposer while it proposes, else nil. It is
// for reading (Current, Unfinished); feed inputs through the Follower.
func (f *Follower) Proposer() *Proposer { return f.prop }

// Lead is the member this worker sends its reports to: the driver while one
// is in view, else the oldest ready worker.
func (f *Follower) Lead() string { return f.lead }

// setPeer puts peer in the view, keeping lead and drivers.
func (f *Follower) setPeer(peer Peer) {
	old, had := f.view[peer.Name]
	f.view[peer.Name] = peer
	if had && old.Driver {
		f.drivers--
	}
	if peer.Driver {
		f.drivers++
	}
	candidate := peer.Driver || peer.State == Ready
	switch {
	case peer.Name == f.lead && (!candidate || old.StartedAt != peer.StartedAt || old.Driver != peer.Driver):
		f.lead = Elect(slices.Collect(maps.Values(f.view))) // the lead changed: any member may follow it
	case candidate && (f.lead == "" || before(peer, f.view[f.lead])):
		f.lead = peer.Name
	}
}

// dropPeer takes name out of the view, keeping lead and drivers.
func (f *Follower) dropPeer(name string) {
	old, had := f.view[name]
	if !had {
		return
	}
	delete(f.view, name)
	if old.Driver {
		f.drivers--
	}
	if name == f.lead {
		f.lead = Elect(slices.Collect(maps.Values(f.view)))
	}
}

// Step feeds the follower one input at time now and returns what to do.
func (f *Follower) Step(now time.Time, in Input) []Output {
	switch in := in.(type) {
	case PeerSeen:
		if in.Peer.Driver {
			f.driverSeen, f.driverEver = now, true
		}
		if in.Peer.State == Leaving {
			f.departed[in.Peer.Name] = true
		}
		f.setPeer(in.Peer)
		f.toProposer(now, in)
		f.elect(now)
		if f.done != nil && in.Peer.Driver {
			f.routeDone(now) // the driver is back in view
		}
	case PeerGone:
		if f.view[in.Name].Driver {
			f.driverSeen = now
		}
		if !in.Failed {
			f.departed[in.Name] = true
		}
		f.dropPeer(in.Name)
		f.toProposer(now, in)
		f.elect(now)
	case Exited:
		if f.view[in.Name].Driver {
			f.driverSeen = now
		}
		f.departed[in.Name] = true
		f.dropPeer(in.Name)
		f.toProposer(now, in)
		f.elect(now)
	case Received:
		switch in.Msg.Kind {
		case MsgEpoch:
			if err := f.checkAnnouncement(in.From, in.Msg.World.Number); err != nil {
				f.emit(Refused{From: in.From, Msg: in.Msg, Err: err})
				break
			}
			if in.Msg.Final && !f.outForGood && in.Msg.World.Rank(f.cfg.Self) < 0 {
				f.outForGood = true
				f.emit(OutForGood{Number: in.Msg.World.Number})
			}
			f.adopt(in.Msg.World)
			if in.From != f.cfg.Self {
				// The acknowledgement: the proposer stops re-sending this
				// epoch here (and learns of a newer one, if this worker knows it).
				f.emit(Send{To: in.From, Msg: Message{Kind: MsgPong, World: f.latest}})
			}
			f.toProposer(now, in)
		case MsgPing:
			f.emit(Send{To: in.From, Msg: Message{Kind: MsgPong, Nonce: in.Msg.Nonce, World: f.latest}})
		default:
			f.toProposer(now, in)
		}
	case SetMinWorkers:
		f.cfg.Proposer.MinWorkers = in.N
		f.toProposer(now, in)
	case SetFirstWorld:
		f.cfg.Proposer.FirstWorld = in.N
		f.toProposer(now, in)
	case SendFailed:
		if in.Msg.Kind == MsgDone && f.done == nil {
			// Not delivered: keep it, and try again (routeDone).
			msg := in.Msg
			f.done, f.doneAt = &msg, now.Add(f.cfg.ReportEvery)
		}
		f.toProposer(now, in)
	case Evict:
		f.toProposer(now, in)
	case ReportFailure:
		msg := Message{Kind: MsgFailure, Number: in.Number, Blamed: in.Blamed, Cause: in.Cause}
		if in.Number >= f.latest.Number {
			f.pending, f.resendAt = &msg, now.Add(f.cfg.ReportEvery)
		}
		f.route(now, msg)
	case ReportDone:
		f.done = &Message{Kind: MsgDone, Number: in.Number}
		f.routeDone(now)
	}
	return f.flush()
}

// Tick tells the follower that the time is now. Call it at Deadline.
func (f *Follower) Tick(now time.Time) []Output {
	if !f.electAt.IsZero() && !now.Before(f.electAt) {
		f.elect(now)
	}
	if f.pending != nil && !now.Before(f.resendAt) {
		f.resendAt = now.Add(f.cfg.ReportEvery)
		f.route(now, *f.pending)
	}
	if f.done != nil && !now.Before(f.doneAt) {
		f.routeDone(now)
	}
	if f.prop != nil {
		f.forward(f.prop.Tick(now))
	}
	return f.flush()
}

// Deadline is when Tick must next be called; the zero time when nothing is
// pending.
func (f *Follower) Deadline() time.Time {
	d := f.electAt
	if f.pending != nil && (d.IsZero() || f.resendAt.Before(d)) {
		d = f.resendAt
	}
	if f.done != nil && (d.IsZero() || f.doneAt.Before(d)) {
		d = f.doneAt
	}
	if f.prop != nil {
		if pd := f.prop.Deadline(); !pd.IsZero() && (d.IsZero() || pd.Before(d)) {
			d = pd
		}
	}
	return d
}

func (f *Follower) emit(o Output) { f.out = append(f.out, o) }

func (f *Follower) flush() []Output {
	out := f.out
	f.out = nil
	return out
}

// checkAnnouncement refuses an epoch numbered n from member from unless from
// may be proposing: the member this worker elects (the newest driver in
// view: an older driver back in view, which steps down as soon as it sees
// the newer one, is not followed meanwhile), or a worker in view that is a
// member of the newest world known here (a worker that took over while this
// one's view still elects another). A worker that
// knows no world yet takes its first only from a driver or the member it
// elects. The number must be at most MaxNumber and, once this worker knows
// a world, at most MaxLead above it; a worker that knows none takes any
// number up to MaxNumber from the proposer (the job's numbering may be far
// along when it joins).
func (f *Follower) checkAnnouncement(from string, n uint64) error {
	known := f.latest.Number
	if known == 0 {
		known = MaxNumber
	}
	if err := checkNumber(n, known); err != nil {
		return err
	}
	_, inView := f.view[from]
	switch {
	case from == f.Lead():
		return nil
	case inView && f.latest.Rank(from) >= 0:
		return nil
	}
	return ErrNotProposer
}

// adopt keeps w if it is newer than the newest epoch known here.
func (f *Follower) adopt(w World) {
	if w.Number > f.latest.Number {
		if f.pending != nil && w.Number > f.pending.Number {
			f.pending = nil
		}
		f.latest = cloneWorld(w)
		f.emit(Adopted{World: f.latest})
	}
}

func (f *Follower) toProposer(now time.Time, in Input) {
	if f.prop != nil {
		f.forward(f.prop.Step(now, in))
	}
}

// forward passes the own proposer's outputs on; what it sends to this worker
// is delivered here.
func (f *Follower) forward(outs []Output) {
	for _, o := range outs {
		if s, ok := o.(Send); ok && s.To == f.cfg.Self {
			if s.Msg.Kind == MsgEpoch {
				f.adopt(s.Msg.World)
			}
			continue
		}
		f.emit(o)
	}
}

// route sends a report to the member that proposes.
func (f *Follower) route(now time.Time, msg Message) {
	switch lead := f.Lead(); {
	case lead == f.cfg.Self && f.prop != nil:
		f.forward(f.prop.Step(now, Received{From: f.cfg.Self, Msg: msg}))
	case lead == "" || lead == f.cfg.Self:
		f.emit(Unroutable{Msg: msg})
	default:
		f.emit(Send{To: lead, Msg: msg})
	}
}

// DonePending reports whether the end-of-training report (ReportDone) has not
// been handed to a proposer yet: none was in view, or its send failed. A
// worker that leaves before it is handed over leaves the job unaware that
// training is over.
func (f *Follower) DonePending() bool { return f.done != nil }

// routeDone hands the end-of-training report to the member that proposes, or
// keeps it for later when none is in view.
func (f *Follower) routeDone(now time.Time) {
	msg := *f.done
	switch lead := f.Lead(); {
	case lead == f.cfg.Self && f.prop != nil:
		f.done = nil
		f.forward(f.prop.Step(now, Received{From: f.cfg.Self, Msg: msg}))
	case lead == "" || lead == f.cfg.Self:
		f.doneAt = now.Add(f.cfg.ReportEvery)
		if !f.doneWarned {
			f.doneWarned = true
			f.emit(Unroutable{Msg: msg})
		}
	default:
		f.done = nil // a failed send comes back as SendFailed
		f.emit(Send{To: lead, Msg: msg})
	}
}

// elect starts or stops this worker's own proposer: a job proposes through
// its driver while one is alive, else through its oldest ready worker, but
// only once no driver has been in view for the takeover grace.
func (f *Follower) elect(now time.Time) {
	lead := f.lead
	f.electAt = time.Time{}
	if f.drivers > 0 {
		f.driverSeen = now
	} else if graceEnd := f.driverSeen.Add(f.cfg.TakeoverGrace); now.Before(graceEnd) {
		if lead == f.cfg.Self {
			f.electAt = graceEnd
		}
		lead = "" // give a driver time to appear (or to be declared gone)
	} else if minorityEnd := graceEnd.Add(f.cfg.MinorityGrace); lead == f.cfg.Self && f.driverEver && now.Before(minorityEnd) && !f.quorum() {
		f.electAt = minorityEnd
		lead = "" // cut off from the driver with a minority: give the network time to heal
	}
	switch {
	case lead == f.cfg.Self && f.prop == nil:
		var outs []Output
		f.prop, outs = Resume(f.cfg.Proposer, now, f.latest, f.peers())
		for name := range f.departed {
			f.prop.departed[name] = true
		}
		f.forward(outs)
	case lead != f.cfg.Self && f.prop != nil:
		f.prop = nil
		f.emit(SteppedDown{})
	}
}

// quorum reports whether this worker sees a strict majority of the members
// of its newest world, itself included. A worker cut off from the driver by
// a partition together with a minority of the world must not propose: the
// driver, on the other side, goes on with the majority, and two worlds
// would train apart (split brain). It waits MinorityGrace instead; if the
// network heals meanwhile it learns the majority's epoch and comes back as
// a new member. (A job whose driver died keeps most of its workers in view,
// and one of them takes over at once; one whose driver died with most of
// its workers takes over after MinorityGrace, and its proposer goes on only
// if those workers are known to be gone: see CheckQuorum.) Before the
// job's first world has reached this worker, its newest world is the job's
// first workers (Proposer.FirstWorld, CheckFirstQuorum): it needs a strict
// majority of them ready in its view; with that number not known, it takes
// over after the takeover grace alone.
func (f *Follower) quorum() bool {
	if len(f.latest.Members) == 0 {
		ready := 0
		for _, p := range f.view {
			if !p.Driver && (p.State == Ready || p.Name == f.cfg.Self) {
				ready++
			}
		}
		if _, inView := f.view[f.cfg.Self]; !inView {
			ready++
		}
		return f.cfg.Proposer.FirstWorld == 0 || 2*ready > f.cfg.Proposer.FirstWorld
	}
	seen := 0
	for _, m := range f.latest.Members {
		if _, ok := f.view[m.Name]; ok || m.Name == f.cfg.Self {
			seen++
		}
	}
	return 2*seen > len(f.latest.Members)
}

// peers lists the view, sorted by name (a deterministic order).
func (f *Follower) peers() []Peer {
	out := make([]Peer, 0, len(f.view))
	for _, name := range slices.Sorted(maps.Keys(f.view)) {
		out = append(out, f.view[name])
	}
	return out
}
