package driver

import (
	"context"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// probeTimeout bounds the liveness check of a worker blamed for a failure.
const probeTimeout = 500 * time.Millisecond

// reannounce is how often the current epoch is sent again to every worker:
// gossip messages may be lost or reordered, and a worker that missed its
// epoch would wait for it forever.
const reannounce = time.Second

// Proposer turns membership changes into epochs and announces them: the
// driver runs one, and so does the oldest ready worker of a job whose driver is
// gone (or that never had one). It reads membership events and control
// messages from channels its owner feeds, because a worker's owner also needs
// them.
type Proposer struct {
	m     *membership.Member
	log   *slog.Logger
	coord *Coordinator

	mu      stdsync.Mutex
	workers map[string]membership.Node // alive workers, by name
	probes  map[uint64]chan struct{}   // liveness checks waiting for a pong
	nonce   uint64

	finished     chan struct{} // closed when a worker of the current world finished training
	finishedOnce stdsync.Once
	// Under mu: the workers that said they finished training, and the epoch
	// of each worker's latest collective failure report (see rescue).
	finishedWorkers map[string]bool
	reported        map[string]uint64

	hooks   proposerHooks
	evicted map[string]bool // removed by the driver's own decision: never re-admitted

	events   chan membership.Event
	messages chan membership.Message
	epochs   chan epoch.World
	cancel   context.CancelFunc
	done     chan struct{}
}

// proposerHooks lets the driver watch what its proposer does. Both are called
// on the proposer's goroutine and must not block.
type proposerHooks struct {
	onEpoch func(epoch.World)                  // every proposed epoch, in order
	onStats func(worker string, b stats.Batch) // every worker's step statistics
}

// startProposer starts proposing from the given epoch on (the zero epoch.World for a
// new job), with the alive workers in nodes.
func startProposer(m *membership.Member, cc CoordinatorConfig, from epoch.World, nodes []membership.Node, hooks proposerHooks, log *slog.Logger) *Proposer {
	p := &Proposer{
		m: m, log: log, workers: map[string]membership.Node{}, probes: map[uint64]chan struct{}{},
		hooks: hooks, evicted: map[string]bool{}, finishedWorkers: map[string]bool{}, reported: map[string]uint64{},
		events: make(chan membership.Event, 256), messages: make(chan membership.Message, 256),
		epochs: make(chan epoch.World, 64), done: make(chan struct{}), finished: make(chan struct{}),
	}
	cc.OnEpoch = func(e epoch.World) { p.epochs <- e }
	cc.Logger = log
	p.coord = NewCoordinator(cc)
	p.coord.seed(from)
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	alive := map[string]bool{}
	for _, n := range nodes {
		p.onEvent(ctx, membership.Event{Kind: membership.EventJoined, Node: n})
		alive[n.Name] = n.Meta.Role == membership.RoleWorker && n.Meta.State == membership.StateReady
	}
	// Members of the epoch taken over that are gone by now leave at once.
	for _, mem := range from.Members {
		if !alive[mem.Name] {
			p.coord.Remove(mem.Name)
		}
	}
	go p.coord.Run(ctx)
	go p.loop(ctx)
	return p
}

// StartProposer starts proposing epochs from world from on (the zero World
// for a new job), with the alive members in nodes: a worker runs one while the
// job has no driver and it is the job's oldest ready worker (ElectProposer).
// Feed it the member's events and messages with Event and Message.
func StartProposer(m *membership.Member, cc CoordinatorConfig, from epoch.World, nodes []membership.Node, log *slog.Logger) *Proposer {
	return startProposer(m, cc, from, nodes, proposerHooks{}, log)
}

// Event hands the proposer a membership event.
func (p *Proposer) Event(ev membership.Event) { p.events <- ev }

// Message hands the proposer a control message.
func (p *Proposer) Message(msg membership.Message) { p.messages <- msg }

// ElectProposer names the member that proposes epochs: the driver while one is
// alive, else the oldest ready worker (Members is sorted oldest first). Every
// member computes the same answer from the same membership view.
func ElectProposer(nodes []membership.Node) string {
	for _, n := range nodes {
		if n.Meta.Role == membership.RoleDriver {
			return n.Name
		}
	}
	for _, n := range nodes {
		if n.Meta.Role == membership.RoleWorker && n.Meta.State == membership.StateReady {
			return n.Name
		}
	}
	return ""
}

// Stop stops proposing.
func (p *Proposer) Stop() {
	p.cancel()
	<-p.done
}

func (p *Proposer) loop(ctx context.Context) {
	defer close(p.done)
	tick := time.NewTicker(reannounce)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if cur := p.coord.Current(); cur.Number > 0 {
				go p.announce(ctx, cur)
			}
		case ev := <-p.events:
			p.onEvent(ctx, ev)
		case msg := <-p.messages:
			p.onMessage(ctx, msg)
		case e := <-p.epochs:
			if p.hooks.onEpoch != nil {
				p.hooks.onEpoch(e)
			}
			p.announce(ctx, e)
		}
	}
}

