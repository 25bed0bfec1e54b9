package epoch

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// ProposerConfig configures a Proposer. A zero field means its default.
type ProposerConfig struct {
	// Self is the member running the proposer when it is a worker that took
	// over (it is alive by definition and is never probed); "" for a driver.
	Self string
	// Coalesce: changes closer together than this make one epoch (default
	// 10 ms), so workers arriving or failing together cost one transition.
	Coalesce time.Duration
	// MinWorkers: no epoch with fewer members is proposed; the job waits
	// (default 1).
	MinWorkers int
	// FirstWorld is the number of workers the job was started with (`gorovod
	// run --np`): the voters of its first world, which is proposed only with
	// a strict majority of them (half, for the driver; CheckFirstQuorum). 0:
	// not known, and a first world needs no quorum.
	FirstWorld int
	// ProbeTimeout bounds the wait for the answer to a liveness probe: of a
	// blamed worker, and of a member gossip declared dead (default 500 ms).
	ProbeTimeout time.Duration
	// Reannounce: the current epoch is sent again this often (default 1 s)
	// to every worker in view that has not acknowledged it, as the network
	// may lose or reorder messages.
	Reannounce time.Duration
	// Resend: a new epoch is sent again this long after its proposal to the
	// workers that have not acknowledged it yet, then after twice as long,
	// and so on up to Reannounce (default 25 ms). One lost message then
	// costs a transition tens of milliseconds, not a Reannounce — in a large
	// world some message of each epoch is lost whenever the network loses
	// any. When half the workers took longer than Resend/2 to acknowledge
	// the last epoch, the first re-send waits twice that long instead (at
	// most Reannounce): on a loaded machine, where acknowledgements take
	// tens of milliseconds to come back, a re-send after Resend would go to
	// most workers while the first copy is still on its way, and every copy
	// costs the machine a stream at each end and an acknowledgement back,
	// in the middle of the transition.
	Resend time.Duration
	// SyncTimeout bounds how long a proposer taking over waits for the
	// workers to say which epoch they know before it proposes (default 2 s).
	SyncTimeout time.Duration
	// BlameLimit: a worker blamed for the failures of this many different
	// worlds, each blame within BlameWindow of the previous one, is removed
	// even though it answers its probes (ReasonStuck; default 3). Without
	// it, a worker whose gossip answers while its training is stuck would
	// make the others re-form the same world, and wait for it, again and
	// again.
	BlameLimit int
	// BlameWindow: a blame longer than this after the previous one starts
	// the count again (default 2 min).
	BlameWindow time.Duration
	// InProcess: the workers run in the proposer's process (tests,
	// benchmarks), so no partition can hide one that is alive: a world
	// needs no quorum (CheckQuorum).
	InProcess bool
}

// DefaultProposerConfig returns the defaults.
func DefaultProposerConfig() ProposerConfig {
	return ProposerConfig{
		Coalesce:     10 * time.Millisecond,
		MinWorkers:   1,
		ProbeTimeout: 500 * time.Millisecond,
		Reannounce:   time.Second,
		Resend:       25 * time.Millisecond,
		SyncTimeout:  2 * time.Second,
		BlameLimit:   3,
		BlameWindow:  2 * time.Minute,
	}
}

func (c ProposerConfig) withDefaults() ProposerConfig {
	d := DefaultProposerConfig()
	c.Coalesce = cmp.Or(c.Coalesce, d.Coalesce)
	c.MinWorkers = max(c.MinWorkers, d.MinWorkers)
	c.ProbeTimeout = cmp.Or(c.ProbeTimeout, d.ProbeTimeout)
	c.Reannounce = cmp.Or(c.Reannounce, d.Reannounce)
	c.Resend = min(cmp.Or(c.Resend, d.Resend), c.Reannounce)
	c.SyncTimeout = cmp.Or(c.SyncTimeout, d.SyncTimeout)
	c.BlameLimit = cmp.Or(c.BlameLimit, d.BlameLimit)
	c.BlameWindow = cmp.Or(c.BlameWindow, d.BlameWindow)
	return c
}

// Proposer is the proposing side of the epoch protocol as a pure state
// machine: it turns membership changes and the workers' reports into
// numbered epochs. It does no I/O, starts no goroutines and reads no clock:
// its caller feeds it inputs with Step and the passing of time with Tick,
// and carries out the outputs both return (sends, and the new epochs'
// notices). Given the same inputs at the same times it returns the same
// outputs. It is not safe for concurrent use.
//
// What it proposes: survivors keep their relative order and joiners are
// appended, so rank 0 of a new epoch is the oldest survivor. Changes closer
// together than Coalesce make one epoch, and none with fewer than MinWorkers
// members is proposed. Each epoch is sent to every worker in view (members,
// joiners waiting for an epoch with them, and leaving workers, which learn
// that they are out) and again every Reannounce.
type Proposer struct {
	cfg ProposerConfig

	workers map[string]Peer // alive workers in view, any state
	members []Member        // the desired membership, in rank order
	current World           // the newest epoch proposed (or taken over)
	// floor is the highest epoch number known to exist: another proposer's
	// epoch that this one has only heard the number of. The next proposal is
	// numbered above it.
	floor uint64

	dirty bool // a change since the last proposal
	// renew: a member reported that the current world failed; it waits for
	// a newer one, which is proposed even if no member is removed (the
	// blamed one proved alive: the world is re-formed as it is).
	renew      bool
	proposeAt  time.Time // end of the coalescing wait; zero: none pending
	announceAt time.Time // next re-announcement
	// resendAfter: the wait before the next re-announcement (Resend after a
	// proposal, doubling up to Reannounce).
	resendAfter time.Duration
	// The current epoch's acknowledgements, for the first re-send of the
	// next ones (firstResend): when it was proposed, how many workers it was
	// sent to then and how many have acknowledged it; halfAcked is how long
	// half of them took, for the newest epoch that half acknowledged.
	proposedAt time.Time
	sentTo     int
	acks       int
	halfAcked  time.Duration
	// acked: the newest epoch number each worker in view acknowledged
	// (a pong it sends on every epoch it receives). The current epoch is
	// re-announced only to workers that have not.
	acked map[string]uint64
	// census: the number of the last world whose failure had every member
	// probed (see report), or needed no census: the launcher lost a member
	// of it (see takeCensus).
	census uint64
	// explained: the newest world whose failure a member's death explains
	// (see explain).
	explained uint64
	// aliveIn: the world in which each worker last answered a probe. A
	// worker blamed again for that world is not probed again: in a large
	// world the reports of one failure trickle in for hundreds of
	// milliseconds, and a probe outstanding at every moment would hold the
	// next world back until the last report.
	aliveIn map[string]uint64

	nonce  uint64
	probes map[uint64]probe // liveness pings awaiting an answer, by nonce
	// lost are the members gossip declared dead whose liveness probe is
	// outstanding, with what was last seen of them: they stay members
	// meanwhile, and an answer puts them back in view (see probeDeath).
	lost map[string]Peer

	// suspects were removed for not answering a probe, at the time noted.
	// Evidence of life puts one back: a message from it while the current
	// world still includes it (its pong was late or lost) restores its
	// place; and one still ready in view after readmitAfter is admitted
	// again, as a worker that was only waiting to join does not leave when
	// an epoch leaves it out (a member does).
	suspects map[string]time.Time

	finished bool            // a member of the current world finished training
	done     map[string]bool // workers that reported the end of training
	// finishedIn is the world the first report of the end of training was
	// about: the one whose members hold the last step's state. late are
	// the members that were not in it (a cut-off pair admitted again just
	// as the others finished, a joiner): they never held that state, have
	// no last step to finish, and are out for good (dropLate).
	finishedIn uint64
	late       map[string]bool
	// recent are the newest worlds that were current, newest last (at most
	// maxRecent): who was a member of the world training finished in.
	recent []World
	// since: for each member of the current world, the number of the first
	// world of its unbroken run of memberships up to the current one. Its
	// report of the end of training counts only about a world from then on.
	since   map[string]uint64
	evicted map[string]bool
	// blames counts, per worker, the worlds whose failure blamed it
	// (BlameLimit); stuck are those it removed for that: never admitted
	// again under that name.
	blames   map[string]blameCount
	blamedIn map[string]blame // the world a blamed worker's outstanding probe is about
	// failed: who reported each recent world's failure (a member's first
	// report about a world counts, a repeat is refused; the rescue and the
	// stuck rule read it too).
	failed map[uint64]failedWorld
	stuck  map[string]bool

	sync *takeover // non-nil while taking over (see Resume)

	// live are the worlds that may still be training, oldest first: the
	// newest one every member of which acknowledged (or is known to be
	// gone), and every one proposed after it (its members may not have
	// received the next yet). Their members vote on the next world
	// (CheckQuorum), at most maxLive of them. departed are the workers
	// known to be gone (left, evicted, exited), who do not vote; a worker
	// gossip declared dead may be alive behind a partition, and does.
	live     []World
	departed map[string]bool
	// blocked is the last NoQuorum said, so that it is said once per
	// state rather than at every change.
	blocked *NoQuorum

	out []Output
}

