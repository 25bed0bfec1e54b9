// The Session's move from one world to the next: connecting the next world
// ahead of the step boundary (Prepare), carrying the links of members that
// stay, entering a world (connect, then agree on and receive the state), and
// moving on at a Commit or after a failure (advance, recover).

package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/sync/epoch"
)

// preconnect is a world's links connected in the background while the
// current one trains: those to the members that are not in the current
// world (the others' links are carried over at the step boundary), or all
// of them when the transport cannot connect a world in part. done closes
// once links or err is set.
type preconnect struct {
	number uint64
	want   []bool // the ranks being connected (nil: all of them)
	cancel context.CancelFunc
	done   chan struct{}
	links  []transport.Link
	err    error
}

// ahead is p as the links of a world of size ranks, this worker being
// rank, that Carry waits for while it re-keys the kept links and dials the
// others. A wait that ends with its ctx discards p.
func (p *preconnect) ahead(size, rank int) *transport.Ahead {
	want := p.want
	if want == nil {
		want = make([]bool, size)
		for r := range want {
			want[r] = r != rank
		}
	}
	return &transport.Ahead{Want: want, Wait: func(ctx context.Context) ([]transport.Link, error) {
		select {
		case <-p.done:
			return p.links, p.err
		case <-ctx.Done():
			// The connect ahead is stopped, and its error names the ranks
			// it had not connected, the member to blame for the world
			// (what a stuck member's exclusion counts on), where the
			// context's own error names nobody: wait for it, briefly. Both
			// run to the same ConnectTimeout, so which ends first is a
			// matter of scheduling.
			p.discard()
			t := time.NewTimer(aheadStopWait)
			defer t.Stop()
			select {
			case <-p.done:
				if transport.NamesPeer(p.err) {
					return nil, p.err
				}
			case <-t.C:
			}
			return nil, context.Cause(ctx)
		}
	}}
}

// aheadStopWait bounds the wait for a stopped connect ahead's error (see
// preconnect.ahead); its dials end with their context.
const aheadStopWait = time.Second

// discard abandons p: its connect is stopped and its links, if it got
// them, closed.
func (p *preconnect) discard() {
	p.cancel()
	go func() {
		<-p.done
		closeLinks(p.links)
	}()
}

func closeLinks(ls []transport.Link) {
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
}

// releaseCarried closes the links carried from the last world that no
// world took.
func (s *Session) releaseCarried() {
	for _, l := range s.carried {
		l.Close()
	}
	s.carried = nil
}

// takeCarried returns the carried links to ep's members, indexed by their
// rank in ep (nil when there are none), and closes the others.
func (s *Session) takeCarried(ep epoch.World) []transport.Link {
	if len(s.carried) == 0 {
		s.carried = nil
		return nil
	}
	kept := make([]transport.Link, len(ep.Members))
	for r, m := range ep.Members {
		if l, ok := s.carried[m]; ok {
			kept[r] = l
			delete(s.carried, m)
		}
	}
	s.releaseCarried()
	return kept
}

// takeSalvaged adds to the carried links those salvaged from the world
// that failed last (recover) to ep's members, once their peers' abort
// frames have come (or ctx ends: those not drained by then close); the
// others close.
func (s *Session) takeSalvaged(ctx context.Context, ep epoch.World) {
	s.mu.Lock()
	sv, from := s.salvaged, s.salvagedFrom
	s.salvaged = nil
	s.mu.Unlock()
	if sv == nil {
		return
	}
	next := make(map[epoch.Member]bool, len(ep.Members))
	for _, m := range ep.Members {
		next[m] = true
	}
	links := sv.Take(ctx, func(r int) bool { return next[from.Members[r]] })
	if links == nil {
		return
	}
	if s.carried == nil {
		s.carried = make(map[epoch.Member]transport.Link, len(links))
	}
	for r, l := range links {
		if l != nil {
			s.carried[from.Members[r]] = l
		}
	}
}

