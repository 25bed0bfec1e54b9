package sync

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/gpu"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// WorkerConfig is how a worker process joins an elastic job. A zero field
// means its default (DefaultWorkerConfig).
type WorkerConfig struct {
	// JobID, Secret and Seeds (the gossip addresses to join through: the
	// driver's, usually) are the job's; they fill the fields of the same
	// meaning in Session, Transport and Membership.
	JobID  string
	Secret []byte
	Seeds  []string
	// Session: fusion, recovery timeout, collective tuning. Its JobID and Self
	// are filled in.
	Session Config
	// Transport is the collective transport: its mode (auto, the default:
	// shared memory between workers on one host, TCP otherwise; tcp, shm or
	// sctp), listen address and I/O timeout, which bounds a silent peer in a
	// collective (a frozen worker is found by this or by gossip, whichever is
	// first): default WorkerIOTimeout.
	Transport multi.Config
	// Membership: the gossip bind address (default 127.0.0.1, any port) and
	// timings.
	Membership membership.Config
	// DisableStats stops sending step statistics to the driver (its
	// autoscaling engine then sees nothing of this worker).
	DisableStats bool
	// MinWorkers is what a worker that takes over proposing (no driver in
	// its view for the takeover grace) requires of a world: it proposes none
	// smaller, and waits for that many ready workers instead. Default 1;
	// under a launcher it is at least the job's minimum (GOROVOD_MIN_WORKERS,
	// see WorkerConfigFromEnv and TrainConfig.Worker).
	MinWorkers int
	// FirstWorld is the number of workers the job was started with (`gorovod
	// run --np`; GOROVOD_NP under a launcher, see WorkerConfigFromEnv and
	// TrainConfig.Worker). A worker that takes over proposing before any
	// world has reached it proposes a first world only with a strict
	// majority of them. 0: not known, and it forms a first world with any
	// MinWorkers ready workers.
	FirstWorld int
	// ProbeTimeout is how long a worker that takes over proposing waits for
	// the answer of a worker blamed for a failure (or declared dead by
	// gossip) before it leaves it out of the next world
	// (driver.AgentConfig.ProbeTimeout): the job's driver's
	// (driver.Config.ProbeTimeout), under a launcher GOROVOD_PROBE_TIMEOUT
	// when the trainer sets none (see WorkerConfigFromEnv and
	// TrainConfig.Worker). Default 500 ms, the driver's default.
	ProbeTimeout time.Duration
	// Launch is the launcher's name for this process (GOROVOD_LAUNCH_INDEX),
	// published in its membership metadata so that the launcher can tell its
	// processes apart on every host; "" when not started by a launcher.
	Launch string
	Logger *slog.Logger
	// Timeline, if set, is the file this worker writes its Chrome trace to
	// (Session.Timeline, opened when the worker joins and closed when it
	// leaves). Under `gorovod run --timeline-filename` (GOROVOD_TIMELINE) it
	// is the worker's part of the job's timeline, which the driver merges.
	Timeline string
}

// WorkerIOTimeout is a worker's default transport I/O timeout: shorter than a
// transport's own default (transport.DefaultIOTimeout), because a frozen
// worker stalls the whole world until it is found.
const WorkerIOTimeout = 5 * time.Second

// DefaultWorkerConfig returns the defaults; JobID, Secret and Seeds must
// still be set.
func DefaultWorkerConfig() WorkerConfig {
	tc := multi.DefaultConfig()
	tc.IOTimeout = WorkerIOTimeout
	return WorkerConfig{Session: DefaultConfig(), Transport: tc, Membership: membership.DefaultConfig(), MinWorkers: 1}
}

