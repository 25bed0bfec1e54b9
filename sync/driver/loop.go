package driver

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// machine is a state machine of the epoch protocol: epoch.Proposer (the
// driver's) or epoch.Follower (a worker's).
type machine interface {
	Step(now time.Time, in epoch.Input) []epoch.Output
	Tick(now time.Time) []epoch.Output
	Deadline() time.Time
}

// loop runs a protocol state machine over a gossip member: it turns the
// member's events and control messages into the machine's inputs, arms one
// timer for the machine's deadline, and carries out its outputs (sends, each
// on its own goroutine, bounded by control.SendTimeout; failed ones go back in as
// inputs). Every call into the machine happens on the loop's goroutine; the
// loop does nothing between events, so a steady job costs it nothing but
// the re-announcements.
type loop struct {
	m    *membership.Member
	mach machine
	log  *slog.Logger
	// Hooks, called on the loop's goroutine.
	notify  func(epoch.Output)                    // every output but Send
	onEvent func(membership.Event)                // every membership event, before the machine sees it
	onStats func(worker string, b stats.Batch)    // step statistics (not the protocol's)
	onStall func(worker string, s stall.Snapshot) // stall inspector snapshots (not the protocol's)
	settled func()                                // after each input and tick, for snapshots
	// viewChanged: a membership event since the last settled call.
	viewChanged bool

	calls  chan call
	failed chan sendFailure
	// gone receives workers whose gossip port refused a connection (sweep);
	// swept is the newest failed world swept for them.
	gone  chan string
	swept uint64
	nodes map[string]membership.Node // the gossip view, by name: where sends go
	// lost are the members gossip declared dead, by name, with when: a
	// proposer probes such a worker before it removes it (a starved worker
	// misses gossip's probes), so its messages still go where it was. A
	// dead one refuses them at once (a failed send); a live one answers.
	lost   map[string]lostNode
	sends  stdsync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// call runs f on the loop's goroutine; sent is closed once the sends of the
// outputs f returns have completed (or failed).
type call struct {
	f    func(now time.Time) []epoch.Output
	sent chan struct{}
}

type lostNode struct {
	node membership.Node
	at   time.Time
}

// lostKeep: a member gossip declared dead is sent to for this long. A
// proposer sends to it only while it probes it (ProbeTimeout) and, when it
// answered, until gossip lists it again (it refutes its death at its next
// gossip round); the bound keeps a long job's lost members from piling up.
const lostKeep = 10 * time.Minute

type sendFailure struct {
	epoch.SendFailed
	err error
}

func newLoop(m *membership.Member, mach machine, log *slog.Logger) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	return &loop{
		m: m, mach: mach, log: log,
		notify: func(epoch.Output) {}, onEvent: func(membership.Event) {}, onStats: func(string, stats.Batch) {}, onStall: func(string, stall.Snapshot) {}, settled: func() {},
		calls: make(chan call, 64), failed: make(chan sendFailure, 64), gone: make(chan string, 64), nodes: map[string]membership.Node{}, lost: map[string]lostNode{},
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

func (l *loop) start() { go l.run() }

// stop ends the loop and waits for its sends.
func (l *loop) stop() {
	l.cancel()
	<-l.done
	l.sends.Wait()
}

// do runs f on the loop's goroutine and returns a channel closed once the
// sends it asked for are done; it is closed at once if the loop has stopped.
func (l *loop) do(f func(now time.Time) []epoch.Output) <-chan struct{} {
	c := call{f: f, sent: make(chan struct{})}
	select {
	case l.calls <- c:
	case <-l.done:
		close(c.sent)
	}
	return c.sent
}

// query runs f on the loop's goroutine and returns its result (the zero
// value if the loop has stopped).
func query[T any](ctx context.Context, l *loop, f func() T) (T, error) {
	var out T
	ran := make(chan struct{})
	sent := l.do(func(time.Time) []epoch.Output {
		out = f()
		close(ran)
		return nil
	})
	select {
	case <-sent:
	case <-ctx.Done():
		return out, ctx.Err()
	}
	select {
	case <-ran:
		return out, nil
	default:
		return out, errors.New("driver: stopped")
	}
}

func (l *loop) run() {
	defer close(l.done)
	events, messages := l.m.Events(), l.m.Messages()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var fire <-chan time.Time
		if d := l.mach.Deadline(); !d.IsZero() {
			timer.Reset(time.Until(d))
			fire = timer.C
		}
		select {
		case <-l.ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil // the member left; its last messages may still come
				continue
			}
			l.event(ev)
		case msg, ok := <-messages:
			if !ok {
				messages = nil
				continue
			}
			l.message(msg)
		case f := <-l.failed:
			l.sendFailed(f)
		case name := <-l.gone:
			l.refused(name)
		case c := <-l.calls:
			// Sends that failed before this call are the machine's first:
			// a call that asks about a report (Agent.Finish) must see that
			// its send failed.
			l.drainFailed()
			var wg stdsync.WaitGroup
			l.carry(c.f(time.Now()), &wg)
			go func() {
				wg.Wait()
				close(c.sent)
			}()
		case <-fire:
			l.carry(l.mach.Tick(time.Now()), nil)
		}
	}
}