// Prepare starts connecting world ep, newer than the current one, in the
// background while this worker trains on: at the step boundary where the
// members move to it (Commit) its links are then ready, and only the state
// still has to agree. The membership layer calls it when an epoch is
// adopted; it returns at once. It does nothing for a world without this
// worker, before the session has entered its first world, or after Close;
// a newer ep replaces an older one being prepared.
func (s *Session) Prepare(ep epoch.World) {
	rank := ep.Rank(s.cfg.Self.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ep.Number > s.hold.number {
		s.hold = joinHold{}
	}
	// Whether the move to ep is held back for its joiners (tagEpoch): only
	// from a running world older than ep.
	held := s.comm != nil && !s.closed && !s.moving && ep.Number > s.epoch.Number && s.cfg.JoinHold > 0 && hasJoiners(ep, s.epoch)
	if held && rank < 0 {
		// A member the next world leaves out cannot tell when the others
		// have connected its joiners: it holds its tag back for JoinHold
		// only, and the others' tags move the world when they are ready.
		s.hold = joinHold{number: ep.Number, until: time.Now().Add(s.cfg.JoinHold)}
	}
	if s.comm == nil || s.closed || ep.Number <= s.epoch.Number || ep.Number <= s.enteringNumber || rank < 0 || s.moving {
		// (A world being left or entered (moving) is no base to plan from:
		// its communicator has handed its links over, and s.epoch is the
		// world being left, not the one ep follows. ep is then connected
		// at its own step boundary, keeping what it can.)
		// (An epoch being entered already is connected by enter: a second
		// Connect of the same world on this transport would fail.)
		return
	}
	if s.next != nil {
		if s.next.number >= ep.Number {
			return
		}
		s.next.discard()
		s.next = nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The links to members of the current world are carried over at the
	// step boundary; only the others are dialled now. So are those of a
	// world that has failed: its links are salvaged (recover), and a link
	// that cannot be is dialled when ep is entered (Carry).
	var want []bool
	if _, ok := s.t.(transport.PartialConnector); ok {
		want = make([]bool, len(ep.Members))
		for r, m := range ep.Members {
			want[r] = r != rank && !slices.Contains(s.epoch.Members, m)
		}
	}
	p := &preconnect{number: ep.Number, want: want, cancel: cancel, done: make(chan struct{})}
	s.next = p
	if held {
		s.hold = joinHold{number: ep.Number, until: time.Now().Add(s.cfg.JoinHold), ahead: p}
	}
	log := s.log
	go func() {
		defer close(p.done)
		defer cancel()
		began := time.Now()
		p.links, p.err = s.connectSome(ctx, ep, rank, want)
		log.Debug("connected the next world's new members ahead of the step boundary", "epoch", ep.Number, "took", time.Since(began), "err", p.err)
	}()
}

// joinHold holds back the move to world number, which has members the
// current one lacks, until the links to them are connected ahead (ahead;
// nil for a member the world leaves out, which waits for until only) or
// until passes.
type joinHold struct {
	number uint64
	until  time.Time
	ahead  *preconnect
}

// holds reports whether h still holds back the move to world number.
func (h joinHold) holds(number uint64) bool {
	if h.number != number || !time.Now().Before(h.until) {
		return false
	}
	if h.ahead == nil {
		return true
	}
	select {
	case <-h.ahead.done:
		return false // connected, or failed: the entry dials what is missing
	default:
		return true
	}
}

// hasJoiners reports whether next has members that current lacks.
func hasJoiners(next, current epoch.World) bool {
	for _, m := range next.Members {
		if !slices.Contains(current.Members, m) {
			return true
		}
	}
	return false
}

// tagEpoch is the epoch number this worker puts in a collective's tag,
// whose largest over the members moves the world at the step's end (see
// collective.MaxTag): the newest it has been told of, but the current
// world's while the move to the newest is held back for its joiners
// (Config.JoinHold). The members then train on while the joiners connect,
// and move once one of them has its links to them (the joiner's links all
// finish together: a member's link to it is ready when it has connected
// to every member), or at the hold's end.
func (s *Session) tagEpoch() uint64 {
	latest := s.src.Latest()
	s.mu.Lock()
	defer s.mu.Unlock()
	if latest > s.epoch.Number && s.hold.holds(latest) {
		return s.epoch.Number
	}
	return latest
}

// connectSome connects this worker, rank, to the members r of world ep
// with want[r] set (all of them when want is nil), within
// Config.ConnectTimeout.
func (s *Session) connectSome(ctx context.Context, ep epoch.World, rank int, want []bool) ([]transport.Link, error) {
	w := transport.World{JobID: s.cfg.JobID, Epoch: ep.Number, Rank: rank, Addrs: ep.Addrs()}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if want == nil {
		return s.t.Connect(ctx, w)
	}
	return s.t.(transport.PartialConnector).ConnectSome(ctx, w, want)
}

// connect connects this worker, rank, to the members of world ep within
// Config.ConnectTimeout: it keeps the links carried over from the last
// world to ep's members (kept, by rank in ep; each re-keyed to ep inside
// its own stream), takes those being connected ahead (nil: none), and
// dials the rest, all at once: the kept links re-key while the links to
// new members finish connecting (at a join, each member's link to the
// joiner is ready only when the joiner has connected to every member).
// watch hears how each rank's link comes along.
func (s *Session) connect(ctx context.Context, ep epoch.World, rank int, kept []transport.Link, ahead *preconnect, watch transport.CarryWatch) (*collective.Communicator, error) {
	w := transport.World{JobID: s.cfg.JobID, Epoch: ep.Number, Rank: rank, Addrs: ep.Addrs()}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	var a *transport.Ahead
	if ahead != nil {
		a = ahead.ahead(len(ep.Members), rank)
	}
	links, rekeyed, err := transport.CarryAhead(ctx, s.t, w, kept, a, s.log, watch)
	if err != nil {
		return nil, err
	}
	s.entering.rekeyed = rekeyed
	comm, err := collective.NewFromLinks(w, links, s.cfg.Collective)
	if err != nil {
		closeLinks(links)
		return nil, err
	}
	return comm, nil
}

// takeNext hands over the world being prepared if it is ep (nil otherwise;
// one for another epoch is discarded).
func (s *Session) takeNext(number uint64) *preconnect {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.next
	s.next = nil
	if p != nil && p.number != number {
		p.discard()
		return nil
	}
	return p
}

// moveToNext moves this worker, at the step boundary where Commit counted
// step committed, to the newer world its members agreed on: the links to
// members that stay are carried into it. It returns ErrWorldChanged when that
// world's rank 0 had not committed the step (the state is then rank 0's).
func (s *Session) moveToNext(ctx context.Context, committed int64) error {
	// The links to members that stay are carried into the next world.
	left := s.epoch
	s.mu.Lock()
	s.moving = true
	links := s.comm.Release(func(int) bool { return true })
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.moving = false
		s.mu.Unlock()
	}()
	if s.handedOver != nil {
		s.handedOver()
	}
	if links != nil {
		s.carried = make(map[epoch.Member]transport.Link, len(links))
		for r, l := range links {
			if l != nil {
				s.carried[left.Members[r]] = l
			}
		}
	}
	err := s.advance(ctx, s.epoch.Number)
	s.releaseCarried()
	if err != nil {
		if errors.Is(err, ErrExcluded) {
			s.clock.HandHeld() // no next commit: the last world's steps go now
		}
		return err
	}
	if s.state.Step != committed {
		s.log.Info("the next world's rank 0 had not committed this step: rolled back", "step", committed, "now", s.state.Step)
		return ErrWorldChanged
	}
	return nil
}

// AbortIfMember stops the collective in progress if name is a member of the
// current world: a Worker calls it when a member is dead both to its gossip
// and to the proposer (the newest epoch leaves it out), which on a frozen
// worker comes sooner than the collective's I/O timeout. The collective then
// fails and the session recovers as usual.
func (s *Session) AbortIfMember(name string, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.comm != nil && s.epoch.Rank(name) >= 0 {
		s.comm.Abort(cause)
	}
}

// recover handles a collective failure: report it, drop the broken world and
// join the next one.
func (s *Session) recover(ctx context.Context, cause error) error {
	blamed := epoch.Member{}
	var pe *collective.PeerError
	if errors.As(cause, &pe) && pe.Rank >= 0 && pe.Rank < len(s.epoch.Members) {
		blamed = s.epoch.Members[pe.Rank]
	}
	s.log.Warn("collective failed; waiting for the next world", "epoch", s.epoch.Number, "blamed", blamed.Name, "err", cause)
	s.src.ReportFailure(s.epoch.Number, blamed, cause)
	s.mu.Lock()
	s.salvaged.Close() // a world that failed before this one was entered
	s.salvaged, s.salvagedFrom = s.comm.Salvage(cause), s.epoch
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RecoveryTimeout)
	defer cancel()
	start, failed := time.Now(), s.epoch.Number
	if err := s.advance(ctx, s.epoch.Number); err != nil {
		return fmt.Errorf("sync: recovering from %v: %w", cause, err)
	}
	s.obs.recovered(failed, blamed.Name, cause, start, time.Now())
	return nil
}

