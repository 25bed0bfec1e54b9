package epoch_test

import (
	"container/heap"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/epoch"
)

// The simulation runs the protocol's real state machines — a driver's
// Proposer and each worker's Follower — over an in-memory network and gossip
// layer on a virtual clock, with a model of each worker's session around
// them: a worker adopts only higher epoch numbers, a joiner waits for an
// epoch that includes it, a member moves to a newer epoch at a step
// boundary, leaves when one excludes it, and reports a collective that
// failed because a member of its world is dead, frozen or gone. Everything is
// driven by one seeded random source and an event queue ordered by time then
// by insertion, so a seed replays exactly.
//
// The network can drop, duplicate, delay (and so reorder) every message
// except the end-of-training report (see netConfig). Gossip delivers each
// member's changes to every other member after a random delay, in order per
// member, and declares a crashed or frozen member dead after a random
// detection delay, as memberlist does.

// netConfig is the simulated network's misbehaviour.
type netConfig struct {
	loss, dup          float64 // probability that a message is dropped, duplicated
	delayMin, delayMax time.Duration
	// drop, if set, drops the messages it returns true for (scripted
	// losses in the scenario tests), besides the random ones.
	drop func(from, to string, m epoch.Message) bool
	// wire: messages go through the real wire format (control.Encode and
	// Decode), as they do between processes.
	wire bool
}

// gossipConfig is the simulated membership layer.
type gossipConfig struct {
	delayMin, delayMax   time.Duration // spreading a member's change to another
	detectMin, detectMax time.Duration // declaring a crashed or frozen member dead
}

// workerModel is the simulated trainers' behaviour.
type workerModel struct {
	startup      time.Duration // from joining gossip to ready
	stepMin      time.Duration // a step's duration, min and max
	stepMax      time.Duration
	ioTimeoutMin time.Duration // noticing a dead or frozen peer in a collective
	ioTimeoutMax time.Duration
	falseBlame   float64 // probability that a failed collective blames a live member
}

type simConfig struct {
	seed       uint64
	net        netConfig
	gossip     gossipConfig
	work       workerModel
	minWorkers int
	coalesce   time.Duration
}

func defaultSimConfig(seed uint64) simConfig {
	return simConfig{
		seed:   seed,
		net:    netConfig{delayMin: 100 * time.Microsecond, delayMax: 2 * time.Millisecond},
		gossip: gossipConfig{delayMin: 5 * time.Millisecond, delayMax: 150 * time.Millisecond, detectMin: 500 * time.Millisecond, detectMax: 1500 * time.Millisecond},
		work: workerModel{startup: 50 * time.Millisecond, stepMin: 20 * time.Millisecond, stepMax: 100 * time.Millisecond,
			ioTimeoutMin: 20 * time.Millisecond, ioTimeoutMax: 300 * time.Millisecond},
		minWorkers: 1,
		coalesce:   10 * time.Millisecond,
	}
}

type machine interface {
	Step(time.Time, epoch.Input) []epoch.Output
	Tick(time.Time) []epoch.Output
	Deadline() time.Time
}

type simNode struct {
	name    string
	peer    epoch.Peer // its metadata as it publishes it
	m       machine
	prop    *epoch.Proposer // the driver's
	fol     *epoch.Follower // a worker's
	crashed bool            // stopped for good (kill -9): nothing more happens here
	gone    bool            // left the cluster gracefully
	frozen  bool            // SIGSTOP: inputs wait for the thaw
	held    []func()        // what arrived while frozen
	timer   uint64          // generation of the pending Tick event
	timerAt time.Time
	// gossip: when this observer last got a change of each member, so
	// changes of one member arrive in order
	heard map[string]time.Time
	// the session model (workers)
	adopted     []uint64
	using       epoch.World
	entered     []epoch.World
	stalled     bool // a collective failed; waiting for a newer epoch
	stepping    bool // a step event is scheduled
	excluded    bool
	finished    bool
	failedLast  bool // its last step failed (the rescue's case)
	evicted     bool
	everEntered bool
	// synced: it holds the job's state (a world it entered completed: the
	// state went from the world's root to every member). A joiner's state is
	// its own initial one until then.
	synced bool
	// outForGood: the proposer said it will not be admitted again.
	outForGood bool
}

func (n *simNode) alive() bool { return !n.crashed && !n.gone }

type simEvent struct {
	at  time.Time
	seq uint64
	fn  func()
}

