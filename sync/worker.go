package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/gpu"
	"github.com/gorovod/gorovod/membership"
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
	// MinWorkers is what a worker that takes over proposing (the job's driver
	// is gone) requires of a world; default 1.
	MinWorkers int
	// Launch is the launcher's name for this process (GOROVOD_LAUNCH_INDEX),
	// published in its membership metadata so that the launcher can tell its
	// processes apart on every host; "" when not started by a launcher.
	Launch string
	Logger *slog.Logger
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
	if c.MinWorkers == 0 {
		c.MinWorkers = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// WorkerConfigFromEnv returns the configuration `gorovod run` hands its workers
// through the environment (GOROVOD_JOB_ID, GOROVOD_SECRET, GOROVOD_SEEDS, ...).
func WorkerConfigFromEnv() (WorkerConfig, error) {
	w, err := envconfig.LoadElastic(os.Getenv)
	if err != nil {
		return WorkerConfig{}, err
	}
	cfg := DefaultWorkerConfig()
	cfg.JobID, cfg.Secret, cfg.Seeds, cfg.Transport.ListenAddr = w.JobID, w.Secret, w.Seeds, w.ListenAddr
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
	return cfg, nil
}

// UnderLauncher reports whether this process was started as a worker of an
// elastic job (its environment names a job), so a trainer can tell "not
// launched by gorovod run" from a launch with a broken environment.
func UnderLauncher() bool { return os.Getenv(envconfig.EnvJobID) != "" }

// Worker is a trainer's membership in an elastic job: a Session plus the
// gossip member and transport behind it.
type Worker struct {
	*Session
	m   *membership.Member
	tr  transport.Transport
	src *memberSource
	log *slog.Logger
	// prop is this worker's own proposer while the job has no driver and this
	// is its oldest ready worker; only the dispatch goroutine touches it.
	prop       *driver.Proposer
	takeover   driver.CoordinatorConfig
	driverSeen time.Time // last time a driver was in view (start: join time)
	closeOnce  stdsync.Once
	stats      chan stats.Batch // to the driver, by sendStats
}

// StartWorker joins the job: it starts the collective transport and the gossip
// member, announces itself ready (call it once the trainer's own start-up —
// data, model — is done, so that joining never stalls the others), and waits
// until an epoch admits it and the state has arrived.
func StartWorker(ctx context.Context, cfg WorkerConfig, state *State) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	tc := cfg.Transport
	tc.Secret, tc.Logger = cfg.Secret, log
	tr, err := multi.Listen(tc)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	w := &Worker{m: m, tr: tr, src: newMemberSource(m, log), log: log, takeover: driver.CoordinatorConfig{MinWorkers: cfg.MinWorkers}, driverSeen: time.Now(),
		stats: make(chan stats.Batch, 8)}
	go w.dispatch()
	go w.sendStats()
	fail := func(err error) (*Worker, error) {
		w.shutdown()
		return nil, err
	}
	if err := m.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateReady }); err != nil {
		return fail(err)
	}
	sc := cfg.Session
	sc.JobID, sc.Self, sc.Logger = cfg.JobID, epoch.Member{Name: m.Name(), Addr: tr.Addr()}, log
	if !cfg.DisableStats {
		sc.OnStats = w.queueStats
	}
	sess, err := Join(ctx, sc, tr, w.src, state)
	if err != nil {
		return fail(err)
	}
	w.setSession(sess)
	return w, nil
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

// sendStats delivers step statistics to the job's driver, the only member
// that runs an autoscaling engine.
func (w *Worker) sendStats() {
	for {
		select {
		case <-w.src.done:
			return
		case b := <-w.stats:
			for _, n := range w.m.Members() {
				if n.Meta.Role != membership.RoleDriver {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), control.SendTimeout)
				if err := w.m.Send(ctx, n, control.EncodeStats(b)); err != nil {
					w.log.Debug("step statistics not delivered", "err", err)
				}
				cancel()
			}
		}
	}
}

// gpuDiscoveryTimeout bounds the look at the host's GPUs (NVML or
// nvidia-smi) a worker publishes when it joins.
const gpuDiscoveryTimeout = 2 * time.Second

// electionEvery is how often a worker checks whether it must take over
// proposing epochs (the driver is gone and it is the oldest ready worker).
const electionEvery = 250 * time.Millisecond

// takeoverGrace is how long no driver must have been in view before a worker
// proposes instead: a worker that has just joined, or whose view briefly lacks
// the driver, must not start a second proposer.
const takeoverGrace = 2 * time.Second

// dispatch routes this member's gossip events and control messages: epoch
// announcements to the epoch source, liveness pings answered, failure reports
// to the local proposer if this worker runs one; a worker declared dead aborts a
// collective stuck on it, so a frozen worker costs the gossip detection time
// (about a second) rather than the full I/O timeout.
func (w *Worker) dispatch() {
	tick := time.NewTicker(electionEvery)
	defer tick.Stop()
	defer func() {
		if w.prop != nil {
			w.prop.Stop()
		}
	}()
	for {
		select {
		case <-w.src.done:
			return
		case <-tick.C:
			w.elect()
		case ev := <-w.m.Events():
			if ev.Kind == membership.EventFailed {
				w.src.abortIfMember(ev.Node.Name, fmt.Errorf("gossip declared %s dead", ev.Node.Name))
			}
			if w.prop != nil {
				w.prop.Event(ev)
			}
			w.elect()
		case msg := <-w.m.Messages():
			cm, err := control.Decode(msg.Payload)
			switch {
			case err != nil:
				w.log.Warn("dropped control message", "from", msg.From.Name, "err", err)
			case cm.Kind == control.KindPing:
				go w.src.pong(msg.From, cm.Nonce)
			case cm.Kind == control.KindEpoch:
				w.src.onEpoch(cm.World())
			case w.prop != nil:
				w.prop.Message(msg)
			}
		}
	}
}