// enter connects epoch ep's world and receives the state from its rank 0. A
// newer epoch abandons the attempt: a member of ep that died after ep was
// proposed would otherwise keep the others dialling it until the recovery
// timeout, while the proposer has already replaced ep.
func (s *Session) enter(ctx context.Context, ep epoch.World, rank int) (*collective.Communicator, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if _, err := s.src.Await(ctx, ep.Number); err == nil {
			cancel(errSuperseded)
		}
	}()
	superseded := func(err error) error {
		if context.Cause(ctx) == errSuperseded {
			return fmt.Errorf("%w: %w", errSuperseded, err)
		}
		return err
	}
	began := time.Now()
	s.mu.Lock()
	s.enteringNumber = ep.Number
	s.mu.Unlock()
	s.takeSalvaged(ctx, ep)
	kept := s.takeCarried(ep)
	dialled := newDialledWatch(len(ep.Members), rank, kept)
	if r, ok := s.src.(memberReacher); ok {
		// A member that died after the world was proposed keeps the others
		// dialling it; when connecting takes a while, look for one among
		// the members being dialled (the others have shown they are there,
		// and a kept link's peer that dies fails its re-key at once).
		stop := dialled.watch(reachAfter, func(ranks []int) {
			waiting := epoch.World{Number: ep.Number}
			for _, i := range ranks {
				waiting.Members = append(waiting.Members, ep.Members[i])
			}
			r.reachMembers(ctx, waiting)
		})
		defer stop()
	}
	// Connected (or being connected) since the epoch was adopted: connect
	// waits for it while the kept links re-key.
	p := s.takeNext(ep.Number)
	comm, err := s.connect(ctx, ep, rank, kept, p, dialled.carryWatch())
	if err != nil {
		return nil, superseded(err)
	}
	// Connected: nobody is dialled any more, and a member that dies now
	// fails the state agreement on its link. Looking for gone members
	// would only load the machine at the moment every member of the world
	// is busy entering it (one connection to each member's gossip port).
	dialled.stop()
	start := time.Now()
	s.entering.connect = start.Sub(began)
	root, local, holders, same, err := s.stateRoot(ctx, comm)
	var moved int64
	if err == nil && !same {
		moved, err = s.state.broadcast(ctx, comm, root, local, holders)
	}
	s.obs.broadcast(ep.Number, start, time.Now(), err)
	s.entering.state, s.entering.stateBytes = time.Since(start), moved
	if err != nil {
		comm.Abort(err)
		return nil, superseded(err)
	}
	s.synced = true
	return comm, nil
}