type eventQueue []simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type sim struct {
	t     testing.TB
	cfg   simConfig
	rng   *rand.Rand
	now   time.Time
	seq   uint64
	queue eventQueue
	nodes []*simNode
	byN   map[string]*simNode
	// every epoch proposed, by number, and by whom; and every epoch that
	// reached a worker
	proposed   map[uint64]epoch.World
	proposedBy map[uint64]string
	delivered  map[uint64]epoch.World
	holders    map[uint64]map[string]bool // who received each delivered epoch
	evictedBy  map[string]string          // evicted worker → the proposer that evicted it
	ending     bool                       // training is over: members finish at their next step
	failLast   map[string]bool            // members whose last step fails (the rescue)
	trace      []string
	failed     bool
	messages   int
	randomized bool // a TestRandomized job: a failure says how to replay it
	// onProposed, if set, is called with every proposal (a scenario's hook).
	onProposed func(n *simNode, w epoch.World)
	// onEntered, if set, is called when a worker enters a world.
	onEntered func(n *simNode, w epoch.World)
	// completed: the worlds every member entered (their state broadcast
	// ran), by number.
	completed map[uint64]bool
	// rankZeroRoot models a session that always takes a world's state from
	// rank 0 (as sessions did before the state root was agreed), to show
	// what that breaks.
	rankZeroRoot bool
	// noRejoin models workers that leave for good when left out of a world
	// (as before they came back as new members).
	noRejoin bool
	// evictedAt: the driver's newest epoch number when it evicted a worker.
	evictedAt map[string]uint64
	rejoins   int
}

func newSim(t testing.TB, cfg simConfig) *sim {
	return &sim{
		t: t, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.seed, 0x9e3779b97f4a7c15)),
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), byN: map[string]*simNode{},
		proposed: map[uint64]epoch.World{}, proposedBy: map[uint64]string{}, delivered: map[uint64]epoch.World{},
		holders:   map[uint64]map[string]bool{},
		evictedBy: map[string]string{},
		failLast:  map[string]bool{},
		completed: map[uint64]bool{},
		evictedAt: map[string]uint64{},
	}
}

// logf records a line of the trace printed when a check fails.
func (s *sim) logf(format string, args ...any) {
	const keep = 600
	if len(s.trace) >= 2*keep {
		s.trace = slices.Delete(s.trace, 0, keep)
	}
	s.trace = append(s.trace, fmt.Sprintf("%9.3fs ", s.elapsed().Seconds())+fmt.Sprintf(format, args...))
}

func (s *sim) elapsed() time.Duration {
	return s.now.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// fail reports a broken invariant with the seed and the recent trace.
func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	if !s.failed {
		s.failed = true
		replay := ""
		if s.randomized {
			replay = fmt.Sprintf("\nreplay: go test ./sync/epoch -run 'TestRandomized' -epoch.seed=%d -v", s.cfg.seed)
		}
		s.t.Errorf("seed %d, at %v: %s%s\ntrace (latest last):\n%s",
			s.cfg.seed, s.elapsed(), fmt.Sprintf(format, args...), replay, strings.Join(s.trace, "\n"))
	}
}

func (s *sim) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)))
}

func (s *sim) at(t time.Time, fn func()) {
	s.seq++
	heap.Push(&s.queue, simEvent{at: t, seq: s.seq, fn: fn})
}