// blameCount is a worker's record of blames it answered: the worlds (at
// most BlameLimit kept, newest last) whose failure blamed it although it
// proved alive, with who blamed it there.
type blameCount struct {
	worlds []blamedWorld
}

type blamedWorld struct {
	blame
	at time.Time // when its probe was answered
}

// failedWorld is what the proposer heard of a world's failure: its size
// and who reported it (kept for the last few worlds; see corroborated).
type failedWorld struct {
	size      int
	reporters []string
}

type probe struct {
	name     string
	deadline time.Time
	resendAt time.Time // the ping goes out again (a lost one must not condemn a live worker)
	sync     bool      // asks for the worker's newest epoch (takeover), not blame
	// census: one of the probes of every member of a failed world (see
	// takeCensus), not of a blamed one: its answer is not news.
	census bool
	// gossip: the probe of a member gossip declared dead (probeDeath): no
	// answer removes it as failed, as gossip's verdict would have.
	gossip bool
}

// takeover is the state of a proposer that continues another's numbering:
// before proposing it asks every worker in view which epoch it knows, so
// that it does not number a world like one the previous proposer announced.
type takeover struct {
	newest   World
	waiting  map[string]bool // workers not heard from yet
	deadline time.Time
	held     []Received // reports that arrived meanwhile, handled once it ends
	// adopting: a driver taking its job back (Adopt). It starts knowing no
	// epoch and no worker, so the sync ends only once it has heard the
	// newest epoch from every member of it (or at the deadline), not as
	// soon as nobody is left to ask.
	adopting bool
}

// NewProposer returns a proposer of a new job: no workers, no epoch yet.
func NewProposer(cfg ProposerConfig) *Proposer {
	return &Proposer{
		cfg:     cfg.withDefaults(),
		workers: map[string]Peer{}, probes: map[uint64]probe{}, lost: map[string]Peer{},
		done: map[string]bool{}, evicted: map[string]bool{}, suspects: map[string]time.Time{},
		blames: map[string]blameCount{}, blamedIn: map[string]blame{}, failed: map[uint64]failedWorld{}, stuck: map[string]bool{}, since: map[string]uint64{},
		acked: map[string]uint64{}, aliveIn: map[string]uint64{}, departed: map[string]bool{}, late: map[string]bool{},
	}
}

// blame is the world a blamed worker's outstanding probe is about, and who
// blamed it there (at most two distinct names kept).
type blame struct {
	number uint64
	by     []string
}

// Resume returns a proposer that takes over from another (the job's driver
// is gone): it continues the numbering from from, the newest epoch its
// member knows, with the workers in view. It first asks each of them for
// the newest epoch it knows (a ping, whose pong says) and proposes nothing
// until all have answered, left, or SyncTimeout has passed; then it
// continues from the newest epoch it heard of, dropping members that are no
// longer ready and appending ready workers that are not members.
func Resume(cfg ProposerConfig, now time.Time, from World, view []Peer) (*Proposer, []Output) {
	p := NewProposer(cfg)
	p.setCurrent(from)
	p.addLive(from)
	// The history of the members of the world taken over is not known
	// here: their reports of the end of training count about any world.
	for name := range p.since {
		p.since[name] = 1
	}
	p.members = slices.Clone(from.Members)
	p.sync = &takeover{newest: p.current, waiting: map[string]bool{}, deadline: now.Add(p.cfg.SyncTimeout)}
	for _, peer := range view {
		if !peer.Driver {
			p.workers[peer.Name] = peer
		}
	}
	for _, name := range p.workerNames() {
		if name != p.cfg.Self {
			p.sync.waiting[name] = true
			p.ping(now, name, true)
		}
	}
	p.settleSync(now)
	return p, p.flush()
}

// Adopt returns the proposer of a driver that takes a running job back
// (its previous driver died, and a worker proposes in its place): it knows
// no epoch and no worker yet. Each worker that comes into view is asked for
// the newest epoch it knows, as under Resume, and nothing is proposed until
// every member of the newest epoch heard of has answered (or left), or wait
// has passed. It then continues from that epoch: with the same ready
// members, no new epoch is proposed, and the workers go on in their world;
// the worker that proposed steps down as soon as it sees a driver.
func Adopt(cfg ProposerConfig, now time.Time, wait time.Duration) *Proposer {
	p := NewProposer(cfg)
	p.sync = &takeover{waiting: map[string]bool{}, deadline: now.Add(wait), adopting: true}
	return p
}