// reachAfter is how long connecting a world may take before the session
// looks for members that are gone (memberReacher); once connected, it
// does not look.
const reachAfter = 50 * time.Millisecond

// memberReacher is a Source that can look whether the members of a world
// still listen and report, as a failure of that world, one whose process
// is gone: a host that dies takes all its workers with it while a failed
// collective blames only one, and the next world's connect would otherwise
// dial the others until gossip declares them dead (most of a second).
type memberReacher interface {
	reachMembers(ctx context.Context, ep epoch.World)
}

// stateRoot agrees on the member whose state the world takes, and on the
// members that hold it already, in one small gather of every member's
// [holds the job's state, digest readable, digest] (an allreduce by
// recursive doubling, or an allgather where the Config forces another
// algorithm).
//
// The root is rank 0 (the oldest survivor), unless it never received the
// job's state — a joiner whose admission failed, left ahead of the members
// that trained when they were all declared dead and came back after it —
// while another member did. Then the lowest rank that holds the state is
// the root: a world must never take a fresh worker's initial state over
// the job's.
//
// holders are the root and the members whose digest (State.digest: step,
// registrations, every byte) equals the root's: they hold its state
// already, byte for byte, and can feed the others (State.broadcast). A
// member that cannot take a digest (state in device memory) is not one.
// same reports that every member is a holder: no transfer is needed (a
// world that only lost members, at a step boundary). local is what this
// worker read of its own state for its digest (its blobs, and each
// tensor's digest: a member that does not hold the job's state takes
// those too, so that the broadcast that follows sends it only the tensors
// it lacks), nil in a world of one.
func (s *Session) stateRoot(ctx context.Context, comm *collective.Communicator) (root int, local *stateDigest, holders []int, same bool, err error) {
	const fields = 4 // holds the state, digest readable, digest's two halves
	p := comm.Size()
	mine := make([]int64, fields)
	if p > 1 {
		// Every member hashes its tensors before the agreement, the ones
		// that hold no state yet while the holders take their digests.
		if s.synced {
			local, err = s.state.digest()
		} else {
			local = &stateDigest{tensors: s.state.tensorDigests()}
		}
		if err != nil {
			return 0, nil, nil, false, err
		}
	}
	if s.synced {
		mine[0] = 1
		if local != nil && local.whole {
			mine[1], mine[2], mine[3] = 1, int64(local.sum&0xffffffff), int64(local.sum>>32)
		}
	}
	all := make([]int64, fields*p)
	if comm.AllreduceAlgorithm(collective.Int64, len(all)) == string(collective.AlgorithmRecursiveDoubling) {
		// The same gather as one small allreduce: each rank fills its own
		// slot of all and the sum fills the others. Recursive doubling
		// takes log2 p rounds where the allgather's ring takes p-1 steps,
		// one after the other, each waiting for the next process to run;
		// at 16 ranks on a busy machine that chain was most of the
		// agreement's time. Every rank has the same collective Config,
		// so every rank chooses alike.
		copy(all[fields*comm.Rank():], mine)
		if err := collective.Allreduce(ctx, comm, all, all, collective.Sum); err != nil {
			return 0, nil, nil, false, err
		}
	} else if err := collective.Allgather(ctx, comm, mine, all); err != nil {
		return 0, nil, nil, false, err
	}
	root = -1
	for r := range p {
		if all[fields*r] == 1 {
			root = r
			break
		}
	}
	if root < 0 {
		return 0, local, nil, false, nil // a new job: nobody holds a state yet
	}
	if root != 0 {
		s.log.Warn("rank 0 of the new world never received the job's state: taking it from another member", "rank", root)
	}
	ref := all[fields*root : fields*root+fields]
	for r := range p {
		got := all[fields*r : fields*r+fields]
		if r == root || (ref[1] == 1 && got[0] == 1 && got[1] == 1 && got[2] == ref[2] && got[3] == ref[3]) {
			holders = append(holders, r)
		}
	}
	return root, local, holders, len(holders) == p, nil
}