// withDefaults fills the zero fields and checks the rest.
func (c WorkerConfig) withDefaults() (WorkerConfig, error) {
	if c.JobID == "" || len(c.Secret) == 0 {
		return c, fmt.Errorf("%w: WorkerConfig needs JobID and Secret", ErrInvalidConfig)
	}
	if c.Transport.IOTimeout == 0 {
		c.Transport.IOTimeout = WorkerIOTimeout
	}
	if c.MinWorkers < 0 {
		return c, fmt.Errorf("%w: WorkerConfig.MinWorkers %d is negative", ErrInvalidConfig, c.MinWorkers)
	}
	if c.MinWorkers == 0 {
		c.MinWorkers = 1
	}
	if c.FirstWorld < 0 {
		return c, fmt.Errorf("%w: WorkerConfig.FirstWorld %d is negative", ErrInvalidConfig, c.FirstWorld)
	}
	if c.ProbeTimeout < 0 {
		return c, fmt.Errorf("%w: WorkerConfig.ProbeTimeout %v is negative", ErrInvalidConfig, c.ProbeTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// WorkerConfigFromEnv returns the configuration `gorovod run` hands its workers
// through the environment (GOROVOD_JOB_ID, GOROVOD_SECRET, GOROVOD_SEEDS,
// GOROVOD_MIN_WORKERS, GOROVOD_NP, GOROVOD_PROBE_TIMEOUT, ...).
func WorkerConfigFromEnv() (WorkerConfig, error) {
	w, err := envconfig.LoadElastic(os.Getenv)
	if err != nil {
		return WorkerConfig{}, err
	}
	cfg := DefaultWorkerConfig()
	cfg.JobID, cfg.Secret, cfg.Seeds, cfg.Transport.ListenAddr = w.JobID, w.Secret, w.Seeds, w.ListenAddr
	cfg.Transport.Security = w.Security
	cfg.Transport.TCP.Lanes = w.TCPLanes
	if w.ElasticTimeout > 0 {
		cfg.Session.RecoveryTimeout = w.ElasticTimeout
	}
	if w.MinWorkers > 0 {
		cfg.MinWorkers = w.MinWorkers
	}
	cfg.FirstWorld = w.FirstWorld
	cfg.ProbeTimeout = w.ProbeTimeout
	if err := bindGossip(&cfg.Membership, w.GossipAddr); err != nil {
		return WorkerConfig{}, err
	}
	index, launched, err := envconfig.LaunchIndex(os.Getenv)
	if err != nil {
		return WorkerConfig{}, err
	}
	if launched {
		cfg.Launch = strconv.Itoa(index)
	}
	if err := observeFromEnv(&cfg, os.Getenv); err != nil {
		return WorkerConfig{}, err
	}
	if err := algorithmsFromEnv(&cfg.Session.Collective, os.Getenv); err != nil {
		return WorkerConfig{}, err
	}
	return cfg, nil
}

// algorithmsLikeEnv gives cfg the algorithms the environment forces (env,
// from WorkerConfigFromEnv) where cfg leaves the choice to auto.
func algorithmsLikeEnv(cfg *collective.Config, env collective.Config) {
	auto := func(a collective.Algorithm) bool { return a == "" || a == collective.AlgorithmAuto }
	if auto(cfg.Algorithm) {
		cfg.Algorithm = env.Algorithm
	}
	if auto(cfg.AllgatherAlgorithm) {
		cfg.AllgatherAlgorithm = env.AllgatherAlgorithm
	}
}

// algorithmsFromEnv applies the collective algorithms the environment
// forces (envconfig.Algorithms) to cfg.
func algorithmsFromEnv(cfg *collective.Config, getenv func(string) string) error {
	a, err := envconfig.LoadAlgorithms(getenv)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, f := range []struct {
		v    string
		into *collective.Algorithm
		name string
	}{{a.Allreduce, &cfg.Algorithm, envconfig.EnvAllreduceAlgorithm}, {a.Allgather, &cfg.AllgatherAlgorithm, envconfig.EnvAllgatherAlgorithm}} {
		if f.v == "" {
			continue
		}
		alg, err := collective.ParseAlgorithm(f.v)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.name, err)
		}
		*f.into = alg
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// UnderLauncher reports whether this process was started as a worker of an
// elastic job (its environment names a job), so a trainer can tell "not
// launched by gorovod run" from a launch with a broken environment.
func UnderLauncher() bool { return os.Getenv(envconfig.EnvJobID) != "" }

// Worker is a trainer's membership in an elastic job: a Session plus the
// gossip member and transport behind it.
type Worker struct {
	*Session
	m  *membership.Member
	tr transport.Transport
	// agent runs this worker's side of the epoch protocol: it feeds src the
	// epochs announced here, answers the proposer's probes, sends reports,
	// and proposes itself when the job has no driver.
	agent     *driver.Agent
	src       *memberSource
	log       *slog.Logger
	closeOnce stdsync.Once
	stats     chan stats.Batch    // to the driver, by sendStats
	stalls    chan stall.Snapshot // to the driver, by sendStats
	tl        *timeline.Timeline  // Config.Timeline's, closed at the end
	// cfg and state are what Rejoin starts again from.
	cfg        WorkerConfig
	state      *State
	outForGood atomic.Bool // the proposer will not admit this member again
	rejoins    int
}

// StartWorker joins the elastic job cfg names (cfg.JobID set: it does not
// take the job from a launcher's environment, WorkerConfigFromEnv does, and
// it never trains alone). It is the layer under JoinJob and Train, which
// join through it when a job is named or a launcher started the process; a
// trainer calls Train instead, unless it drives a Worker itself. It starts
// the collective transport and the gossip member, announces itself ready
// (call it once the trainer's own start-up — data, model — is done, so that
// joining never stalls the others), and waits until an epoch admits it and
// the state has arrived.
func StartWorker(ctx context.Context, cfg WorkerConfig, state *State) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, state: state, log: cfg.Logger, stats: make(chan stats.Batch, 8), stalls: make(chan stall.Snapshot, 4)}
	if err := w.start(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// start joins the job as a new gossip member (a new name) with a new
// transport, and waits to be admitted.
func (w *Worker) start(ctx context.Context) error {
	cfg, log := w.cfg, w.log
	tc := cfg.Transport
	tc.Secret, tc.Logger = cfg.Secret, log
	tr, err := multi.Listen(tc)
	if err != nil {
		return err
	}
	mc := cfg.Membership
	mc.Seeds, mc.Secret, mc.Logger = cfg.Seeds, cfg.Secret, log
	meta := membership.Meta{JobID: cfg.JobID, Role: membership.RoleWorker, CollectiveAddr: tr.Addr(), GPUs: membership.GPUsUnknown}
	publishGPUs(ctx, &meta)
	if meta.Extra == nil {
		meta.Extra = map[string]string{}
	}
	meta.Extra[driver.MetaPID] = strconv.Itoa(os.Getpid())
	if cfg.Launch != "" {
		meta.Extra[driver.MetaLaunch] = cfg.Launch
	}
	m, err := membership.Join(ctx, mc, meta)
	if err != nil {
		tr.Close()
		return err
	}
	w.m, w.tr, w.src = m, tr, newMemberSource(log)
	w.outForGood.Store(false)
	w.closeOnce = stdsync.Once{}
	w.setSession(nil)
	src := w.src
	// A worker waiting to be admitted stops waiting when the job says it
	// never will be (training is over).
	joinCtx, stopJoin := context.WithCancel(ctx)
	defer stopJoin()
	w.agent = driver.StartAgent(m, driver.AgentConfig{
		MinWorkers: cfg.MinWorkers, FirstWorld: cfg.FirstWorld, ProbeTimeout: cfg.ProbeTimeout, Logger: log, OnAdopt: src.onEpoch,
		OnPeerFailed: src.peerFailed,
		OnPeerAlive:  src.peerAlive,
		OnPeerLeft:   src.peerLeft,
		OnOutForGood: func() {
			w.outForGood.Store(true)
			stopJoin()
		},
	})
	w.src.agent, w.src.member = w.agent, m
	go w.sendStats(w.m, w.src.done)
	go w.reconnect(w.m, w.src.done)
	fail := func(err error) error {
		w.shutdown()
		return err
	}
	if err := announce(ctx, m, membership.StateReady); err != nil {
		return fail(err)
	}
	sc := cfg.Session
	sc.JobID, sc.Self, sc.Logger = cfg.JobID, epoch.Member{Name: m.Name(), Addr: tr.Addr()}, log
	if !cfg.DisableStats {
		sc.OnStats = w.queueStats
	}
	if sc.OnStallSnapshot == nil {
		sc.OnStallSnapshot = w.queueStall
	}
	if cfg.Timeline != "" && sc.Timeline == nil {
		// One timeline for the process, named after its first member name.
		if w.tl == nil {
			if w.tl, err = openTimeline(cfg.Timeline, workerProcessName(m.Name(), cfg.Launch), cfg.Launch); err != nil {
				return fail(err)
			}
		}
		sc.Timeline = w.tl
	}
	sess, err := openSession(joinCtx, sc, tr, w.src, w.state)
	if err != nil {
		if w.OutForGood() && ctx.Err() == nil {
			err = ErrOutForGood
		}
		return fail(err)
	}
	w.setSession(sess)
	return nil
}

// OutForGood reports whether the job said it will not admit this worker
// again: the driver removed it (a scale-down), or training is over. A worker
// left out of a world otherwise (declared failed while it was paused or cut
// off) may Rejoin.
func (w *Worker) OutForGood() bool { return w.outForGood.Load() }

// Rejoins is how often this worker came back with Rejoin.
func (w *Worker) Rejoins() int { return w.rejoins }

// Rejoin comes back to the job after this worker was left out of a world
// (ErrExcluded) while it was unreachable: frozen (SIGSTOP, a long pause), or
// cut off by the network. A member name is one incarnation and its exclusion
// stands, so the worker leaves the gossip cluster and its transport under
// the old name and joins again as a new member, which the proposer admits at
// the next epoch like any joiner; the state (the step, the sampler's
// position, the registered tensors) then arrives from the world's rank 0.
// It returns ErrOutForGood when the job will not admit the worker again (see
// OutForGood), and otherwise once admitted (w.Session is then the new
// world's), or with ctx's error.
func (w *Worker) Rejoin(ctx context.Context) error {
	if w.OutForGood() {
		return ErrOutForGood
	}
	old := w.Name()
	if w.Session != nil {
		w.Session.Close()
	}
	w.leaveJob()
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(w.cfg.Session.RecoveryTimeout, DefaultConfig().RecoveryTimeout))
	defer cancel()
	if err := w.start(ctx); err != nil {
		return fmt.Errorf("sync: rejoining the job (was %s): %w", old, err)
	}
	w.rejoins++
	w.log.Info("rejoined the job as a new member", "was", old, "now", w.Name(), "epoch", w.World().Number, "step", w.Step())
	return nil
}

func (w *Worker) setSession(s *Session) {
	w.src.mu.Lock()
	w.Session = s
	w.src.session = s
	w.src.mu.Unlock()
}

// queueStats hands a batch of step statistics to sendStats without blocking
// the training loop; if the driver is so slow to take them that the queue is
// full, the batch is dropped (the engine then sees those steps incomplete).
func (w *Worker) queueStats(b stats.Batch) {
	select {
	case w.stats <- b:
	default:
		w.log.Debug("step statistics dropped: the driver is not keeping up", "steps", len(b.Steps))
	}
}

// queueStall hands a stall inspector's snapshot to sendStats without
// blocking the inspector; a full queue drops it (the next heartbeat comes).
func (w *Worker) queueStall(s stall.Snapshot) {
	select {
	case w.stalls <- s:
	default:
	}
}

// sendStats delivers step statistics and stall snapshots to the job's
// driver, the only member that runs an autoscaling engine, through member m
// until done closes.
func (w *Worker) sendStats(m *membership.Member, done <-chan struct{}) {
	for {
		var msg []byte
		select {
		case <-done:
			return
		case b := <-w.stats:
			msg = control.EncodeStats(b)
		case s := <-w.stalls:
			msg = control.EncodeStall(s)
		}
		for _, n := range m.Members() {
			if n.Meta.Role != membership.RoleDriver {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), control.SendTimeout)
			if err := m.Send(ctx, n, msg); err != nil {
				w.log.Debug("statistics not delivered to the driver", "err", err)
			}
			cancel()
		}
	}
}

// reconnectEvery is how often a worker that lost the job's driver from its
// view goes back to the seeds (see reconnect).
const reconnectEvery = time.Second

// reconnect goes back to the job's seeds (the driver) every reconnectEvery
// while no driver is in member m's view, once one was, until done closes: a
// partition that heals does not bring the two sides of the gossip cluster
// together by itself (membership.Member.Reconnect). Then this worker learns
// the world the driver went on with and, left out of it, comes back as a new
// member.
func (w *Worker) reconnect(m *membership.Member, done <-chan struct{}) {
	inView := func() bool {
		return slices.ContainsFunc(m.Members(), func(n membership.Node) bool { return n.Meta.Role == membership.RoleDriver })
	}
	// The worker has just joined through the seeds: the driver is in its
	// view now, if the job has one. Looked at only at the first tick, a
	// second later, a worker cut off within that second (a partition right
	// after it joined) would never have seen the driver, and would never
	// reconnect: the two sides would stay apart after the partition healed.
	seen := inView()
	tick := time.NewTicker(reconnectEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		driver := inView()
		if driver || !seen {
			seen = seen || driver
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), reconnectEvery)
		if err := m.Reconnect(ctx); err != nil {
			w.log.Debug("the driver is out of view, and its address does not answer", "err", err)
		} else {
			w.log.Info("the driver was out of view: reconnected through the job's seeds")
		}
		cancel()
	}
}