// drainFailed hands the send failures queued so far to the machine.
func (l *loop) drainFailed() {
	for {
		select {
		case f := <-l.failed:
			l.sendFailed(f)
		default:
			return
		}
	}
}

func (l *loop) event(ev membership.Event) {
	n := ev.Node
	var in epoch.Input
	switch ev.Kind {
	case membership.EventJoined, membership.EventUpdated:
		l.nodes[n.Name] = n
		delete(l.lost, n.Name)
		in = epoch.PeerSeen{Peer: peerOf(n)}
	case membership.EventLeft, membership.EventFailed:
		delete(l.nodes, n.Name)
		if n.Meta.Role == membership.RoleWorker {
			l.log.Info("worker gone", "worker", n.Name, "how", ev.Kind)
		}
		in = epoch.PeerGone{Name: n.Name, Failed: ev.Kind == membership.EventFailed}
		delete(l.lost, n.Name)
		if ev.Kind == membership.EventFailed {
			// A worker's machine answers a proposer's ping that its own
			// gossip declared dead too (both sides of a starved process).
			l.keepLost(n, ev.At)
			if n.Meta.Role == membership.RoleWorker {
				l.lookGone(n)
			}
		}
	default:
		return
	}
	l.viewChanged = true
	l.onEvent(ev)
	if l.ctx.Err() != nil {
		return // stopped by the hook (a driver superseded): it proposes nothing more
	}
	l.carry(l.mach.Step(time.Now(), in), nil)
}

func (l *loop) message(msg membership.Message) {
	cm, err := control.Decode(msg.Payload)
	if err != nil {
		l.log.Warn("dropped control message", "from", msg.From.Name, "err", err)
		return
	}
	switch cm.Kind { // not the protocol's: the machine does not see them
	case control.KindStats:
		l.onStats(msg.From.Name, cm.StatsBatch())
		return
	case control.KindStall:
		s := *cm.Stall
		s.Worker = msg.From.Name
		l.onStall(msg.From.Name, s)
		return
	}
	pm, _ := cm.Protocol()
	l.carry(l.mach.Step(time.Now(), epoch.Received{From: msg.From.Name, Msg: pm}), nil)
}

// carry carries out a machine's outputs; wg, if set, counts the sends.
func (l *loop) carry(outs []epoch.Output, wg *stdsync.WaitGroup) {
	for _, o := range outs {
		if s, ok := o.(epoch.Send); ok {
			l.send(s, wg)
			continue
		}
		if s, ok := o.(epoch.Suspected); ok {
			l.sweep(s.Number)
		}
		if t, ok := o.(epoch.TookOver); ok {
			l.logTakeover(t)
		} else {
			logOutput(l.log, o)
		}
		l.notify(o)
	}
	l.settled()
}

func (l *loop) send(s epoch.Send, wg *stdsync.WaitGroup) {
	n, ok := l.nodes[s.To]
	if !ok {
		var lost lostNode
		lost, ok = l.lost[s.To]
		n = lost.node
	}
	if !ok {
		// Not in view (any more): as undeliverable as a refused connection.
		l.sendFailed(sendFailure{epoch.SendFailed{To: s.To, Msg: s.Msg}, errors.New("not in the membership view")})
		return
	}
	payload := control.Encode(s.Msg)
	if wg != nil {
		wg.Add(1)
	}
	l.sends.Go(func() {
		if wg != nil {
			defer wg.Done()
		}
		ctx, cancel := context.WithTimeout(l.ctx, control.SendTimeout)
		defer cancel()
		err := l.m.Send(ctx, n, payload)
		if err == nil || l.ctx.Err() != nil {
			return
		}
		select {
		case l.failed <- sendFailure{epoch.SendFailed{To: s.To, Msg: s.Msg}, err}:
		case <-l.ctx.Done():
		}
	})
}