func (p *Proposer) onEvent(ctx context.Context, ev membership.Event) {
	n := ev.Node
	if n.Meta.Role != membership.RoleWorker {
		return
	}
	select {
	case <-p.finished:
		// Training is over: workers leaving now are going home, not
		// shrinking the job, and one still arriving has nothing to do.
		return
	default:
	}
	switch ev.Kind {
	case membership.EventJoined, membership.EventUpdated:
		p.mu.Lock()
		p.workers[n.Name] = n
		p.mu.Unlock()
		switch n.Meta.State {
		case membership.StateReady:
			if p.isEvicted(n.Name) {
				return
			}
			if n.Meta.CollectiveAddr == "" {
				p.log.Warn("ready worker without a collective address", "worker", n.Name)
				return
			}
			p.coord.Add(epoch.Member{Name: n.Name, Addr: n.Meta.CollectiveAddr})
			// Tell it where the job stands, so it knows which epoch to wait past.
			if cur := p.coord.Current(); cur.Number > 0 {
				go p.send(ctx, n, control.EncodeEpoch(cur))
			}
		case membership.StateLeaving:
			p.coord.Remove(n.Name)
		}
	case membership.EventLeft, membership.EventFailed:
		p.log.Info("worker gone", "worker", n.Name, "how", ev.Kind)
		p.mu.Lock()
		delete(p.workers, n.Name)
		p.mu.Unlock()
		p.coord.Remove(n.Name)
	}
}

func (p *Proposer) onMessage(ctx context.Context, msg membership.Message) {
	cm, err := control.Decode(msg.Payload)
	switch {
	case err != nil:
		p.log.Warn("dropped control message", "from", msg.From.Name, "err", err)
	case cm.Kind == control.KindPong:
		p.mu.Lock()
		if ch, ok := p.probes[cm.Nonce]; ok {
			close(ch)
			delete(p.probes, cm.Nonce)
		}
		p.mu.Unlock()
	case cm.Kind == control.KindStats:
		if p.hooks.onStats != nil {
			p.hooks.onStats(msg.From.Name, cm.StatsBatch())
		}
	case cm.Kind == control.KindDone:
		p.mu.Lock()
		p.finishedWorkers[msg.From.Name] = true
		p.mu.Unlock()
		if cur := p.coord.Current(); cur.Rank(msg.From.Name) >= 0 || cm.Number == cur.Number {
			p.log.Info("training finished", "worker", msg.From.Name, "epoch", cm.Number)
			p.finishedOnce.Do(func() { close(p.finished) })
		}
		p.rescue()
	case cm.Kind == control.KindFailure:
		if cm.Number != p.coord.Current().Number {
			return
		}
		p.mu.Lock()
		p.reported[msg.From.Name] = cm.Number
		p.mu.Unlock()
		p.rescue()
		if cm.Blamed == "" {
			return
		}
		p.log.Warn("collective failure reported", "by", msg.From.Name, "blamed", cm.Blamed, "epoch", cm.Number, "cause", cm.Cause)
		go p.verify(ctx, cm.Blamed)
	}
}