// gpuDiscoveryTimeout bounds the look at the host's GPUs (NVML or
// nvidia-smi) a worker publishes when it joins.
const gpuDiscoveryTimeout = 2 * time.Second

// publishGPUs puts what this worker may use of the host's GPUs in its
// metadata: the count (CUDA_VISIBLE_DEVICES, as the launcher assigned it, or
// all the host has) and NVML's summary of the host.
func publishGPUs(ctx context.Context, meta *membership.Meta) {
	ctx, cancel := context.WithTimeout(ctx, gpuDiscoveryTimeout)
	defer cancel()
	inv, err := gpu.System(ctx)
	switch {
	case gpu.IsNoGPUs(err):
		meta.GPUs = 0
		return
	case err != nil:
		return // unknown
	}
	meta.GPUs = len(inv.GPUs)
	if devs, set := envconfig.VisibleDevices(os.LookupEnv); set {
		meta.GPUs = min(meta.GPUs, len(devs))
	}
	meta.Extra = map[string]string{"gpus": string(inv.Summary().Encode())}
}

func bindGossip(mc *membership.Config, addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		mc.BindAddr = addr // just a host
		return nil
	}
	mc.BindAddr = host
	if mc.BindPort, err = strconv.Atoi(port); err != nil {
		return fmt.Errorf("%w: gossip address %q: %v", ErrInvalidConfig, addr, err)
	}
	return nil
}