// elect starts or stops this worker's own proposer: a job proposes through its
// driver while one is alive, else through its oldest ready worker.
func (w *Worker) elect() {
	nodes := w.m.Members()
	lead := driver.ElectProposer(nodes)
	if slices.ContainsFunc(nodes, func(n membership.Node) bool { return n.Meta.Role == membership.RoleDriver }) {
		w.driverSeen = time.Now()
	} else if time.Since(w.driverSeen) < takeoverGrace {
		lead = "" // give a driver time to appear (or to be declared gone)
	}
	switch {
	case lead == w.m.Name() && w.prop == nil:
		w.log.Warn("no driver: this worker, the oldest ready one, takes over proposing epochs")
		w.prop = driver.StartProposer(w.m, w.takeover, w.src.current(), nodes, w.log)
	case lead != w.m.Name() && w.prop != nil:
		w.prop.Stop()
		w.prop = nil
	}
}

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
	return w.m.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateLeaving })
}

// Finish tells the proposer that training is over (call it on every worker
// when the loop ends normally), then leaves like Close. Without it, the last
// workers' departures would look like a scale-down, and a worker still
// waiting to join would be given a world of its own.
func (w *Worker) Finish(ctx context.Context) error {
	if w.Session != nil {
		nodes := w.m.Members()
		lead := driver.ElectProposer(nodes)
		last, haveLast := w.Session.clock.Take()
		for _, n := range nodes {
			if haveLast && n.Meta.Role == membership.RoleDriver {
				// The last steps, so the driver's account of the job is complete.
				sctx, cancel := context.WithTimeout(ctx, control.SendTimeout)
				_ = w.m.Send(sctx, n, control.EncodeStats(last))
				cancel()
			}
			if n.Name == lead {
				sctx, cancel := context.WithTimeout(ctx, control.SendTimeout)
				_ = w.m.Send(sctx, n, control.EncodeDone(w.World().Number))
				cancel()
			}
		}
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
	_ = w.m.Leave(context.Background()) // bounded by Membership.LeaveTimeout
	_ = w.m.Shutdown()
	w.src.stop()
	_ = w.tr.Close()
}

// memberSource is a worker's epoch.Source fed by the driver's announcements.
type memberSource struct {
	m   *membership.Member
	log *slog.Logger

	mu      stdsync.Mutex
	latest  epoch.World
	newer   chan struct{}
	session *Session // set once joined, for aborting a stuck collective
	done    chan struct{}
	once    stdsync.Once
}

func newMemberSource(m *membership.Member, log *slog.Logger) *memberSource {
	return &memberSource{m: m, log: log, newer: make(chan struct{}), done: make(chan struct{})}
}

func (s *memberSource) stop() { s.once.Do(func() { close(s.done) }) }

// onEpoch records an announced epoch; announcements may arrive late or
// twice, so only a newer number counts.
func (s *memberSource) onEpoch(e epoch.World) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Number > s.latest.Number {
		s.latest = e
		close(s.newer)
		s.newer = make(chan struct{})
	}
}

// current is the newest epoch announced here.
func (s *memberSource) current() epoch.World {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest
}

func (s *memberSource) abortIfMember(name string, cause error) {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		sess.AbortIfMember(name, cause)
	}
}

// pong answers the driver's liveness check: the answer comes from this
// process's gossip goroutines, so a busy trainer still answers and only a dead
// or frozen process does not.
func (s *memberSource) pong(to membership.Node, nonce uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), control.SendTimeout)
	defer cancel()
	_ = s.m.Send(ctx, to, control.EncodePong(nonce))
}

func (s *memberSource) Latest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest.Number
}

func (s *memberSource) Await(ctx context.Context, after uint64) (epoch.World, error) {
	for {
		s.mu.Lock()
		cur, newer := s.latest, s.newer
		s.mu.Unlock()
		if cur.Number > after {
			return cur, nil
		}
		select {
		case <-newer:
		case <-ctx.Done():
			return epoch.World{}, fmt.Errorf("sync: waiting for a world epoch after %d (too few workers, or no driver?): %w", after, ctx.Err())
		}
	}
}

func (s *memberSource) ReportFailure(epoch uint64, peer epoch.Member, cause error) {
	nodes := s.m.Members()
	lead := driver.ElectProposer(nodes)
	var driver membership.Node
	found := false
	for _, n := range nodes {
		if n.Name == lead {
			driver, found = n, true
		}
	}
	if !found {
		s.log.Warn("no proposer to report a failure to", "blamed", peer.Name)
		return
	}
	payload := control.EncodeFailure(epoch, peer.Name, cause)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), control.SendTimeout)
		defer cancel()
		if err := s.m.Send(ctx, driver, payload); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Warn("failure report not delivered", "err", err)
		}
	}()
}