// ProbeTimeout is how long the proposer waits for a blamed worker's answer
// (ProposerConfig.ProbeTimeout, its default filled in).
func (p *Proposer) ProbeTimeout() time.Duration { return p.cfg.ProbeTimeout }

// Adopting reports whether this proposer is still learning the job it
// adopts (Adopt): it proposes nothing yet.
func (p *Proposer) Adopting() bool { return p.sync != nil && p.sync.adopting }

// Current is the newest epoch proposed (or taken over).
func (p *Proposer) Current() World { return p.current }

// Finished reports whether a member of the current world has said that
// training is over.
func (p *Proposer) Finished() bool { return p.finished }

// Unfinished lists the members of the current world that have not said that
// training is over, less those that came too late to finish (ReasonLate).
func (p *Proposer) Unfinished() []string {
	var out []string
	for _, m := range p.current.Members {
		if !p.done[m.Name] && !p.late[m.Name] {
			out = append(out, m.Name)
		}
	}
	return out
}

// StillTraining lists the members of the current world that have not said
// that training is over and are still in view: a worker that proposes stays
// until there are none after it finished itself, as its successor would not
// know that training is over.
func (p *Proposer) StillTraining() []string {
	var out []string
	for _, m := range p.current.Members {
		if _, alive := p.workers[m.Name]; alive && !p.done[m.Name] && !p.late[m.Name] && m.Name != p.cfg.Self {
			out = append(out, m.Name)
		}
	}
	// A member removed on suspicion may be admitted again to finish.
	for _, name := range slices.Sorted(maps.Keys(p.suspects)) {
		if _, alive := p.workers[name]; alive && !p.done[name] && !p.late[name] && p.current.Rank(name) < 0 {
			out = append(out, name)
		}
	}
	return out
}

// Syncing reports whether the proposer is still taking over (see Resume).
func (p *Proposer) Syncing() bool { return p.sync != nil }

// Step feeds the proposer one input at time now and returns what to do.
// Inputs for a Follower only (ReportFailure, ReportDone) are ignored.
func (p *Proposer) Step(now time.Time, in Input) []Output {
	switch in := in.(type) {
	case PeerSeen:
		p.seen(now, in.Peer)
	case PeerGone:
		if !in.Failed {
			p.departed[in.Name] = true
		}
		p.gone(now, in.Name, in.Failed, in.Failed)
	case Exited:
		p.departed[in.Name] = true
		p.settleLive()
		if _, inView := p.workers[in.Name]; inView || slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == in.Name }) {
			p.gone(now, in.Name, true, false)
		} else {
			p.change(now) // a vote less: a world waiting for a quorum may have it now
		}
	case Received:
		p.receive(now, in.From, in.Msg)
	case SendFailed:
		// A blamed worker (or one gossip declared dead) that cannot be
		// reached is as good as dead. A worker asked for its newest epoch
		// is asked again at the probe's deadline, not at once: the loop
		// would spin on a refused connection.
		if pr, ok := p.probes[in.Msg.Nonce]; ok && in.Msg.Kind == MsgPing && !pr.sync {
			p.unanswered(now, in.Msg.Nonce)
		}
	case Evict:
		p.evicted[in.Name] = true
		if in.Lost && p.current.Rank(in.Name) >= 0 && p.sync == nil {
			p.explain()
			// The world's failure needs no census, and one taken before
			// the loss is called off (see takeCensus); the probes of
			// blamed members go on.
			p.census = max(p.census, p.current.Number)
			for nonce, pr := range p.probes {
				if pr.census {
					delete(p.probes, nonce)
				}
			}
		}
		p.remove(now, in.Name, ReasonEvicted)
	case SetMinWorkers:
		p.cfg.MinWorkers = max(1, in.N)
		p.change(now)
	case SetFirstWorld:
		p.cfg.FirstWorld = max(0, in.N)
		p.change(now)
	}
	return p.flush()
}

// knownGone reports whether worker name is known to be gone for good (it does
// not vote on the next world, see CheckQuorum): it left or was evicted,
// its process exited, it finished training, it was removed as stuck
// (it answered its probes: it is in view, not behind a partition), or it
// came too late to the end of training (dropLate).
func (p *Proposer) knownGone(name string) bool {
	return p.departed[name] || p.evicted[name] || p.done[name] || p.stuck[name] || p.late[name]
}

// maxLive bounds the worlds kept as possibly training (a world whose
// members never all acknowledge it is superseded by later ones; the bound
// keeps a proposer whose acknowledgements never come from growing).
const maxLive = 32

// addLive records w as a world that may be training.
func (p *Proposer) addLive(w World) {
	if p.cfg.InProcess || w.Number == 0 || (len(p.live) > 0 && p.live[len(p.live)-1].Number >= w.Number) {
		return
	}
	p.live = append(p.live, cloneWorld(w))
	if len(p.live) > maxLive {
		p.live = slices.Delete(p.live, 0, len(p.live)-maxLive)
	}
	p.settleLive()
}

// settleLive drops the worlds older than the newest one that every member
// acknowledged (or is known to be gone): those members have moved on.
func (p *Proposer) settleLive() {
	for i := len(p.live) - 1; i > 0; i-- {
		adopted := true
		for _, m := range p.live[i].Members {
			if m.Name != p.cfg.Self && p.acked[m.Name] < p.live[i].Number && !p.knownGone(m.Name) {
				adopted = false
				break
			}
		}
		if adopted {
			p.live = slices.Delete(p.live, 0, i)
			return
		}
	}
}

// quorum checks the desired members against every world that may still be
// training; it returns the first verdict that fails (or the last one) and
// the number of its world. With none (no world has formed yet), it checks
// them against the job's first workers (CheckFirstQuorum), numbered 0.
func (p *Proposer) quorum() (Quorum, uint64) {
	if len(p.live) == 0 {
		return CheckFirstQuorum(p.cfg.FirstWorld, p.members, p.cfg.Self == ""), 0
	}
	var q Quorum
	var number uint64
	for _, w := range p.live {
		q, number = CheckQuorum(w, p.members, p.knownGone, p.cfg.Self == ""), w.Number
		if !q.OK() {
			break
		}
	}
	return q, number
}

// Tick tells the proposer that the time is now: pending proposals, probes
// and re-announcements whose time has come are carried out. Call it at
// Deadline (earlier or more often does no harm).
func (p *Proposer) Tick(now time.Time) []Output {
	if p.sync != nil && !now.Before(p.sync.deadline) {
		p.endSync(now)
	}
	for _, nonce := range slices.Sorted(maps.Keys(p.probes)) {
		switch pr := p.probes[nonce]; {
		case !now.Before(pr.deadline):
			p.unanswered(now, nonce)
		case !now.Before(pr.resendAt):
			pr.resendAt = now.Add(p.cfg.ProbeTimeout / probeTries)
			p.probes[nonce] = pr
			p.emit(Send{To: pr.name, Msg: Message{Kind: MsgPing, Nonce: nonce}})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.suspects)) {
		if !now.Before(p.suspects[name].Add(p.readmitAfter())) {
			p.readmit(now, name)
		}
	}
	if p.sync == nil && !p.proposeAt.IsZero() && !now.Before(p.proposeAt) && !p.verifying() {
		p.proposeAt = time.Time{}
		p.propose(now)
	}
	if p.sync == nil && p.current.Number > 0 && !now.Before(p.announceAt) {
		p.announce(now)
	}
	return p.flush()
}