// sweep looks, once per failed world, whether every other worker in view
// still listens (membership.Member.Reach). A collective that fails blames
// one peer, and the machine probes only that one; but a host that goes
// down takes all its workers with it, and the next world would include the
// others until gossip declared them dead (its probe and suspicion timeouts:
// most of a second), while the survivors dial them in vain. A worker whose
// gossip port refuses connections is gone now: it goes to the machine as a
// failed peer, as gossip would report it later.
func (l *loop) sweep(number uint64) {
	if number <= l.swept {
		return
	}
	l.swept = number
	var workers []membership.Node
	for _, n := range l.nodes {
		if n.Meta.Role == membership.RoleWorker {
			workers = append(workers, n)
		}
	}
	l.sends.Go(func() {
		l.m.WhenGone(l.ctx, workers, func(n membership.Node, _ error) {
			select {
			case l.gone <- n.Name:
			case <-l.ctx.Done():
			}
		})
	})
}

// lookGone looks whether a worker that gossip declared dead was killed
// (its gossip port refuses connections: its host is up, its process gone)
// or may be alive (a partition, a stalled process: no answer). Only a known
// death lets the survivors form a world without the quorum of the last
// one (epoch.CheckQuorum).
func (l *loop) lookGone(n membership.Node) {
	l.sends.Go(func() {
		l.m.WhenGone(l.ctx, []membership.Node{n}, func(n membership.Node, _ error) {
			select {
			case l.gone <- n.Name:
			case <-l.ctx.Done():
			}
		})
	})
}

// keepLost keeps where member n was, as gossip declared it dead (see lost),
// and forgets the members lost longer than lostKeep ago.
func (l *loop) keepLost(n membership.Node, at time.Time) {
	if at.IsZero() {
		at = time.Now()
	}
	for name, lost := range l.lost {
		if at.Sub(lost.at) > lostKeep {
			delete(l.lost, name)
		}
	}
	l.lost[n.Name] = lostNode{node: n, at: at}
}

// refused handles a worker whose gossip port refused a connection: its
// process is gone. It leaves the view, as a failed peer (gossip's own
// Failed event, when it comes, finds it gone already), and the machine
// learns that its death is known (epoch.Exited).
func (l *loop) refused(name string) {
	delete(l.lost, name)
	if n, ok := l.nodes[name]; ok {
		delete(l.nodes, name)
		l.log.Info("worker gone", "worker", name, "how", "its gossip port refuses connections")
		l.viewChanged = true
		l.onEvent(membership.Event{Kind: membership.EventFailed, Node: n, At: time.Now()})
	}
	l.carry(l.mach.Step(time.Now(), epoch.Exited{Name: name}), nil)
}

// sendFailed logs a failed send and tells the machine. A message to a member
// that is leaving or gone failing is the normal end of a departure: it is
// logged at debug level; only one to a member still in view as active is a
// warning.
func (l *loop) sendFailed(f sendFailure) {
	level := slog.LevelDebug
	if n, ok := l.nodes[f.To]; ok && n.Meta.State != membership.StateLeaving && f.Msg.Kind != epoch.MsgPing {
		level = slog.LevelWarn
	}
	l.log.Log(l.ctx, level, "could not send a control message", "to", f.To, "msg", f.Msg.Kind, "err", f.err)
	l.carry(l.mach.Step(time.Now(), f.SendFailed), nil)
}

// peerOf is a gossip member as the protocol sees it.
func peerOf(n membership.Node) epoch.Peer {
	state := epoch.Joining
	switch n.Meta.State {
	case membership.StateReady:
		state = epoch.Ready
	case membership.StateLeaving:
		state = epoch.Leaving
	}
	return epoch.Peer{Name: n.Name, Driver: n.Meta.Role == membership.RoleDriver, State: state,
		Addr: n.Meta.CollectiveAddr, StartedAt: n.Meta.StartedAt}
}