// errSuperseded marks an attempt to enter a world abandoned because a newer
// one was proposed meanwhile (workers that join together make a few worlds
// in quick succession): no failure.
var errSuperseded = errors.New("a newer world was proposed")

// advance moves to the newest epoch after the given one: connect its members,
// then copy the state from its rank 0. A failure on the way moves on to the
// epoch after that.
func (s *Session) advance(ctx context.Context, after uint64) error {
	for {
		ep, err := s.src.Await(ctx, after)
		if err != nil {
			return err
		}
		rank := ep.Rank(s.cfg.Self.Name)
		if rank < 0 {
			if s.comm == nil {
				// Not admitted yet: a joiner waits for an epoch with it.
				after = ep.Number
				continue
			}
			return fmt.Errorf("%w (%v)", ErrExcluded, ep)
		}
		start, cpu := time.Now(), processCPU()
		comm, err := s.enter(ctx, ep, rank)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrStateMismatch) {
				// This worker's state cannot join rank 0's: a retry would fail alike.
				return err
			}
			level := slog.LevelWarn
			if errors.Is(err, errSuperseded) {
				level = slog.LevelInfo // not a failure: a newer world came (workers joining together)
			}
			s.log.Log(ctx, level, "entering the next world failed", "epoch", ep.Number, "err", err)
			var pe *collective.PeerError
			blamed := epoch.Member{}
			if errors.As(err, &pe) && pe.Rank >= 0 && pe.Rank < len(ep.Members) {
				blamed = ep.Members[pe.Rank]
			}
			s.src.ReportFailure(ep.Number, blamed, err)
			after = ep.Number
			continue
		}
		s.mu.Lock()
		s.epoch, s.comm = ep, comm
		s.mu.Unlock()
		now := time.Now()
		s.clock.Entered(now, now.Sub(start))
		if s.noise != nil {
			s.noise.reset()
		}
		s.obs.entered(ep, rank, comm, start, now)
		s.log.Info("entered world", "epoch", ep.Number, "rank", rank, "size", len(ep.Members), "took", now.Sub(start),
			"connect", s.entering.connect, "state", s.entering.state, "state_bytes", s.entering.stateBytes,
			"links_kept", s.entering.rekeyed,
			"cpu", processCPU()-cpu)
		return nil
	}
}