// Deadline is when Tick must next be called; the zero time when nothing is
// pending.
func (p *Proposer) Deadline() time.Time {
	var d time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	for _, pr := range p.probes {
		earliest(pr.deadline)
		earliest(pr.resendAt)
	}
	for _, at := range p.suspects {
		earliest(at.Add(p.readmitAfter()))
	}
	if p.sync != nil {
		earliest(p.sync.deadline)
		return d
	}
	if !p.verifying() {
		earliest(p.proposeAt)
	}
	if p.current.Number > 0 {
		earliest(p.announceAt)
	}
	return d
}

func (p *Proposer) emit(o Output) { p.out = append(p.out, o) }

func (p *Proposer) flush() []Output {
	out := p.out
	p.out = nil
	return out
}

func (p *Proposer) seen(now time.Time, peer Peer) {
	if peer.Driver {
		return
	}
	_, known := p.workers[peer.Name]
	p.workers[peer.Name] = peer
	if nonce, ok := p.probing(peer.Name); ok && p.probes[nonce].gossip && peer.State != Leaving {
		// Gossip takes its verdict back (the member refuted it): that is
		// the answer its probe waited for.
		pr := p.probes[nonce]
		delete(p.probes, nonce)
		p.answered(now, pr)
	}
	if p.sync != nil && peer.Name != p.cfg.Self && !p.sync.waiting[peer.Name] && !known {
		// A worker new to the view may hold the previous proposer's newest
		// epoch too (a joiner is told the current one when it is ready).
		p.sync.waiting[peer.Name] = true
		p.ping(now, peer.Name, true)
	}
	if p.finished || p.sync != nil {
		// Training is over: a worker still arriving has nothing to do. (While
		// taking over, membership is settled once the sync ends.)
		return
	}
	switch peer.State {
	case Ready:
		if p.evicted[peer.Name] || p.stuck[peer.Name] {
			return
		}
		if peer.Addr == "" {
			p.emit(Ignored{Name: peer.Name, Why: "ready without a collective address"})
			return
		}
		if !slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == peer.Name }) {
			if r := p.current.Rank(peer.Name); r >= 0 && p.current.Members[r].Addr == peer.Addr {
				// A member that gossip declared dead is back (it refuted: a
				// starved or paused process) before a world without it was
				// proposed: it keeps its place, so that its return alone
				// proposes no new world. Appended, it would reorder the
				// ranks, and every such flap under load would cost the job
				// a world change.
				p.members = p.inCurrentOrder(peer.Name)
			} else {
				p.members = append(p.members, Member{Name: peer.Name, Addr: peer.Addr})
			}
		}
		p.change(now)
		// Tell it where the job stands, so it knows which epoch to wait past.
		if p.current.Number > 0 {
			p.emit(Send{To: peer.Name, Msg: Message{Kind: MsgEpoch, World: p.current}})
		}
	case Leaving:
		p.departed[peer.Name] = true
		p.remove(now, peer.Name, ReasonLeaving)
	}
}

// gone handles a worker that left the view: gracefully, or declared dead
// (failed). With probe (gossip's verdict, not a known exit), a member of the
// current world is probed first (probeDeath) and removed only if it does
// not answer.
func (p *Proposer) gone(now time.Time, name string, failed, probe bool) {
	peer, inView := p.workers[name]
	delete(p.workers, name)
	delete(p.lost, name)
	if probe && inView && p.probeDeath(now, name, peer) {
		return
	}
	delete(p.acked, name)
	delete(p.aliveIn, name)
	blamed := false
	if nonce, ok := p.probing(name); ok {
		blamed = !p.probes[nonce].sync && !p.probes[nonce].gossip
		delete(p.probes, nonce) // its departure settles the question
	}
	if p.sync != nil && p.sync.waiting[name] {
		delete(p.sync.waiting, name)
		p.settleSync(now)
	}
	if (p.finished && !blamed) || p.sync != nil {
		// Workers leaving once training is over are going home, not
		// shrinking the job (unless a collective failed on one).
		return
	}
	why := ReasonLeft
	if failed {
		why = ReasonFailed
	}
	p.remove(now, name, why)
}

// probeDeath starts the liveness probe of a member of the current world that
// gossip declared dead, and reports whether it did: the member stays until
// it answers (it keeps its place, and is back in view) or ProbeTimeout
// passes (it is removed as failed). Gossip's verdict is a suspicion too:
// under load a live but starved worker misses its gossip probes, and
// removing it at once would cost the job a world change, and the worker a
// rejoin, for nothing. A dead worker costs no more than before: its
// control port refuses the ping (a failed send counts as no answer at
// once), and its links break, so the survivors blame it.
func (p *Proposer) probeDeath(now time.Time, name string, peer Peer) bool {
	if p.sync != nil || p.finished || name == p.cfg.Self || p.current.Rank(name) < 0 ||
		!slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == name }) {
		return false
	}
	p.lost[name] = peer
	if _, ok := p.probing(name); ok {
		return true // already asked (blamed, or a census): its answer settles this too
	}
	p.ping(now, name, false)
	pr := p.probes[p.nonce]
	pr.gossip = true
	p.probes[p.nonce] = pr
	return true
}

// remove drops name from the desired membership: the next epoch is without it.
func (p *Proposer) remove(now time.Time, name string, why Reason) {
	if i := slices.IndexFunc(p.members, func(m Member) bool { return m.Name == name }); i >= 0 {
		p.members = slices.Delete(p.members, i, i+1)
		p.emit(Removed{Name: name, Why: why})
		if (why == ReasonFailed || why == ReasonUnanswered) && p.current.Rank(name) >= 0 {
			p.explain()
		}
	}
	p.change(now)
}

// explain marks the current world's failure as explained by a death: the
// live members blamed for it (survivors that aborted are blamed by their
// neighbours) were not stuck, and the blame does not count towards
// BlameLimit. Without this, a death during a transition (the worlds formed
// one after another while members die) has a large world lose healthy
// members as stuck.
func (p *Proposer) explain() {
	if p.explained == p.current.Number {
		return
	}
	p.explained = p.current.Number
	for name, b := range p.blames {
		b.worlds = slices.DeleteFunc(b.worlds, func(w blamedWorld) bool { return w.number == p.explained })
		p.blames[name] = b
	}
}