// ElectProposer names the member that proposes epochs: the newest driver while
// one is alive, else the oldest ready worker (see epoch.Elect). Every member
// computes the same answer from the same membership view.
func ElectProposer(nodes []membership.Node) string {
	peers := make([]epoch.Peer, len(nodes))
	for i, n := range nodes {
		peers[i] = peerOf(n)
	}
	return epoch.Elect(peers)
}

// logTakeover logs a takeover with the probe timeout of the proposer that
// took over: what a user tuning a loaded job (a worker's
// sync.WorkerConfig.ProbeTimeout, gorovod run --probe-timeout) needs to see.
func (l *loop) logTakeover(o epoch.TookOver) {
	var probeTimeout time.Duration
	switch m := l.mach.(type) {
	case *epoch.Proposer:
		probeTimeout = m.ProbeTimeout()
	case *epoch.Follower:
		if p := m.Proposer(); p != nil {
			probeTimeout = p.ProbeTimeout()
		}
	}
	if o.Adopted {
		l.log.Warn("took the job back: continuing from the newest world its workers know",
			"epoch", o.World.Number, "size", len(o.World.Members), "unheard", o.Unheard, "probe_timeout", probeTimeout)
		return
	}
	l.log.Warn("no driver: this worker, the oldest ready one, takes over proposing epochs",
		"from", o.World.Number, "unheard", o.Unheard, "probe_timeout", probeTimeout)
}

// logOutput logs a protocol decision.
func logOutput(log *slog.Logger, o epoch.Output) {
	switch o := o.(type) {
	case epoch.Proposed:
		log.Info("proposed", "epoch", o.World.Number, "size", len(o.World.Members))
	case epoch.Waiting:
		log.Info("waiting for enough workers to form a world", "have", o.Have, "min", o.Min)
	case epoch.NoQuorum:
		if o.Quorum.First {
			log.Warn("no quorum for the job's first world: too few of the workers it was started with are ready here; waiting for more, or for news that the others are gone (they may be alive on the other side of a partition)",
				"ready", o.Quorum.Present, "voters", o.Quorum.Voters, "driver", o.Quorum.Driver)
			return
		}
		log.Warn("no quorum: the next world would hold too few members of the last one; waiting for them, or for news that they are gone (they may be training on the other side of a partition)",
			"last", o.Base, "voters", o.Quorum.Voters, "present", o.Quorum.Present, "missing", o.Quorum.Missing, "driver", o.Quorum.Driver)
	case epoch.Removed:
		level := slog.LevelInfo
		if o.Why == epoch.ReasonUnanswered {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "removed from the next world", "worker", o.Name, "why", o.Why.String())
	case epoch.Suspected:
		log.Warn("collective failure reported", "by", o.By, "blamed", o.Name, "epoch", o.Number, "cause", o.Cause)
	case epoch.Cleared:
		log.Info("blamed worker is alive", "worker", o.Name)
	case epoch.Finished:
		log.Info("training finished", "worker", o.By, "epoch", o.Number)
	case epoch.Rescued:
		log.Warn("training finished, but workers of the last world failed its last step: they redo it without the finished ones",
			"epoch", o.Number, "finished", o.Finished)
	case epoch.SteppedDown:
		log.Info("no longer proposing epochs: a driver or an older worker is back")
	case epoch.Unroutable:
		log.Warn("no proposer in view to report to", "report", o.Msg.String())
	case epoch.Ignored:
		log.Warn("worker ignored", "worker", o.Name, "why", o.Why)
	case epoch.Refused:
		// A worker sends its failure report again until a newer epoch comes:
		// repeats are normal. Anything else refused is news.
		level := slog.LevelWarn
		if errors.Is(o.Err, epoch.ErrRepeated) {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "refused a control message", "from", o.From, "msg", o.Msg.String(), "err", o.Err)
	case epoch.Adopted:
		log.Debug("newer epoch", "epoch", o.World.Number, "size", len(o.World.Members))
	case epoch.OutForGood:
		log.Info("left out for good: the job will not admit this worker again", "epoch", o.Number)
	}
}

// workerInfos lists the workers in a view, sorted by name.
func workerInfos(nodes map[string]membership.Node) []WorkerInfo {
	out := make([]WorkerInfo, 0, len(nodes))
	for _, n := range nodes {
		if n.Meta.Role == membership.RoleWorker {
			out = append(out, workerInfo(n))
		}
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}
