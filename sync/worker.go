package sync

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
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

// WorkerConfig is how a worker process joins an elastic job.
type WorkerConfig struct {
	JobID      string
	Secret     []byte
	Seeds      []string // gossip addresses to join through (the driver's, usually)
	ListenAddr string   // collective transport listen address; default 127.0.0.1:0
	GossipAddr string   // gossip bind address, "host" or "host:port"; default 127.0.0.1
	// Session: fusion, recovery timeout, collective tuning. Its JobID and Self
	// are filled in.
	Session Config
	// IOTimeout bounds a silent peer in a collective (a frozen worker is found
	// by this or by gossip, whichever is first). Default 5 s.
	IOTimeout time.Duration
	// Transport: auto (the default: shared memory between workers on one
	// host, TCP otherwise), tcp, shm or sctp.
	Transport multi.Mode
	// Membership: gossip timings; Seeds, Secret and the bind address above
	// override its fields.
	Membership membership.Config
	// DisableStats stops sending step statistics to the driver (its
	// autoscaling engine then sees nothing of this worker).
	DisableStats bool
	// MinWorkers is what a worker that takes over proposing (the job's driver
	// is gone) requires of a world; default 1.
	MinWorkers int
	Logger     *slog.Logger
}

// WorkerConfigFromEnv returns the configuration `gorovod run` hands its workers
// through the environment (GOROVOD_JOB_ID, GOROVOD_SECRET, GOROVOD_SEEDS, ...).
func WorkerConfigFromEnv() (WorkerConfig, error) {
	w, err := envconfig.LoadElastic(os.Getenv)
	if err != nil {
		return WorkerConfig{}, err
	}
	return WorkerConfig{
		JobID: w.JobID, Secret: w.Secret, Seeds: w.Seeds, ListenAddr: w.ListenAddr, GossipAddr: w.GossipAddr,
		Session: DefaultConfig(), Membership: membership.DefaultConfig(),
	}, nil
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
	stats     chan stats.Batch // to the driver, by sendStats
}

// StartWorker joins the job: it starts the collective transport and the gossip
// member, announces itself ready (call it once the trainer's own start-up —
// data, model — is done, so that joining never stalls the others), and waits
// until an epoch admits it and the state has arrived.
func StartWorker(ctx context.Context, cfg WorkerConfig, state *State) (*Worker, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tc := multi.DefaultConfig()
	tc.Mode, tc.Secret, tc.Logger, tc.ListenAddr, tc.IOTimeout = cfg.Transport, cfg.Secret, log, cfg.ListenAddr, cfg.IOTimeout
	if tc.IOTimeout <= 0 {
		tc.IOTimeout = 5 * time.Second
	}
	tr, err := multi.Listen(tc)
	if err != nil {
		return nil, err
	}
	mc := cfg.Membership
	mc.Seeds, mc.Secret, mc.Logger = cfg.Seeds, cfg.Secret, log
	if err := bindGossip(&mc, cfg.GossipAddr); err != nil {
		tr.Close()
		return nil, err
	}
	meta := membership.Meta{JobID: cfg.JobID, Role: membership.RoleWorker, CollectiveAddr: tr.Addr(), GPUs: membership.GPUsUnknown}
	publishGPUs(ctx, &meta)
	if meta.Extra == nil {
		meta.Extra = map[string]string{}
	}
	meta.Extra[driver.MetaPID] = strconv.Itoa(os.Getpid())
	m, err := membership.Join(ctx, mc, meta)
	if err != nil {
		tr.Close()
		return nil, err
	}
	w := &Worker{m: m, tr: tr, src: newMemberSource(log), log: log, stats: make(chan stats.Batch, 8)}
	w.agent = driver.StartAgent(m, driver.AgentConfig{
		MinWorkers: cfg.MinWorkers, Logger: log, OnAdopt: w.src.onEpoch,
		OnPeerFailed: func(name string) { w.src.abortIfMember(name, fmt.Errorf("gossip declared %s dead", name)) },
	})
	w.src.agent = w.agent
	go w.sendStats()
	fail := func(err error) (*Worker, error) {
		w.shutdown()
		return nil, err
	}
	if err := m.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateReady }); err != nil {
		return fail(err)
	}
	sc := cfg.Session
	if sc.Collective.ChunkBytes == 0 {
		sc = DefaultConfig()
	}
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
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if err := w.m.Send(ctx, n, control.EncodeStats(b)); err != nil {
					w.log.Debug("step statistics not delivered", "err", err)
				}
				cancel()
			}
		}
	}
}

// publishGPUs puts what this worker may use of the host's GPUs in its
// metadata: the count (CUDA_VISIBLE_DEVICES, as the launcher assigned it, or
// all the host has) and NVML's summary of the host.
func publishGPUs(ctx context.Context, meta *membership.Meta) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
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
		return fmt.Errorf("sync: gossip address %q: %w", addr, err)
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
// waiting to join would be given a world of its own. A worker that proposes
// epochs itself (the job has no driver) stays until the members still
// finishing the last step are done, at most a minute or until ctx ends.
func (w *Worker) Finish(ctx context.Context) error {
	if w.Session != nil {
		if last, ok := w.Session.clock.Take(); ok {
			for _, n := range w.m.Members() {
				if n.Meta.Role == membership.RoleDriver {
					// The last steps, so the driver's account of the job is complete.
					sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = w.m.Leave(ctx)
	_ = w.m.Shutdown()
	w.agent.Stop()
	w.src.stop()
	_ = w.tr.Close()
}

// memberSource is a worker's epoch.Source fed by its protocol agent.
type memberSource struct {
	log   *slog.Logger
	agent *driver.Agent

	latest  epoch.Newest
	mu      stdsync.Mutex
	session *Session // set once joined, for aborting a stuck collective
	done    chan struct{}
	once    stdsync.Once
}

func newMemberSource(log *slog.Logger) *memberSource {
	return &memberSource{log: log, done: make(chan struct{})}
}

func (s *memberSource) stop() { s.once.Do(func() { close(s.done) }) }

// onEpoch records a newer epoch (the agent passes on only newer ones).
func (s *memberSource) onEpoch(e epoch.World) { s.latest.Put(e) }

func (s *memberSource) abortIfMember(name string, cause error) {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		sess.AbortIfMember(name, cause)
	}
}

func (s *memberSource) Latest() uint64 { return s.latest.Number() }

func (s *memberSource) Await(ctx context.Context, after uint64) (epoch.World, error) {
	w, err := s.latest.Await(ctx, after)
	if err != nil {
		return w, fmt.Errorf("sync: waiting for a world epoch after %d (too few workers, or no driver?): %w", after, err)
	}
	return w, nil
}

// ReportFailure hands the report to the agent, which sends it to the
// proposer (again until a newer epoch arrives).
func (s *memberSource) ReportFailure(number uint64, peer epoch.Member, cause error) {
	s.agent.ReportFailure(number, peer.Name, cause)
}