// soon starts the coalescing wait before a proposal unless one is running.
// A failure's reports trickle in over the members' I/O timeouts (in a large
// world, for hundreds of milliseconds); restarting the wait at each would
// put the new world off until the last report. The census (takeCensus)
// holds the proposal until every member answered instead.
func (p *Proposer) soon(now time.Time) {
	p.dirty = true
	if p.proposeAt.IsZero() {
		p.proposeAt = now.Add(p.cfg.Coalesce)
	}
}

// change starts (or restarts) the coalescing wait before a proposal.
func (p *Proposer) change(now time.Time) {
	p.dirty = true
	p.proposeAt = now.Add(p.cfg.Coalesce)
}

func (p *Proposer) propose(now time.Time) {
	if !p.dirty {
		return
	}
	if len(p.members) < p.cfg.MinWorkers {
		p.emit(Waiting{Have: len(p.members), Min: p.cfg.MinWorkers})
		return
	}
	p.dirty = false
	if !p.renew && p.floor <= p.current.Number && slices.Equal(p.members, p.current.Members) {
		return
	}
	p.settleLive()
	if q, base := p.quorum(); !q.OK() && !p.cfg.InProcess {
		// Members only suspected of being gone may be training on the
		// other side of a partition: wait for them, for news that they
		// are gone, or for the other side's world.
		p.dirty = true
		nq := NoQuorum{Base: base, Quorum: q}
		if p.blocked == nil || p.blocked.Base != nq.Base || !slices.Equal(p.blocked.Quorum.Missing, q.Missing) || p.blocked.Quorum.Present != q.Present {
			p.blocked = &nq
			p.emit(nq)
		}
		return
	}
	p.blocked = nil
	next := max(p.current.Number, p.floor) + 1
	if next > MaxNumber {
		// Unreachable: numbers from messages are checked against MaxNumber
		// and MaxLead. Never wrap to 0, which every worker would refuse.
		p.emit(Refused{Msg: Message{Kind: MsgEpoch, World: World{Number: next}},
			Err: checkNumber(next, MaxNumber)})
		return
	}
	p.renew = false
	first := p.firstResend()
	p.setCurrent(World{Number: next, Members: slices.Clone(p.members)})
	p.emit(Proposed{World: p.current})
	p.addLive(p.current)
	p.resendAfter = first
	sends := len(p.out)
	p.announce(now)
	p.proposedAt, p.sentTo, p.acks = now, len(p.out)-sends, 0
}

// firstResend is how long a new epoch waits before it is first sent again:
// Resend, or twice the time half the workers took to acknowledge the last
// epoch when that was longer (at most Reannounce). A worker whose copy was
// lost still gets another within a few acknowledgement times; the others'
// acknowledgements are not overtaken by copies they do not need.
func (p *Proposer) firstResend() time.Duration {
	return min(max(p.cfg.Resend, 2*p.halfAcked), p.cfg.Reannounce)
}

// acknowledged counts a worker's first acknowledgement of the current
// epoch (see firstResend).
func (p *Proposer) acknowledged(now time.Time) {
	if p.proposedAt.IsZero() || p.sentTo == 0 {
		return
	}
	p.acks++
	if 2*p.acks == p.sentTo || 2*p.acks == p.sentTo+1 {
		p.halfAcked = now.Sub(p.proposedAt)
	}
}

// announce sends the current epoch to every worker in view that has not
// acknowledged it: its members, joiners waiting for an epoch with them, and
// the workers it leaves out, who learn that they are out. Once training is
// over, workers that are going home (leaving, or said they are done) are
// not told any more. The next announcement is due after resendAfter, which
// doubles each time up to Reannounce.
func (p *Proposer) announce(now time.Time) {
	wait := cmp.Or(p.resendAfter, p.cfg.Reannounce)
	p.announceAt = now.Add(wait)
	p.resendAfter = min(2*wait, p.cfg.Reannounce)
	for _, name := range p.workerNames() {
		if p.done[name] || (p.finished && p.workers[name].State == Leaving) || p.acked[name] >= p.current.Number {
			continue
		}
		// A worker left out that will not be admitted again is told so: it
		// must not come back as a new member.
		final := p.current.Rank(name) < 0 && (p.evicted[name] || p.finished)
		p.emit(Send{To: name, Msg: Message{Kind: MsgEpoch, World: p.current, Final: final}})
	}
}

// workerNames lists the workers in view by name, for a deterministic order.
func (p *Proposer) workerNames() []string {
	return slices.Sorted(maps.Keys(p.workers))
}

// known is the newest epoch number this proposer knows of: the bound of
// the numbers it takes from messages (MaxLead).
func (p *Proposer) known() uint64 {
	n := max(p.current.Number, p.floor)
	if p.sync != nil {
		n = max(n, p.sync.newest.Number)
		if p.sync.adopting && n == 0 {
			// A driver adopting a job knows no epoch yet: the job's
			// numbering may be anywhere (as for a worker that knows none).
			n = MaxNumber
		}
	}
	return n
}

func (p *Proposer) receive(now time.Time, from string, msg Message) {
	if err := checkNumber(messageNumber(msg), p.known()); err != nil {
		p.emit(Refused{From: from, Msg: msg, Err: err})
		return
	}
	p.heardFrom(now, from)
	switch msg.Kind {
	case MsgPong:
		if _, inView := p.workers[from]; inView && msg.World.Number > p.acked[from] {
			if msg.World.Number == p.current.Number {
				p.acknowledged(now)
			}
			p.acked[from] = msg.World.Number
			p.settleLive()
		}
		pr, ok := p.probes[msg.Nonce]
		if !ok || pr.name != from {
			p.learn(now, msg.World) // an acknowledgement (Follower answers each epoch)
			return
		}
		delete(p.probes, msg.Nonce)
		if pr.sync {
			if p.sync != nil && p.sync.waiting[from] {
				delete(p.sync.waiting, from)
				if msg.World.Number > p.sync.newest.Number {
					p.sync.newest = cloneWorld(msg.World)
				}
				p.settleSync(now)
			}
			return
		}
		p.answered(now, pr)
		p.learn(now, msg.World)
	case MsgEpoch:
		// Another proposer's epoch (two proposers while views disagree).
		if p.sync != nil && msg.World.Number > p.sync.newest.Number {
			p.sync.newest = cloneWorld(msg.World)
		}
		p.learn(now, msg.World)
	case MsgDone, MsgFailure:
		if p.sync != nil {
			p.sync.held = append(p.sync.held, Received{From: from, Msg: msg})
			return
		}
		p.report(now, from, msg)
	}
}

