package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/membership"
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
	// Membership: gossip timings; Seeds, Secret and the bind address above
	// override its fields.
	Membership membership.Config
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
	m   *membership.Member
	tr  *tcp.Transport
	src *memberSource
}

// StartWorker joins the job: it starts the collective transport and the gossip
// member, announces itself ready (call it once the trainer's own start-up —
// data, model — is done, so that joining never stalls the others), and waits
// until an epoch admits it and the state has arrived.
func StartWorker(ctx context.Context, cfg WorkerConfig, state *TrainState) (*Worker, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tc := tcp.DefaultConfig()
	tc.Secret, tc.Logger = cfg.Secret, log
	if cfg.ListenAddr != "" {
		tc.ListenAddr = cfg.ListenAddr
	}
	if cfg.IOTimeout > 0 {
		tc.IOTimeout = cfg.IOTimeout
	} else {
		tc.IOTimeout = 5 * time.Second
	}
	tr, err := tcp.Listen(tc)
	if err != nil {
		return nil, err
	}
	mc := cfg.Membership
	mc.Seeds, mc.Secret, mc.Logger = cfg.Seeds, cfg.Secret, log
	if err := bindGossip(&mc, cfg.GossipAddr); err != nil {
		tr.Close()
		return nil, err
	}
	m, err := membership.Join(ctx, mc, membership.Meta{JobID: cfg.JobID, Role: membership.RoleWorker, CollectiveAddr: tr.Addr()})
	if err != nil {
		tr.Close()
		return nil, err
	}
	w := &Worker{m: m, tr: tr, src: newMemberSource(m, log)}
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
	sc.JobID, sc.Self, sc.Logger = cfg.JobID, Member{Name: m.Name(), Addr: tr.Addr()}, log
	sess, err := Join(ctx, sc, tr, w.src, state)
	if err != nil {
		return fail(err)
	}
	w.Session = sess
	go w.watchFailures()
	return w, nil
}

// watchFailures aborts a collective stuck on a member that gossip has declared
// dead, so a frozen worker costs the gossip detection time (about a second)
// rather than the full I/O timeout.
func (w *Worker) watchFailures() {
	for {
		select {
		case <-w.src.done:
			return
		case ev := <-w.m.Events():
			if ev.Kind == membership.EventFailed {
				w.Session.AbortIfMember(ev.Node.Name, fmt.Errorf("gossip declared %s dead", ev.Node.Name))
			}
		}
	}
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

// Close leaves the gossip cluster and releases the transport.
func (w *Worker) Close() error {
	if w.Session != nil {
		w.Session.Close()
	}
	w.shutdown()
	return nil
}

func (w *Worker) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = w.m.Leave(ctx)
	_ = w.m.Shutdown()
	w.src.stop()
	_ = w.tr.Close()
}

// memberSource is a worker's EpochSource fed by the driver's announcements.
type memberSource struct {
	m   *membership.Member
	log *slog.Logger

	mu     stdsync.Mutex
	latest Epoch
	newer  chan struct{}
	driver string // name of the member the announcements come from
	done   chan struct{}
	once   stdsync.Once
}

func newMemberSource(m *membership.Member, log *slog.Logger) *memberSource {
	s := &memberSource{m: m, log: log, newer: make(chan struct{}), done: make(chan struct{})}
	go s.listen()
	return s
}

func (s *memberSource) stop() { s.once.Do(func() { close(s.done) }) }

func (s *memberSource) listen() {
	for {
		select {
		case <-s.done:
			return
		case msg := <-s.m.Messages():
			cm, err := decodeControl(msg.Payload)
			if err == nil && cm.Type == msgPing {
				go s.pong(msg.From, cm.Nonce)
				continue
			}
			if err != nil || cm.Type != msgEpoch {
				s.log.Warn("dropped control message", "from", msg.From.Name, "err", err)
				continue
			}
			if msg.From.Meta.Role != membership.RoleDriver && !s.isDriver(msg.From.Name) {
				s.log.Warn("epoch announced by a member that is not the driver", "from", msg.From.Name)
				continue
			}
			s.mu.Lock()
			s.driver = msg.From.Name
			if cm.Number > s.latest.Number {
				s.latest = Epoch{Number: cm.Number, Members: cm.Members}
				close(s.newer)
				s.newer = make(chan struct{})
			}
			s.mu.Unlock()
		}
	}
}

// isDriver covers an announcement that arrives before the driver's own
// metadata has reached this member.
func (s *memberSource) isDriver(name string) bool {
	for _, n := range s.m.Members() {
		if n.Name == name {
			return n.Meta.Role == membership.RoleDriver
		}
	}
	return false
}

// pong answers the driver's liveness check: the answer comes from this
// process's gossip goroutines, so a busy trainer still answers and only a dead
// or frozen process does not.
func (s *memberSource) pong(to membership.Node, nonce uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.m.Send(ctx, to, encodePing(msgPong, nonce))
}

func (s *memberSource) Latest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest.Number
}

func (s *memberSource) Await(ctx context.Context, after uint64) (Epoch, error) {
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
			return Epoch{}, fmt.Errorf("sync: waiting for a world epoch after %d (too few workers, or no driver?): %w", after, ctx.Err())
		}
	}
}

func (s *memberSource) ReportFailure(epoch uint64, peer Member, cause error) {
	var driver membership.Node
	found := false
	for _, n := range s.m.Members() {
		if n.Meta.Role == membership.RoleDriver {
			driver, found = n, true
			break
		}
	}
	if !found {
		s.log.Warn("no driver to report a failure to", "blamed", peer.Name)
		return
	}
	payload := encodeFailure(epoch, peer.Name, cause)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.m.Send(ctx, driver, payload); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Warn("failure report not delivered", "err", err)
		}
	}()
}