// Name is this worker's unique member name.
func (w *Worker) Name() string { return w.m.Name() }

// RequestLeave asks to leave the job gracefully: the driver proposes an epoch
// without this worker, and Commit returns ErrExcluded at the boundary where the
// others move on. Keep training until then.
func (w *Worker) RequestLeave(ctx context.Context) error {
	return announce(ctx, w.m, membership.StateLeaving)
}

// announce publishes this worker's new state (ready, leaving) and tells the
// members that propose epochs (the driver, and the worker the view elects
// when there is none) directly, so that the next epoch does not wait for
// gossip to carry it to them, nor this worker's training loop for the
// gossip broadcast. A proposer that could not be told learns it through
// gossip, as before.
func announce(ctx context.Context, m *membership.Member, state membership.State) error {
	nodes := m.Members()
	elected := driver.ElectProposer(nodes)
	var to []membership.Node
	for _, n := range nodes {
		if n.Meta.Role == membership.RoleDriver || n.Name == elected {
			to = append(to, n)
		}
	}
	return m.Announce(ctx, func(meta *membership.Meta) { meta.State = state }, to)
}

// Finish tells the proposer that training is over (call it on every worker
// when the loop ends normally), then leaves like Close. Without it, the last
// workers' departures would look like a scale-down, and a worker still
// waiting to join would be given a world of its own. A worker that proposes
// epochs itself (the job has no driver) stays until the members still
// finishing the last step are done, at most a minute or until ctx ends.
func (w *Worker) Finish(ctx context.Context) error {
	if w.Session != nil {
		if last, ok := w.Session.clock.Take(); ok {
			for _, n := range w.m.Members() {
				if n.Meta.Role == membership.RoleDriver {
					// The last steps, so the driver's account of the job is complete.
					sctx, cancel := context.WithTimeout(ctx, control.SendTimeout)
					_ = w.m.Send(sctx, n, control.EncodeStats(last))
					cancel()
				}
			}
		}
		_ = w.agent.Finish(ctx, w.World().Number)
	}
	return w.Close()
}