// heardFrom: a message from a suspect proves it alive; it takes its place in
// the current world again.
func (p *Proposer) heardFrom(now time.Time, name string) {
	if nonce, ok := p.probing(name); ok && !p.probes[nonce].sync {
		pr := p.probes[nonce]
		delete(p.probes, nonce) // any message answers the probe
		p.answered(now, pr)
		return
	}
	if _, ok := p.suspects[name]; !ok || p.current.Rank(name) < 0 {
		return
	}
	delete(p.suspects, name)
	if peer, ok := p.workers[name]; !ok || peer.State != Ready || p.evicted[name] || p.stuck[name] || p.finished {
		return
	}
	p.members = p.inCurrentOrder(name)
	p.emit(Cleared{Name: name})
	p.change(now)
}

// inCurrentOrder returns the desired members with name, a member of the
// current world, added back: the current world's members first, in its
// order, then the others as they are.
func (p *Proposer) inCurrentOrder(name string) []Member {
	desired := map[string]bool{name: true}
	for _, m := range p.members {
		desired[m.Name] = true
	}
	members := make([]Member, 0, len(p.members)+1)
	for _, m := range p.current.Members {
		if desired[m.Name] {
			members = append(members, m)
			delete(desired, m.Name)
		}
	}
	for _, m := range p.members {
		if desired[m.Name] {
			members = append(members, m)
		}
	}
	return members
}

// readmitAfter is how long a worker removed on suspicion stays out before it
// is admitted again if it is still ready: time for a member that was left out
// to learn it (re-announcements) and leave.
func (p *Proposer) readmitAfter() time.Duration { return 2 * p.cfg.Reannounce }

// readmit admits a suspect again if it is still a ready worker in view: it was
// waiting to join (a member left out of a world leaves), or, once training
// is over, it has still to finish (it was a member, not a newcomer).
func (p *Proposer) readmit(now time.Time, name string) {
	delete(p.suspects, name)
	peer, ok := p.workers[name]
	if !ok || peer.State != Ready || p.evicted[name] || p.stuck[name] || p.done[name] || p.late[name] || p.sync != nil ||
		slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == name }) {
		return
	}
	p.members = append(p.members, Member{Name: name, Addr: peer.Addr})
	p.emit(Cleared{Name: name})
	p.change(now)
}

// report handles a worker's report: training done, or a collective failed.
func (p *Proposer) report(now time.Time, from string, msg Message) {
	switch msg.Kind {
	case MsgDone:
		// Only a member of the current world ends training, and only about
		// a world of its current membership: an older report (from before
		// it was left out and came back) is stale.
		if since, ok := p.since[from]; !ok || p.current.Rank(from) < 0 || msg.Number < since {
			p.emit(Refused{From: from, Msg: msg, Err: ErrNotMember})
			return
		}
		p.done[from] = true
		if !p.finished {
			p.finishedIn = msg.Number
		}
		p.finished = true
		p.emit(Finished{By: from, Number: msg.Number})
		p.dropLate(now)
		p.rescue(now)
	case MsgFailure:
		if _, inView := p.workers[from]; inView || from == p.cfg.Self {
			p.raise(now, msg.Number)
		}
		if msg.Number != p.current.Number {
			return // about a world already replaced
		}
		if p.current.Rank(from) < 0 {
			p.emit(Refused{From: from, Msg: msg, Err: ErrNotMember})
			return
		}
		if slices.Contains(p.failed[msg.Number].reporters, from) {
			// One report per member and world: a flood of them neither
			// blames more members nor keeps postponing the proposal.
			p.emit(Refused{From: from, Msg: msg, Err: ErrRepeated})
			return
		}
		p.noteFailure(from, msg.Number)
		p.renew = true
		p.soon(now)
		p.rescue(now)
		defer p.takeCensus(now, from)
		if msg.Blamed == "" || p.current.Rank(msg.Blamed) < 0 {
			return // no one, or no one of this world, to suspect
		}
		p.emit(Suspected{Name: msg.Blamed, By: from, Number: msg.Number, Cause: msg.Cause})
		if p.stuckIn(now, msg.Blamed, msg.Number) {
			p.stuck[msg.Blamed] = true
			p.remove(now, msg.Blamed, ReasonStuck)
			return
		}
		bl := p.blamedIn[msg.Blamed]
		if bl.number != msg.Number {
			bl = blame{number: msg.Number}
		}
		bl.by = addAccuser(bl.by, from)
		p.blamedIn[msg.Blamed] = bl
		p.verify(now, msg.Blamed)
	}
}

// raise notes that epoch number n exists. A number above the current one
// was proposed by another proposer (one this proposer took over from, or one
// that ran beside it while their views disagreed): the next epoch is
// numbered above it, and proposed even if the membership is unchanged, as
// this proposer does not know that world.
func (p *Proposer) raise(now time.Time, n uint64) {
	if n > max(p.current.Number, p.floor) {
		p.floor = n
		if p.sync == nil {
			p.change(now)
		}
	}
}

// learn takes a newer world that another proposer announced as the current
// one: its surviving members keep their order, and this proposer's other
// desired members are appended.
func (p *Proposer) learn(now time.Time, w World) {
	if w.Number <= p.current.Number || p.sync != nil {
		return
	}
	p.rebase(w, false)
	p.change(now)
}

// rebase continues from world w: its members that are still ready (and not
// evicted) keep their order, then come the desired members it lacks, and
// with joiners, the ready workers in view that are in neither, oldest first.
func (p *Proposer) rebase(w World, joiners bool) {
	keep := func(name string) bool {
		peer, ok := p.workers[name]
		return ok && peer.State == Ready && peer.Addr != "" && !p.evicted[name] && !p.stuck[name]
	}
	members := make([]Member, 0, len(w.Members)+len(p.members))
	has := map[string]bool{}
	add := func(m Member) {
		if !has[m.Name] && keep(m.Name) {
			has[m.Name] = true
			members = append(members, m)
		}
	}
	for _, m := range w.Members {
		add(m)
	}
	for _, m := range p.members {
		add(m)
	}
	if joiners {
		peers := slices.Collect(maps.Values(p.workers))
		slices.SortFunc(peers, func(a, b Peer) int {
			return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), strings.Compare(a.Name, b.Name))
		})
		for _, peer := range peers {
			add(Member{Name: peer.Name, Addr: peer.Addr})
		}
	}
	p.setCurrent(w)
	// Another proposer's world (or, taking over, the newest one the
	// workers know) may be training too.
	p.addLive(w)
	p.floor = max(p.floor, w.Number)
	p.members = members
}

// setCurrent makes w the current world, and keeps since: a member of the
// previous current world keeps its start, a new one starts at w.
func (p *Proposer) setCurrent(w World) {
	since := make(map[string]uint64, len(w.Members))
	for _, m := range w.Members {
		if n, ok := p.since[m.Name]; ok && p.current.Rank(m.Name) >= 0 {
			since[m.Name] = n
		} else {
			since[m.Name] = w.Number
		}
	}
	p.current = cloneWorld(w)
	p.since = since
	if w.Number > 0 {
		p.recent = append(p.recent, p.current)
		if len(p.recent) > maxRecent {
			p.recent = slices.Delete(p.recent, 0, len(p.recent)-maxRecent)
		}
	}
}