// rescue lets the workers of the last world that have not finished training
// finish it. A collective of the final step can complete on some workers and
// fail on others; those that completed finish and leave, and the others, which
// report the failure, need a world to redo the step in: the current one
// without the finished workers, however few remain (the minimum world size is
// about training speed, and the job is ending). It acts once training has
// finished and some unfinished member of the current world has reported a
// failure in it, whichever comes first.
func (p *Proposer) rescue() {
	select {
	case <-p.finished:
	default:
		return
	}
	cur := p.coord.Current()
	p.mu.Lock()
	stuck := false
	for name, epoch := range p.reported {
		stuck = stuck || (epoch == cur.Number && cur.Rank(name) >= 0 && !p.finishedWorkers[name])
	}
	var finished []string
	for _, m := range cur.Members {
		if p.finishedWorkers[m.Name] {
			finished = append(finished, m.Name)
		}
	}
	p.mu.Unlock()
	if !stuck || len(finished) == 0 {
		return
	}
	p.log.Warn("training finished, but workers of the last world failed its last step: they redo it without the finished ones",
		"epoch", cur.Number, "finished", finished)
	p.coord.setMinWorkers(1)
	for _, name := range finished {
		p.coord.Remove(name)
	}
}

// unfinished lists the members of the current world that have not said they
// finished training.
func (p *Proposer) unfinished() []string {
	cur := p.coord.Current()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, m := range cur.Members {
		if !p.finishedWorkers[m.Name] {
			out = append(out, m.Name)
		}
	}
	return out
}

// evict removes a worker for good (the driver scaled it down): a later
// metadata update of the worker must not re-admit it.
func (p *Proposer) evict(name string) {
	p.mu.Lock()
	p.evicted[name] = true
	p.mu.Unlock()
	p.coord.Remove(name)
}

func (p *Proposer) isEvicted(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.evicted[name]
}

// alive lists the workers in the proposer's view.
func (p *Proposer) alive() []membership.Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]membership.Node, 0, len(p.workers))
	for _, n := range p.workers {
		out = append(out, n)
	}
	return out
}

// verify removes a worker blamed for a collective failure unless it proves to
// be alive. Blame is only a suspicion: when one worker dies, a neighbour of a
// survivor that aborted sees that survivor's links close too, and blames it.
func (p *Proposer) verify(ctx context.Context, name string) {
	p.mu.Lock()
	n, ok := p.workers[name]
	p.nonce++
	nonce := p.nonce
	pong := make(chan struct{})
	p.probes[nonce] = pong
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.probes, nonce)
		p.mu.Unlock()
	}()
	if !ok {
		p.coord.Remove(name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if n.Name == p.m.Name() {
		return // a worker proposer that is running this code is alive
	}
	if err := p.m.Send(ctx, n, control.EncodePing(nonce)); err == nil {
		select {
		case <-pong:
			p.log.Info("blamed worker is alive", "worker", name)
			return
		case <-ctx.Done():
		}
	}
	p.log.Warn("blamed worker does not answer; removing it", "worker", name)
	p.coord.Remove(name)
}

// announce sends epoch e to every alive worker: its members, and the workers it
// leaves out, who learn that they are out.
func (p *Proposer) announce(ctx context.Context, e epoch.World) {
	payload := control.EncodeEpoch(e)
	p.mu.Lock()
	targets := make([]membership.Node, 0, len(p.workers))
	for _, n := range p.workers {
		targets = append(targets, n)
	}
	p.mu.Unlock()
	var wg stdsync.WaitGroup
	for _, n := range targets {
		wg.Go(func() { p.send(ctx, n, payload) })
	}
	wg.Wait()
}

func (p *Proposer) send(ctx context.Context, n membership.Node, payload []byte) {
	ctx, cancel := context.WithTimeout(ctx, control.SendTimeout)
	defer cancel()
	if err := p.m.Send(ctx, n, payload); err != nil && ctx.Err() == nil {
		p.log.Warn("could not send an epoch", "worker", n.Name, "err", err)
	}
}