// Close leaves the gossip cluster and releases the transport.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() {
		if w.Session != nil {
			w.Session.Close()
		}
		w.shutdown()
	})
	return nil
}

func (w *Worker) shutdown() {
	w.leaveJob()
	closeTimeline(w.tl, w.log)
	w.tl = nil
}

// leaveJob leaves the gossip cluster and releases the transport of this
// incarnation (Rejoin starts another; the timeline stays).
func (w *Worker) leaveJob() {
	_ = w.m.Leave(context.Background()) // bounded by Membership.LeaveTimeout
	_ = w.m.Shutdown()
	w.agent.Stop()
	w.src.stop()
	_ = w.tr.Close()
}

// memberSource is a worker's epoch.Source fed by its protocol agent.
type memberSource struct {
	log    *slog.Logger
	agent  *driver.Agent
	member *membership.Member // for reachMembers

	latest  epoch.Newest
	mu      stdsync.Mutex
	session *Session // set once joined, for aborting a stuck collective
	// suspects: the members this worker's gossip declared dead and has not
	// heard from since.
	suspects map[string]bool
	// left: the members that left the gossip cluster gracefully (shut
	// their library down) and have not come back since.
	left map[string]bool
	done chan struct{}
	once stdsync.Once
}

func newMemberSource(log *slog.Logger) *memberSource {
	return &memberSource{log: log, suspects: map[string]bool{}, left: map[string]bool{}, done: make(chan struct{})}
}