// maxRecent bounds Proposer.recent: the end of training is reported about
// the world its members trained the last step in, at most a few worlds
// behind the newest one.
const maxRecent = 8

// memberOf reports whether name was a member of world number n, as far as
// this proposer knows: from the recent worlds, or, for an older one, from
// the member's unbroken run of memberships up to the current world (since).
func (p *Proposer) memberOf(name string, n uint64) bool {
	for _, w := range p.recent {
		if w.Number == n {
			return w.Rank(name) >= 0
		}
	}
	since, ok := p.since[name]
	return ok && since <= n
}

// dropLate leaves out for good, once training is over, the members (of the
// current world, or desired for the next) that were not members of the
// world training finished in (finishedIn) and have not finished: workers
// admitted as the others finished, such as a cut-off pair back after a
// partition healed. They never held the state of that world's last step.
// A world of their own would train on from the state they hold — one from
// before they were cut off, or none — and redo steps the job has done;
// the rescue is for members of that world only. The next world leaves them
// out (however few members remain: the job is ending), and they are told
// that they will not be admitted again.
func (p *Proposer) dropLate(now time.Time) {
	var late []string
	for _, m := range slices.Concat(p.current.Members, p.members) {
		if !p.done[m.Name] && !p.memberOf(m.Name, p.finishedIn) && !slices.Contains(late, m.Name) {
			late = append(late, m.Name)
		}
	}
	if len(late) == 0 {
		return
	}
	p.cfg.MinWorkers = 1
	for _, name := range late {
		p.late[name] = true
		p.remove(now, name, ReasonLate)
	}
	p.settleLive()
}

// settleSync ends the takeover once every worker asked has answered or gone.
func (p *Proposer) settleSync(now time.Time) {
	if p.sync == nil || len(p.sync.waiting) > 0 {
		return
	}
	if p.sync.adopting {
		// Adopting, the view fills as the workers come back: a member of
		// the newest epoch not in view yet would be left out of the world.
		newest := p.sync.newest
		if newest.Number == 0 {
			return
		}
		for _, m := range newest.Members {
			if _, ok := p.workers[m.Name]; !ok {
				return
			}
		}
	}
	p.endSync(now)
}

func (p *Proposer) endSync(now time.Time) {
	s := p.sync
	p.sync = nil
	for nonce, pr := range p.probes {
		if pr.sync {
			delete(p.probes, nonce)
		}
	}
	p.rebase(s.newest, true)
	var unheard []string
	if len(s.waiting) > 0 {
		unheard = slices.Sorted(maps.Keys(s.waiting))
	}
	p.emit(TookOver{World: p.current, Unheard: unheard, Adopted: s.adopting})
	p.announceAt = now.Add(p.cfg.Reannounce)
	p.change(now)
	for _, r := range s.held {
		p.report(now, r.From, r.Msg)
	}
}

// rescue lets the workers of the last world that have not finished training
// finish it. A collective of the final step can complete on some workers and
// fail on others; those that completed finish and leave, and the others,
// which report the failure, need a world to redo the step in: the current one
// without the finished workers, however few remain (the minimum world size is
// about training speed, and the job is ending). It acts once training has
// finished and some unfinished member of the current world has reported a
// failure in it, whichever comes first.
//
// A failure reported in an earlier world since training finished counts too:
// the reporter is still redoing the last step. A world proposed without the
// members finished so far can still hold one whose report of its end was on
// its way; the reporter, entering that world, waits for a link to it that
// will never come (a finished worker enters no world) and cannot report the
// new world's failure, so that member's report must rescue it.
func (p *Proposer) rescue(now time.Time) {
	if !p.finished {
		return
	}
	stuck := false
	for number, f := range p.failed {
		if number < p.finishedIn {
			continue
		}
		for _, name := range f.reporters {
			stuck = stuck || (p.current.Rank(name) >= 0 && !p.done[name] && !p.late[name])
		}
	}
	var finished []string
	for _, m := range p.current.Members {
		if p.done[m.Name] {
			finished = append(finished, m.Name)
		}
	}
	if !stuck || len(finished) == 0 {
		return
	}
	p.emit(Rescued{Number: p.current.Number, Finished: finished})
	p.cfg.MinWorkers = 1
	for _, name := range finished {
		p.remove(now, name, ReasonFinished)
	}
}

// answered handles the answer to a liveness probe (not a takeover's): a
// blamed worker is cleared of suspicion and its blame counted; a census's
// answer is not news.
func (p *Proposer) answered(now time.Time, pr probe) {
	if !pr.census {
		p.emit(Cleared{Name: pr.name})
	}
	if peer, ok := p.lost[pr.name]; ok {
		// Gossip declared it dead, but it answers: it is seen, back in view
		// (gossip's own "alive", when it comes, finds it there).
		delete(p.lost, pr.name)
		if _, inView := p.workers[pr.name]; !inView {
			p.workers[pr.name] = peer
		}
	}
	p.aliveIn[pr.name] = p.current.Number
	p.answeredBlame(now, pr.name)
}

// answeredBlame counts a blamed worker's answer to its probe: the world
// it was blamed for (blamedIn) failed although it is alive.
func (p *Proposer) answeredBlame(now time.Time, name string) {
	bl, ok := p.blamedIn[name]
	if !ok {
		return
	}
	delete(p.blamedIn, name)
	if bl.number == p.explained {
		return // a death explains that world's failure
	}
	b := p.blames[name]
	if k := len(b.worlds); k > 0 && b.worlds[k-1].number == bl.number {
		for _, by := range bl.by { // blamed for that world by another member too
			b.worlds[k-1].by = addAccuser(b.worlds[k-1].by, by)
		}
	} else {
		b.worlds = append(b.worlds, blamedWorld{blame: bl, at: now})
		if len(b.worlds) > p.cfg.BlameLimit {
			b.worlds = slices.Delete(b.worlds, 0, len(b.worlds)-p.cfg.BlameLimit)
		}
	}
	p.blames[name] = b
}

// noteFailure records that member from reported the failure of world
// number, the current one.
func (p *Proposer) noteFailure(from string, number uint64) {
	f := p.failed[number]
	f.size = len(p.current.Members)
	f.reporters = append(f.reporters, from)
	p.failed[number] = f
	for n := range p.failed {
		if n+uint64(2*p.cfg.BlameLimit) < number {
			delete(p.failed, n) // older than any blame stuckIn still counts
		}
	}
}