// dialledWatch follows which ranks of a world being entered are being
// dialled, for the look for gone members (memberReacher): a rank whose
// link of the last world is being re-keyed is not looked at (its peer is
// there: a peer that dies closes the link and fails the re-key at once),
// nor one whose link is ready.
type dialledWatch struct {
	mu       stdsync.Mutex
	self     int
	linked   []bool // the link is ready
	rekeying []bool // a kept link is being re-keyed
	looked   []bool // looked at already
	timer    *time.Timer
	stopped  bool
}

func newDialledWatch(size, self int, kept []transport.Link) *dialledWatch {
	d := &dialledWatch{self: self, linked: make([]bool, size), rekeying: make([]bool, size), looked: make([]bool, size)}
	for r, l := range kept {
		d.rekeying[r] = l != nil && r != self
	}
	return d
}

// carryWatch tells d how the carry's links come along.
func (d *dialledWatch) carryWatch() transport.CarryWatch {
	set := func(flags []bool, r int, v bool) {
		d.mu.Lock()
		flags[r] = v
		d.mu.Unlock()
	}
	return transport.CarryWatch{
		Linked: func(r int) { set(d.linked, r, true) },
		Unkept: func(r int) { set(d.rekeying, r, false) },
	}
}

// watch calls look, every interval while the connect goes on, with the
// ranks being dialled that it has not been given yet (a kept link that
// fails its re-key after the first look is dialled then, and looked at on
// the next). It returns stop.
func (d *dialledWatch) watch(interval time.Duration, look func(ranks []int)) (stop func()) {
	var tick func()
	tick = func() {
		d.mu.Lock()
		if d.stopped {
			d.mu.Unlock()
			return
		}
		var ranks []int
		for r := range d.linked {
			if r != d.self && !d.linked[r] && !d.rekeying[r] && !d.looked[r] {
				d.looked[r] = true
				ranks = append(ranks, r)
			}
		}
		d.timer = time.AfterFunc(interval, tick)
		d.mu.Unlock()
		if len(ranks) > 0 {
			look(ranks)
		}
	}
	d.mu.Lock()
	d.timer = time.AfterFunc(interval, tick)
	d.mu.Unlock()
	return d.stop
}

// stop ends the looks: the world is connected, or its entry ended.
func (d *dialledWatch) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.timer != nil {
		d.timer.Stop()
	}
}