func (s *memberSource) stop() { s.once.Do(func() { close(s.done) }) }

// onEpoch records a newer epoch (the agent passes on only newer ones) and
// has the session connect its world while it trains on (Session.Prepare).
func (s *memberSource) onEpoch(e epoch.World) {
	s.latest.Put(e)
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		sess.Prepare(e)
	}
	s.abortLeftOut()
	if sess != nil {
		s.forgetGone(e, sess.currentWorld())
	}
}

// forgetGone drops gossip's verdicts (suspects, left) on the members that
// are in neither newest nor current, the session's world: a member name is
// one incarnation, never in a later world once left out of newest, so
// neither abortLeftOut nor leftOf can ask about it again, and the verdicts
// stay as many as the worlds' members however long the job churns.
func (s *memberSource) forgetGone(newest, current epoch.World) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, verdicts := range []map[string]bool{s.suspects, s.left} {
		for name := range verdicts {
			if newest.Rank(name) < 0 && current.Rank(name) < 0 {
				delete(verdicts, name)
			}
		}
	}
}

// peerFailed notes gossip's verdict that name is dead. Gossip alone does not
// stop the collective in progress: under load it declares live workers dead
// (a starved process misses its 100 ms probes), and the proposer keeps a
// member that answers its liveness probe. The collective is stopped once
// the proposer has also left the member out (abortLeftOut).
func (s *memberSource) peerFailed(name string) {
	s.mu.Lock()
	s.suspects[name] = true
	s.mu.Unlock()
	s.abortLeftOut()
}