// corroborated reports whether the blame of name in world bl.number is
// evidence that name was stuck: name itself did not report that failure
// (a member that did was waiting on another, a victim of the failure, not
// its cause), and two members blamed it or a member other than its accuser
// reported the failure too (a lying member cannot make a world fail for
// the others), unless the world had two members and the accuser was the
// only witness there was.
func (p *Proposer) corroborated(name string, bl blame) bool {
	f := p.failed[bl.number]
	if slices.Contains(f.reporters, name) {
		return false
	}
	return f.size <= 2 || len(bl.by) >= 2 || slices.ContainsFunc(f.reporters, func(r string) bool { return !slices.Contains(bl.by, r) })
}

// addAccuser adds by to the accusers kept (at most two distinct names).
func addAccuser(accusers []string, by string) []string {
	if len(accusers) >= 2 || slices.Contains(accusers, by) {
		return accusers
	}
	return append(slices.Clone(accusers), by)
}

// stuckIn reports whether a worker blamed for the failure of world number
// is stuck: it answered the probes of BlameLimit-1 earlier blames, each
// within BlameWindow of the next, each corroborated (see corroborated), and
// the world can do without it (MinWorkers). One member alone, however often
// it blames, cannot have a healthy worker removed: the other members would
// have to report the same worlds failing, and the blamed worker not. In a
// ring a stuck worker is blamed by the member that receives from it, while
// the others blame the neighbour they wait on, which reports its own
// failure: so a single accuser must be enough when the others corroborate.
func (p *Proposer) stuckIn(now time.Time, name string, number uint64) bool {
	if name == p.cfg.Self || !slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == name }) ||
		len(p.members)-1 < p.cfg.MinWorkers {
		return false
	}
	// The earlier worlds, newest first, each within BlameWindow of the
	// one after it.
	count, after := 0, now
	b := p.blames[name]
	for i := len(b.worlds) - 1; i >= 0 && count < p.cfg.BlameLimit-1; i-- {
		w := b.worlds[i]
		if w.number >= number || after.Sub(w.at) > p.cfg.BlameWindow {
			break
		}
		if !p.corroborated(name, w.blame) {
			break // a break in the evidence: the count starts again
		}
		count++
		after = w.at
	}
	return count >= p.cfg.BlameLimit-1
}

// takeCensus probes every member of the current world once, at its first
// failure report (but the reporter, which just spoke): the world is formed
// again only after each has answered or been removed. A failure's reports blame whichever neighbour's links broke
// first — in a large world mostly survivors that aborted — and the report
// blaming the dead member may come last; without the census the world
// would be formed again with the dead member in it, and fail again, once
// per report that arrives before that one.
func (p *Proposer) takeCensus(now time.Time, reporter string) {
	// (A world a member of which the launcher lost failed for that, and
	// takes none: Step marks its census taken. The launcher takes out all
	// the workers of a lost host at once, so the dead are out of the next
	// world already, and a census would cost that world the slowest
	// survivor's answer: at 16 workers on 2 cores, 40 ms.)
	if p.census >= p.current.Number || p.finished {
		return
	}
	p.census = p.current.Number
	for _, m := range p.current.Members {
		if _, ok := p.probing(m.Name); ok || m.Name == p.cfg.Self || m.Name == reporter || !slices.ContainsFunc(p.members, func(d Member) bool { return d.Name == m.Name }) {
			continue
		}
		if _, inView := p.workers[m.Name]; !inView {
			continue
		}
		p.ping(now, m.Name, false)
		pr := p.probes[p.nonce]
		pr.census = true
		p.probes[p.nonce] = pr
	}
}

// verify removes a worker blamed for a collective failure unless it proves to
// be alive. Blame is only a suspicion: when one worker dies, a neighbour of a
// survivor that aborted sees that survivor's links close too, and blames it.
func (p *Proposer) verify(now time.Time, name string) {
	_, inView := p.workers[name]
	if _, lost := p.lost[name]; !inView && !lost {
		p.remove(now, name, ReasonUnanswered)
		return
	}
	if name == p.cfg.Self {
		return // the worker running this proposer is alive
	}
	if p.evicted[name] {
		// Out of the job for good already (the launcher lost its host, or
		// a scale-down): its answer would change nothing, and waiting for
		// it would hold the next world back, for a probe's timeout when
		// its host died silently.
		return
	}
	if p.aliveIn[name] == p.current.Number {
		p.answeredBlame(now, name) // it answered a probe about this world already
		return
	}
	if nonce, ok := p.probing(name); ok {
		pr := p.probes[nonce]
		// Already asked (a census, or gossip declared it dead): its answer
		// clears a suspect now, and no answer makes it one.
		pr.census, pr.gossip = false, false
		p.probes[nonce] = pr
		return
	}
	p.ping(now, name, false)
}

// verifying reports whether a blamed worker's probe is outstanding: a
// proposal waits for its outcome, so that one failure costs one epoch.
func (p *Proposer) verifying() bool {
	for _, pr := range p.probes {
		if !pr.sync {
			return true
		}
	}
	return false
}

// probing returns the nonce of an outstanding probe of name.
func (p *Proposer) probing(name string) (uint64, bool) {
	for nonce, pr := range p.probes {
		if pr.name == name {
			return nonce, true
		}
	}
	return 0, false
}

// probeTries is how many pings a probe sends within ProbeTimeout.
const probeTries = 3

func (p *Proposer) ping(now time.Time, name string, sync bool) {
	p.nonce++
	p.probes[p.nonce] = probe{name: name, deadline: now.Add(p.cfg.ProbeTimeout),
		resendAt: now.Add(p.cfg.ProbeTimeout / probeTries), sync: sync}
	p.emit(Send{To: name, Msg: Message{Kind: MsgPing, Nonce: p.nonce}})
}

// unanswered handles a probe that got no answer in time (or could not be
// sent): a blamed worker is removed, and so is a member gossip declared
// dead; a worker asked for its newest epoch is asked again until the
// takeover's deadline.
func (p *Proposer) unanswered(now time.Time, nonce uint64) {
	pr, ok := p.probes[nonce]
	if !ok {
		return
	}
	delete(p.probes, nonce)
	if pr.sync {
		if p.sync != nil && p.sync.waiting[pr.name] {
			p.ping(now, pr.name, true)
		}
		return
	}
	if _, lost := p.lost[pr.name]; lost {
		delete(p.lost, pr.name)
		delete(p.acked, pr.name)
		delete(p.aliveIn, pr.name)
	}
	if pr.gossip {
		// Gossip's verdict stands: removed as failed, as without the probe
		// (once training is over, a departure shrinks nothing: see gone).
		if !p.finished {
			p.remove(now, pr.name, ReasonFailed)
		}
		return
	}
	if slices.ContainsFunc(p.members, func(m Member) bool { return m.Name == pr.name }) {
		p.suspects[pr.name] = now
	}
	p.remove(now, pr.name, ReasonUnanswered)
}

func cloneWorld(w World) World { return World{Number: w.Number, Members: slices.Clone(w.Members)} }