func (s *sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

// run processes events until the clock passes d from now.
func (s *sim) run(d time.Duration) {
	end := s.now.Add(d)
	for len(s.queue) > 0 && !s.queue[0].at.After(end) && !s.failed {
		e := heap.Pop(&s.queue).(simEvent)
		s.now = e.at
		e.fn()
	}
	if s.now.Before(end) {
		s.now = end
	}
}

// deliver hands node n an input, unless it is dead; a frozen node gets it
// when it thaws.
func (s *sim) deliver(n *simNode, what string, in epoch.Input) {
	switch {
	case !n.alive():
		return
	case n.frozen:
		n.held = append(n.held, func() { s.deliver(n, what, in) })
		return
	}
	outs := n.m.Step(s.now, in)
	if what != "" {
		s.logf("%s ← %s", n.name, what)
	}
	s.handle(n, outs)
}

// rearm schedules n's next Tick at its machine's deadline.
func (s *sim) rearm(n *simNode) {
	d := n.m.Deadline()
	if d.Equal(n.timerAt) {
		return
	}
	n.timer++
	n.timerAt = d
	if d.IsZero() {
		return
	}
	gen := n.timer
	s.at(maxTime(d, s.now), func() {
		if n.timer != gen || !n.alive() {
			return
		}
		n.timerAt = time.Time{}
		if n.frozen {
			n.held = append(n.held, func() { s.tick(n) })
			return
		}
		s.tick(n)
	})
}

// tick calls n's Tick; after it, its deadline must lie ahead (a machine that
// wants a tick now, again and again, would spin its caller).
func (s *sim) tick(n *simNode) {
	outs := n.m.Tick(s.now)
	if d := n.m.Deadline(); !d.IsZero() && !d.After(s.now) {
		s.fail("%s still asks for a tick at %v after one at %v", n.name, d, s.now)
	}
	s.handle(n, outs)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// handle carries out a machine's outputs, checking the invariants that can
// be checked as they happen.
func (s *sim) handle(n *simNode, outs []epoch.Output) {
	for _, o := range outs {
		switch o := o.(type) {
		case epoch.Send:
			if o.Msg.Kind == epoch.MsgEpoch {
				s.announce(n, o.Msg.World)
			}
			s.send(n, o.To, o.Msg)
		case epoch.Proposed:
			s.logf("%s proposes %s", n.name, describe(o.World))
			s.propose(n, o.World)
			s.checkProposed(n, o.World)
			if s.onProposed != nil {
				s.onProposed(n, o.World)
			}
		case epoch.OutForGood:
			s.logf("%s is out for good (epoch %d)", n.name, o.Number)
			n.outForGood = true
		case epoch.Adopted:
			s.adopted(n, o.World)
		default:
			s.logf("%s: %T %+v", n.name, o, o)
		}
	}
	s.rearm(n)
}

// announce checks an epoch a proposer sends: one proposed under that number.
func (s *sim) announce(n *simNode, w epoch.World) {
	if p, ok := s.proposed[w.Number]; !ok || !p.Equal(w) {
		s.fail("%s announces %s, but epoch %d is %s", n.name, describe(w), w.Number, describe(p))
	}
}

// received records an epoch that reached a worker: no two live workers may
// ever hold different worlds under one number.
func (s *sim) received(n *simNode, w epoch.World) {
	prev, ok := s.delivered[w.Number]
	switch {
	case !ok || prev.Equal(w):
	case s.liveHolder(w.Number, n) != "":
		s.fail("fork: %s received %s, but %s holds %s", n.name, describe(w), s.liveHolder(w.Number, n), describe(prev))
		return
	default:
		s.logf("epoch %d reached %s as %s; %s, its first world, died with every worker that got it", w.Number, n.name, describe(w), describe(prev))
		clear(s.holders[w.Number])
	}
	s.delivered[w.Number] = w
	if s.holders[w.Number] == nil {
		s.holders[w.Number] = map[string]bool{}
	}
	s.holders[w.Number][n.name] = true
}

// liveHolder names a live worker other than n that received epoch number.
func (s *sim) liveHolder(number uint64, n *simNode) string {
	for _, name := range slices.Sorted(maps.Keys(s.holders[number])) {
		if o := s.byN[name]; o != n && o.alive() {
			return name
		}
	}
	return ""
}

// propose records a new epoch. Numbers go up by one; one may be numbered
// like an earlier proposal of another world only if that one's proposer is
// dead and no live worker holds it (a taking-over proposer cannot know of
// it, and no worker will use it).
func (s *sim) propose(n *simNode, w epoch.World) {
	if top := uint64(len(s.proposed)); w.Number > top+1 {
		s.fail("%s proposes %s after epoch %d: a gap", n.name, describe(w), top)
	}
	if prev, ok := s.proposed[w.Number]; ok && !prev.Equal(w) {
		by := s.byN[s.proposedBy[w.Number]]
		if holder := s.liveHolder(w.Number, nil); holder != "" || by.alive() {
			s.fail("fork: %s proposes %s, but epoch %d is %s from %s (alive %v, held by %q)",
				n.name, describe(w), w.Number, describe(prev), by.name, by.alive(), holder)
		}
		s.logf("epoch %d is proposed again: the first, %s, died with %s and every worker that got it", w.Number, describe(prev), by.name)
	}
	s.proposed[w.Number] = w
	s.proposedBy[w.Number] = n.name
}

func (s *sim) checkProposed(n *simNode, w epoch.World) {
	seen := map[string]bool{}
	for _, m := range w.Members {
		if seen[m.Name] {
			s.fail("%s proposed %s with %s twice", n.name, describe(w), m.Name)
		}
		seen[m.Name] = true
		if s.evictedBy[m.Name] == n.name {
			s.fail("%s proposed %s with %s, which it evicted", n.name, describe(w), m.Name)
		}
		if node := s.byN[m.Name]; node == nil || node.peer.Driver {
			s.fail("%s proposed %s with a member that is no worker: %s", n.name, describe(w), m.Name)
		}
	}
	if len(w.Members) < s.cfg.minWorkers && !s.ending {
		s.fail("%s proposed %s, below the minimum of %d", n.name, describe(w), s.cfg.minWorkers)
	}
}

// send puts a message on the network: lost, duplicated and delayed at
// random. A send to a process that is gone fails at once, as a refused
// connection does; one to a frozen process is accepted (the kernel takes it)
// and read when it thaws.
func (s *sim) send(from *simNode, to string, msg epoch.Message) {
	s.messages++
	dst := s.byN[to]
	if dst == nil || !dst.alive() {
		s.after(time.Millisecond, func() { s.deliver(from, "", epoch.SendFailed{To: to, Msg: msg}) })
		return
	}
	if s.cfg.net.drop != nil && s.cfg.net.drop(from.name, to, msg) {
		s.logf("%s → %s: %s (dropped)", from.name, to, msg)
		return
	}
	if msg.Kind != epoch.MsgDone && s.rng.Float64() < s.cfg.net.loss {
		return
	}
	copies := 1
	if s.rng.Float64() < s.cfg.net.dup {
		copies = 2
	}
	for range copies {
		m := msg
		if s.cfg.net.wire {
			cm, err := control.Decode(control.Encode(msg))
			if err != nil {
				s.fail("%s → %s: %s does not survive the wire: %v", from.name, to, msg, err)
				return
			}
			m, _ = cm.Protocol()
		}
		s.after(s.between(s.cfg.net.delayMin, s.cfg.net.delayMax), func() {
			if m.Kind == epoch.MsgEpoch && dst.fol != nil && dst.alive() {
				s.received(dst, m.World)
			}
			s.deliver(dst, fmt.Sprintf("%s: %s", from.name, m), epoch.Received{From: from.name, Msg: m})
		})
	}
}

// --- membership ------------------------------------------------------------

// gossip spreads n's current metadata to every member (to n itself at once).
func (s *sim) gossip(n *simNode) {
	peer := n.peer
	for _, o := range s.nodes {
		if !o.alive() {
			continue
		}
		if o == n {
			s.deliver(o, "", epoch.PeerSeen{Peer: peer})
			continue
		}
		s.spread(o, n.name, fmt.Sprintf("gossip: %s %v", peer.Name, peer.State), epoch.PeerSeen{Peer: peer})
	}
}

// spread delivers a change about member subject to observer o after a
// gossip delay, after the earlier changes about subject.
func (s *sim) spread(o *simNode, subject, what string, in epoch.Input) {
	t := s.now.Add(s.between(s.cfg.gossip.delayMin, s.cfg.gossip.delayMax))
	if last := o.heard[subject]; !t.After(last) {
		t = last.Add(time.Microsecond)
	}
	o.heard[subject] = t
	s.at(t, func() { s.deliver(o, what, in) })
}

func (s *sim) addNode(name string, driver bool) *simNode {
	n := &simNode{name: name, heard: map[string]time.Time{},
		peer: epoch.Peer{Name: name, Driver: driver, State: epoch.Joining, StartedAt: s.now.UnixNano()}}
	pc := epoch.ProposerConfig{MinWorkers: s.cfg.minWorkers, Coalesce: s.cfg.coalesce}
	if driver {
		n.peer.State = epoch.Ready
		n.prop = epoch.NewProposer(pc)
		n.m = n.prop
	} else {
		n.peer.Addr = name + ":1"
		n.fol = epoch.NewFollower(epoch.FollowerConfig{Self: name, Proposer: pc}, s.now)
		n.m = n.fol
	}
	s.nodes = append(s.nodes, n)
	s.byN[name] = n
	s.logf("%s starts", name)
	// Push-pull: the newcomer learns the members, and they learn of it.
	for _, o := range s.nodes {
		if o != n && o.alive() && !o.frozen {
			s.spread(n, o.name, fmt.Sprintf("gossip: %s %v", o.name, o.peer.State), epoch.PeerSeen{Peer: o.peer})
		}
	}
	s.gossip(n)
	return n
}

func (s *sim) addDriver(name string) *simNode { return s.addNode(name, true) }

// addAdoptingDriver starts a driver that takes a running job back
// (epoch.Adopt), waiting at most wait for the workers' epochs.
func (s *sim) addAdoptingDriver(name string, wait time.Duration) *simNode {
	n := s.addNode(name, true)
	n.prop = epoch.Adopt(epoch.ProposerConfig{MinWorkers: s.cfg.minWorkers, Coalesce: s.cfg.coalesce}, s.now, wait)
	n.m = n.prop
	s.rearm(n)
	return n
}

// addWorker starts a worker: in gossip at once, ready after its start-up.
func (s *sim) addWorker(name string) *simNode {
	n := s.addNode(name, false)
	s.after(s.cfg.work.startup, func() {
		if n.alive() && n.peer.State == epoch.Joining {
			n.peer.State = epoch.Ready
			s.gossip(n)
		}
	})
	return n
}

// crash kills n (kill -9): it stops at once; gossip declares it dead after a
// detection delay, and then each member learns that its process exited.
func (s *sim) crash(n *simNode) {
	if !n.alive() {
		return
	}
	s.logf("%s crashes", n.name)
	n.crashed = true
	s.declareDead(n)
}

func (s *sim) declareDead(n *simNode) {
	for _, o := range s.nodes {
		if o != n && o.alive() {
			d := s.between(s.cfg.gossip.detectMin, s.cfg.gossip.detectMax)
			s.at(s.now.Add(d), func() {
				if !n.gone && (n.crashed || n.frozen) {
					s.gossipFailed(o, n.name, "gossip: "+n.name+" failed")
				}
				if !n.gone && n.crashed {
					// A killed process is known to be gone: the driver's
					// launcher saw it exit, a worker's look at its gossip
					// port was refused (a frozen one is only suspected).
					s.deliver(o, n.name+" exited", epoch.Exited{Name: n.name})
				}
			})
		}
	}
}

// gossipFailed tells observer o that gossip declared member name dead; a
// worker whose world includes it aborts its collective at once and reports
// the failure (sync.Worker's OnPeerFailed), as a stuck collective would only
// after its I/O timeout.
func (s *sim) gossipFailed(o *simNode, name, what string) {
	if o.frozen {
		o.held = append(o.held, func() { s.gossipFailed(o, name, what) })
		return
	}
	s.deliver(o, what, epoch.PeerGone{Name: name, Failed: true})
	if o.fol == nil || !o.alive() || o.stalled || o.excluded || o.finished || o.using.Rank(name) < 0 {
		return
	}
	o.stalled = true
	w := o.using
	s.after(time.Millisecond, func() {
		if o.alive() && o.using.Number == w.Number && o.stalled {
			s.deliver(o, fmt.Sprintf("its collective in %d aborted (%s declared dead)", w.Number, name),
				epoch.ReportFailure{Number: w.Number, Cause: "gossip declared " + name + " dead"})
		}
	})
}

// falseDeath: gossip declares n, alive and running, dead at some of the
// others (a heavy load delayed its answers to probes past the suspicion
// timeout); n learns of it and refutes, and is seen again, joining under
// its name.
func (s *sim) falseDeath(n *simNode) {
	if !n.alive() || n.frozen {
		return
	}
	s.logf("gossip falsely declares %s dead", n.name)
	for _, o := range s.nodes {
		if o == n || !o.alive() || s.rng.IntN(3) == 0 {
			continue
		}
		t := s.now.Add(s.between(s.cfg.gossip.delayMin, s.cfg.gossip.delayMax))
		if last := o.heard[n.name]; !t.After(last) {
			t = last.Add(time.Microsecond)
		}
		o.heard[n.name] = t
		s.at(t, func() {
			if n.alive() {
				s.gossipFailed(o, n.name, "gossip: "+n.name+" failed (falsely)")
			}
		})
	}
	s.after(s.cfg.gossip.delayMax+s.between(10*time.Millisecond, 300*time.Millisecond), func() {
		if n.alive() && !n.frozen {
			s.logf("%s refutes its death", n.name)
			s.gossip(n)
		}
	})
}

// leave makes n leave gracefully: it publishes leaving, and is gone shortly
// after (it said goodbye).
func (s *sim) leave(n *simNode) {
	if !n.alive() || n.peer.State == epoch.Leaving {
		return
	}
	s.logf("%s leaves", n.name)
	n.peer.State = epoch.Leaving
	s.gossip(n)
	s.after(s.between(5*time.Millisecond, 50*time.Millisecond), func() {
		if !n.alive() {
			return
		}
		n.gone = true
		for _, o := range s.nodes {
			if o != n && o.alive() {
				s.spread(o, n.name, "gossip: "+n.name+" left", epoch.PeerGone{Name: n.name})
			}
		}
	})
}

// freeze stops n for d (SIGSTOP, then SIGCONT). Gossip may declare it dead
// meanwhile; when it thaws it refutes that (it is seen joining again, under
// the same name) and reads what arrived.
func (s *sim) freeze(n *simNode, d time.Duration) {
	if !n.alive() || n.frozen {
		return
	}
	s.logf("%s freezes for %v", n.name, d)
	n.frozen = true
	s.declareDead(n)
	s.after(d, func() {
		if !n.alive() {
			return
		}
		s.logf("%s thaws", n.name)
		n.frozen = false
		held := n.held
		n.held = nil
		s.gossip(n)
		for _, f := range held {
			f()
		}
		s.rearm(n)
		if n.using.Number > 0 {
			s.scheduleStep(n)
		}
	})
}

// evict is the driver's decision to remove w for good.
func (s *sim) evict(driver, w *simNode) {
	s.logf("%s evicts %s", driver.name, w.name)
	w.evicted = true
	s.evictedBy[w.name] = driver.name
	s.evictedAt[w.name] = driver.prop.Current().Number
	s.deliver(driver, "", epoch.Evict{Name: w.name})
}

// --- the session model -------------------------------------------------------

// adopted: the worker's epoch source got a newer epoch.
func (s *sim) adopted(n *simNode, w epoch.World) {
	if k := len(n.adopted); k > 0 && w.Number <= n.adopted[k-1] {
		s.fail("%s adopted epoch %d after %d", n.name, w.Number, n.adopted[k-1])
	}
	if n.fol.Proposer() != nil {
		s.received(n, w) // its own proposal, delivered in-process
	}
	if a, ok := s.delivered[w.Number]; !ok || !a.Equal(w) {
		s.fail("%s adopted %s, which is not the epoch %d workers received (%s)", n.name, describe(w), w.Number, describe(a))
	}
	n.adopted = append(n.adopted, w.Number)
	s.logf("%s adopts %s", n.name, describe(w))
	if n.using.Number == 0 {
		// A joiner waits for an epoch with it; it starts as soon as one comes.
		s.boundary(n)
		return
	}
	s.scheduleStep(n)
}

// boundary: at a step boundary (or while waiting to join), the session moves
// to the newest epoch it knows.
func (s *sim) boundary(n *simNode) {
	latest := n.fol.Latest()
	if latest.Number <= n.using.Number || n.excluded || !n.alive() || n.frozen {
		return
	}
	if latest.Rank(n.name) < 0 {
		if n.using.Number == 0 {
			return // a joiner not admitted yet
		}
		s.logf("%s is excluded by %s", n.name, describe(latest))
		n.excluded = true
		if at, ok := s.evictedAt[n.name]; ok && latest.Number > at && s.proposedBy[latest.Number] == "driver" && !n.outForGood {
			s.fail("%s, evicted at epoch %d, was left out by %s without being told it is out for good", n.name, at, describe(latest))
		}
		s.leave(n)
		if !n.outForGood && !n.evicted && !s.ending && !s.noRejoin {
			// It was declared failed while unreachable: it comes back as a
			// new member (sync.Worker.Rejoin).
			s.rejoins++
			name := fmt.Sprintf("%s+%d", n.name, s.rejoins)
			s.logf("%s rejoins as %s", n.name, name)
			s.after(s.between(time.Millisecond, 20*time.Millisecond), func() { s.addWorker(name) })
		}
		return
	}
	s.logf("%s enters %s", n.name, describe(latest))
	n.using = latest
	n.entered = append(n.entered, latest)
	n.everEntered = true
	n.stalled = false
	if s.onEntered != nil {
		s.onEntered(n, latest)
	}
	s.complete(latest)
	s.scheduleStep(n)
}

// complete: once every member has entered world w, its state went from its
// root to every member (sync.Session.enter). The root is rank 0, unless
// rank 0 never held the job's state and another member does: a world must
// never take a fresh worker's initial state over the job's.
func (s *sim) complete(w epoch.World) {
	if s.completed[w.Number] {
		return
	}
	anySynced := false
	for _, m := range w.Members {
		o := s.byN[m.Name]
		if !o.alive() || o.using.Number != w.Number {
			return
		}
		anySynced = anySynced || o.synced
	}
	s.completed[w.Number] = true
	root := w.Members[0].Name
	if !s.rankZeroRoot {
		for _, m := range w.Members {
			if s.byN[m.Name].synced {
				root = m.Name
				break
			}
		}
	}
	if anySynced && !s.byN[root].synced {
		s.fail("%s took its state from %s, which never held the job's state: training went back to the start", describe(w), root)
	}
	for _, m := range w.Members {
		s.byN[m.Name].synced = true
	}
}

func (s *sim) scheduleStep(n *simNode) {
	if n.stepping {
		return
	}
	n.stepping = true
	s.after(s.between(s.cfg.work.stepMin, s.cfg.work.stepMax), func() {
		n.stepping = false
		s.step(n)
	})
}

// step runs one training step of n in its world.
func (s *sim) step(n *simNode) {
	if !n.alive() || n.frozen || n.excluded || n.finished || n.using.Number == 0 {
		return
	}
	if n.fol.Latest().Number > n.using.Number {
		s.boundary(n)
		return
	}
	if n.stalled {
		return
	}
	w := n.using
	ready := true
	for _, m := range w.Members {
		o := s.byN[m.Name]
		if o == n {
			continue
		}
		// (A member that finished in this world did the last step with n; one
		// that finished in another never comes.)
		if !o.alive() && !(o.finished && o.using.Number == w.Number) || o.frozen || o.excluded ||
			o.using.Number > w.Number || (o.finished && o.using.Number != w.Number) ||
			(o.stalled && !o.failedLast && o.using.Number == w.Number) {
			// (A member whose collective failed aborted its links, so the
			// others' fails too; one whose last step failed alone did so
			// after the others had completed it.)
			s.collectiveFails(n, o.name)
			return
		}
		ready = ready && o.using.Number == w.Number
	}
	if !ready {
		s.scheduleStep(n) // a member has not entered yet: the collective waits
		return
	}
	if s.ending {
		s.lastStep(n)
		return
	}
	s.scheduleStep(n)
}

// collectiveFails: n's collective failed because of member bad; n notices
// after an I/O timeout and reports it, blaming bad (or, now and then, a live
// member: blame is only a suspicion).
func (s *sim) collectiveFails(n *simNode, bad string) {
	n.stalled = true
	w := n.using
	blamed := bad
	if s.rng.Float64() < s.cfg.work.falseBlame {
		var others []string
		for _, m := range w.Members {
			if m.Name != n.name && s.byN[m.Name].alive() {
				others = append(others, m.Name)
			}
		}
		if len(others) > 0 {
			blamed = others[s.rng.IntN(len(others))]
		}
	}
	s.after(s.between(s.cfg.work.ioTimeoutMin, s.cfg.work.ioTimeoutMax), func() {
		if n.alive() && n.using.Number == w.Number && n.stalled {
			s.deliver(n, fmt.Sprintf("its collective in %d failed, blaming %q", w.Number, blamed),
				epoch.ReportFailure{Number: w.Number, Blamed: blamed, Cause: "peer " + bad})
		}
	})
}

// lastStep: training is over. A member finishes and leaves, unless its last
// step fails (the others finished it, and left): it reports the failure and
// redoes the step in the world it is given, then finishes.
func (s *sim) lastStep(n *simNode) {
	w := n.using
	if s.failLast[n.name] && !n.failedLast && w.Rank(n.name) != 0 {
		n.failedLast = true
		n.stalled = true
		var blamed string
		if w.Rank(n.name) > 0 && s.rng.IntN(2) == 0 {
			blamed = w.Members[0].Name
		}
		s.after(s.between(s.cfg.work.ioTimeoutMin, s.cfg.work.ioTimeoutMax), func() {
			if n.alive() && n.using.Number == w.Number {
				s.deliver(n, fmt.Sprintf("its last step in %d failed", w.Number),
					epoch.ReportFailure{Number: w.Number, Blamed: blamed, Cause: "last step"})
			}
		})
		return
	}
	n.finished = true
	s.deliver(n, fmt.Sprintf("training done in %d", w.Number), epoch.ReportDone{Number: w.Number})
	s.leaveWhenFree(n, s.now.Add(time.Minute))
}

// leaveWhenFree: a finished worker leaves, but one that proposes stays until
// the members of its world have finished or gone (or until the deadline), as
// sync.Worker.Finish does.
func (s *sim) leaveWhenFree(n *simNode, deadline time.Time) {
	s.after(time.Millisecond, func() {
		if p := n.fol.Proposer(); p != nil && len(p.StillTraining()) > 0 && s.now.Before(deadline) {
			s.after(50*time.Millisecond, func() { s.leaveWhenFree(n, deadline) })
			return
		}
		s.leave(n)
	})
}

// finish ends training: members of the current worlds finish at their next
// step; failing lists the members whose last step fails.
func (s *sim) finish(failing ...string) {
	s.logf("training is over; last step fails for %v", failing)
	s.ending = true
	for _, f := range failing {
		s.failLast[f] = true
	}
	for _, n := range s.nodes {
		if n.using.Number > 0 {
			s.scheduleStep(n)
		}
	}
}

// --- queries and final checks ------------------------------------------------

// proposers lists the live members that propose now.
func (s *sim) proposers() []*simNode {
	var out []*simNode
	for _, n := range s.nodes {
		if n.alive() && !n.frozen && (n.prop != nil || (n.fol != nil && n.fol.Proposer() != nil)) {
			out = append(out, n)
		}
	}
	return out
}

func (s *sim) proposerOf(n *simNode) *epoch.Proposer {
	if n.prop != nil {
		return n.prop
	}
	return n.fol.Proposer()
}

// checkNumbering: the proposed epochs are numbered 1..N without a gap.
func (s *sim) checkNumbering() {
	for i := uint64(1); i <= uint64(len(s.proposed)); i++ {
		if _, ok := s.proposed[i]; !ok {
			s.fail("epochs proposed: %d numbers, but none is %d (a gap)", len(s.proposed), i)
			return
		}
	}
}

// checkUsage: every worker entered only epochs it adopted, in increasing
// order, each one that includes it, and the world announced under that
// number.
func (s *sim) checkUsage() {
	for _, n := range s.nodes {
		for i, e := range n.entered {
			if i > 0 && e.Number <= n.entered[i-1].Number {
				s.fail("%s entered epoch %d after %d", n.name, e.Number, n.entered[i-1].Number)
			}
			if !slices.Contains(n.adopted, e.Number) {
				s.fail("%s entered epoch %d, which it never adopted", n.name, e.Number)
			}
			if e.Rank(n.name) < 0 {
				s.fail("%s entered %s, which does not include it", n.name, describe(e))
			}
		}
	}
}

// checkDelivered: every live member of a proposed epoch received it or a
// later one — unless the epoch died with its proposer before it reached a
// worker that is still alive (no one can announce it any more, and no one
// uses it).
func (s *sim) checkDelivered() {
	for number, w := range s.proposed {
		if !s.byN[s.proposedBy[number]].alive() && s.liveHolder(number, nil) == "" {
			continue
		}
		for _, m := range w.Members {
			n := s.byN[m.Name]
			if !n.alive() || n.frozen {
				continue
			}
			if k := len(n.adopted); k == 0 || n.adopted[k-1] < number {
				s.fail("%s, a live member of %s, never got it (nor a later one); it has %v", n.name, describe(w), n.adopted)
			}
		}
	}
}

// checkSettled: after a quiet time, one proposer is left; every live worker
// knows its current epoch and its members train in it, and every live
// ready worker that may train is a member (when there are enough for one).
func (s *sim) checkSettled() {
	props := s.proposers()
	if len(props) != 1 {
		names := []string{}
		for _, p := range props {
			names = append(names, p.name)
		}
		s.fail("settled with proposers %v, want exactly one", names)
		return
	}
	cur := s.proposerOf(props[0]).Current()
	for _, n := range s.nodes {
		if n.fol == nil || !n.alive() || n.excluded {
			continue
		}
		if got := n.fol.Latest(); got.Number != cur.Number {
			s.fail("%s knows epoch %d, the proposer %s is at %s", n.name, got.Number, props[0].name, describe(cur))
		}
	}
	eligible := s.eligible()
	if len(eligible) < s.cfg.minWorkers {
		return // the proposer waits for more workers: the last world may hold dead ones
	}
	for _, m := range cur.Members {
		n := s.byN[m.Name]
		if !n.alive() {
			s.fail("the settled world %s has %s, which is %s", describe(cur), n.name, map[bool]string{true: "dead", false: "gone"}[n.crashed])
		} else if n.using.Number != cur.Number {
			s.fail("%s, a member of the settled world %s, is in epoch %d", n.name, describe(cur), n.using.Number)
		} else if n.stalled {
			s.fail("%s, a member of the settled world %s, is stuck in it after a failure", n.name, describe(cur))
		}
	}
	for _, name := range eligible {
		if cur.Rank(name) < 0 {
			s.fail("%s is ready but not in the settled world %s", name, describe(cur))
		}
	}
}

// eligible lists the live workers that may train: ready, not excluded from
// a world they were in, not evicted.
func (s *sim) eligible() []string {
	var out []string
	for _, n := range s.nodes {
		if n.fol != nil && n.alive() && !n.excluded && !n.evicted && n.peer.State != epoch.Leaving {
			out = append(out, n.name)
		}
	}
	return out
}

// checkFinished: after training ended, every member that entered a world and
// is still alive finished, and the proposer lists none unfinished.
func (s *sim) checkFinished() {
	for _, n := range s.nodes {
		if n.fol != nil && n.everEntered && n.alive() && !n.excluded && !n.finished {
			s.fail("%s trained but never finished (in epoch %d, knows %d)", n.name, n.using.Number, n.fol.Latest().Number)
		}
	}
	props := s.proposers()
	if len(props) != 1 {
		return
	}
	p := s.proposerOf(props[0])
	if !p.Finished() {
		s.fail("%s never learned that training finished", props[0].name)
	}
	if u := p.Unfinished(); len(u) > 0 {
		for _, name := range u {
			if n := s.byN[name]; n.alive() || n.finished {
				s.fail("%s still lists %v unfinished in %s", props[0].name, u, describe(p.Current()))
				break
			}
		}
	}
}

func describe(w epoch.World) string {
	names := make([]string, len(w.Members))
	for i, m := range w.Members {
		names[i] = m.Name
	}
	return fmt.Sprintf("%d[%s]", w.Number, strings.Join(names, " "))
}