// peerAlive clears gossip's verdict on name: it was heard from again.
func (s *memberSource) peerAlive(name string) {
	s.mu.Lock()
	delete(s.suspects, name)
	delete(s.left, name)
	s.mu.Unlock()
}

// peerLeft notes that name left the gossip cluster gracefully: its process
// shut the library down. It is not a suspect (it did not fail, and a
// collective in progress is not aborted for it: a member that leaves after
// the commit that moved the world finished its part of it), but it will not
// come to anything of the world it was in.
func (s *memberSource) peerLeft(name string) {
	s.mu.Lock()
	s.left[name] = true
	s.mu.Unlock()
}

// leftOf reports the ranks in current of the members that left the gossip
// cluster gracefully.
func (s *memberSource) leftOf(current epoch.World) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ranks []int
	for name := range s.left {
		if r := current.Rank(name); r >= 0 {
			ranks = append(ranks, r)
		}
	}
	slices.Sort(ranks)
	return ranks
}

// abortLeftOut stops the collective in progress when one of its members is
// dead both to this worker's gossip and to the proposer (the newest epoch
// leaves it out): on a frozen or silently dead worker that comes sooner than
// the collective's I/O timeout. The collective then fails and the session
// recovers into the newest world. A member that is left out without being
// dead to gossip (a graceful leave) trains on to the step boundary.
func (s *memberSource) abortLeftOut() {
	newest := s.latest.World()
	if newest.Number == 0 {
		return
	}
	s.mu.Lock()
	sess := s.session
	var gone []string
	for name := range s.suspects {
		if newest.Rank(name) < 0 {
			gone = append(gone, name)
		}
	}
	s.mu.Unlock()
	if sess == nil {
		return
	}
	for _, name := range gone {
		sess.AbortIfMember(name, fmt.Errorf("gossip declared %s dead", name))
	}
}

func (s *memberSource) Latest() uint64 { return s.latest.Number() }

// deadLeftOut reports the newest world and whether it replaces current
// without a member that gossip declared dead: the condition on which
// abortLeftOut stops a collective of current.
func (s *memberSource) deadLeftOut(current epoch.World) (uint64, bool) {
	newest := s.latest.World()
	if newest.Number <= current.Number {
		return newest.Number, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.suspects {
		if current.Rank(name) >= 0 && newest.Rank(name) < 0 {
			return newest.Number, true
		}
	}
	return newest.Number, false
}

func (s *memberSource) Await(ctx context.Context, after uint64) (epoch.World, error) {
	w, err := s.latest.Await(ctx, after)
	if err != nil {
		return w, fmt.Errorf("sync: waiting for a world epoch after %d (too few workers, or no driver?): %w", after, err)
	}
	return w, nil
}

// reachMembers looks whether every other member of ep still listens
// (membership.Member.WhenGone) and reports ep as failed, blaming one whose
// gossip port refuses connections: its process is gone. The proposer's
// probe of it is refused too, and the next world goes on without it.
func (s *memberSource) reachMembers(ctx context.Context, ep epoch.World) {
	m := s.member
	if m == nil {
		return
	}
	view := map[string]membership.Node{}
	for _, n := range m.Members() {
		view[n.Name] = n
	}
	var members []membership.Node
	for _, mem := range ep.Members {
		if n, ok := view[mem.Name]; ok {
			members = append(members, n)
		}
	}
	var once stdsync.Once
	m.WhenGone(ctx, members, func(n membership.Node, err error) {
		once.Do(func() {
			s.log.Info("a member of the world being entered is gone: its gossip port refuses connections", "epoch", ep.Number, "member", n.Name)
			s.agent.ReportFailure(ep.Number, n.Name, err)
		})
	})
}

// ReportFailure hands the report to the agent, which sends it to the
// proposer (again until a newer epoch arrives).
func (s *memberSource) ReportFailure(number uint64, peer epoch.Member, cause error) {
	s.agent.ReportFailure(number, peer.Name, cause)
}
