package membership

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gorovod/gorovod/internal/logging"
)

var (
	// ErrClosed is returned by calls on a Member after Leave or Shutdown.
	ErrClosed = errors.New("membership: member is shut down")
	// ErrOtherJob is wrapped by Join's error when a seed belongs to another
	// job: retrying cannot help, so Join fails at once.
	ErrOtherJob = errors.New("membership: seed belongs to another job")
	// ErrMessageTooLarge is wrapped by Send's error for a payload over
	// Config.MaxMessageSize.
	ErrMessageTooLarge = errors.New("membership: message over MaxMessageSize")
)

// Stats counts what a Member dropped or refused, for diagnostics.
type Stats struct {
	// MessagesReceived were queued for Messages().
	MessagesReceived uint64
	// MessagesDropped arrived while the Messages queue was full, or after Shutdown.
	MessagesDropped uint64
	// MessagesForeign carried another job's id.
	MessagesForeign uint64
	// MessagesMalformed were not valid frames or were over MaxMessageSize.
	MessagesMalformed uint64
	// NodesRejected counts alive and join messages refused because the node
	// belongs to another job or its metadata does not decode.
	NodesRejected uint64
	// EventsCoalesced counts events replaced by a newer one about the same
	// member before a reader took them.
	EventsCoalesced uint64
	// MessagesUnverified were not signed by the key their sender published
	// (a forged sender, or a sender whose metadata has not arrived yet).
	MessagesUnverified uint64
	// MessagesReplayed carried a sequence number already accepted from
	// their sender, or one too far behind its newest.
	MessagesReplayed uint64
	// KeysRefused counts alive messages, merges and metadata refused
	// because they named another signing key than the first one seen under
	// that member's name (ErrSigningKeyChanged).
	KeysRefused uint64
	// MetaRefused counts alive messages, merges and metadata refused because
	// their member did not seal them, or sealed them before the newest one
	// accepted from it (ErrMetaUnsealed).
	MetaRefused uint64
	// AddrsRefused counts alive messages and merges refused because they
	// named a member at another gossip address than the first one seen
	// under its name (ErrGossipAddrChanged).
	AddrsRefused uint64
}

// Member is this process's membership in its job's gossip cluster: one
// incarnation, from Join to Leave or Shutdown. Its methods are safe for
// concurrent use.
type Member struct {
	cfg   Config
	name  string
	jobID string
	log   *slog.Logger
	ml    *memberlist.Memberlist // set once Create returns; delegates never use it

	// metaMu guards meta and metaSeq; metaBytes is its sealed encoding
	// (sealMeta, under sequence number metaSeq), read by memberlist's NodeMeta
	// callback without taking metaMu.
	metaMu    sync.Mutex
	meta      Meta
	metaSeq   uint64
	metaBytes atomic.Pointer[[]byte]
	updateSem chan struct{} // one UpdateMeta at a time, waitable with a context

	// mu guards nodes (the alive members as reported by memberlist's event
	// delegate, which is what Members reads: memberlist's own Node structs
	// change under its lock) and selfAddr and foreignAddrs.
	mu           sync.Mutex
	nodes        map[string]*nodeEntry
	selfAddr     netip.AddrPort
	foreignAddrs map[netip.AddrPort]struct{} // nodes refused at a join merge
	// auth holds each peer's pinned signing key and sequence numbers (see
	// auth.go); goneAuth queues the names that are not alive members, to
	// forget the oldest beyond maxGonePeers. Guarded by mu.
	auth     map[string]*peerAuth
	goneAuth []string
	signKey  ed25519.PrivateKey // this incarnation's; its public half is in meta

	events   *eventQueue
	eventsCh chan Event
	done     chan struct{} // closed by Shutdown
	pumpDone chan struct{}

	// msgMu orders deliveries against the close of msgs at Shutdown.
	msgMu     sync.Mutex
	msgs      chan Message
	msgClosed bool

	// lifeMu serializes memberlist's Leave and Shutdown: memberlist panics on
	// a Leave after Shutdown.
	lifeMu sync.Mutex
	closed atomic.Bool
	// quiet is set once this member leaves or shuts down: memberlist's
	// complaints about its own sockets closing are then not news.
	quiet      atomic.Bool
	logLimiter *logging.RateLimiter

	messagesReceived, messagesDropped, messagesForeign, messagesMalformed, nodesRejected atomic.Uint64
	messagesUnverified, messagesReplayed, keysRefused, metaRefused, addrsRefused         atomic.Uint64
}

type nodeEntry struct {
	node Node
	bye  bool // the member said goodbye: its death is a graceful Left
}

// maxForeignAddrs bounds the remembered addresses of refused nodes.
const maxForeignAddrs = 64

// Join starts this process's member and joins the cluster through cfg.Seeds,
// retrying with backoff while no seed answers, until ctx ends. With no seeds
// (other than this member's own address) it starts a new cluster. ctx bounds
// only the joining; the Member lives until Leave or Shutdown.
//
// Zero Meta fields are filled: Role worker, State joining, StartedAt now, Host
// the host name. A Meta that does not encode within MaxMetaSize is an error.
func Join(ctx context.Context, cfg Config, meta Meta) (*Member, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	meta = meta.Clone()
	if meta.Role == 0 {
		meta.Role = RoleWorker
	}
	if meta.State == 0 {
		meta.State = StateJoining
	}
	if meta.StartedAt == 0 {
		meta.StartedAt = time.Now().UnixNano()
	}
	if meta.Host == "" {
		meta.Host, _ = os.Hostname()
	}
	pub, priv, err := ed25519.GenerateKey(crand.Reader)
	if err != nil {
		return nil, fmt.Errorf("membership: making a signing key: %w", err)
	}
	meta.SigningKey = pub
	enc, err := meta.MarshalBinary()
	if err != nil {
		return nil, err
	}
	key, err := gossipKey(cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("membership: deriving the gossip key: %w", err)
	}
	m := &Member{
		cfg:          cfg,
		name:         cfg.Name,
		jobID:        meta.JobID,
		log:          cfg.Logger.With("member", cfg.Name),
		meta:         meta,
		metaSeq:      1,
		updateSem:    make(chan struct{}, 1),
		nodes:        make(map[string]*nodeEntry),
		foreignAddrs: make(map[netip.AddrPort]struct{}),
		auth:         map[string]*peerAuth{cfg.Name: {key: pub, alive: true}},
		signKey:      priv,
		events:       newEventQueue(),
		eventsCh:     make(chan Event),
		done:         make(chan struct{}),
		pumpDone:     make(chan struct{}),
		msgs:         make(chan Message, cfg.MessageQueue),
	}
	enc = sealMeta(priv, cfg.Name, enc, 1)
	m.metaBytes.Store(&enc)
	go func() {
		defer close(m.pumpDone)
		m.events.pump(m.eventsCh, m.done)
	}()

	d := &delegate{m}
	mlLog, limiter := newMemberlistLogger(m.log, cfg.LogRepeatWindow, &m.quiet, m.departed)
	m.logLimiter = limiter
	mc := cfg.memberlistConfig(key, mlLog)
	mc.Delegate, mc.Events, mc.Alive, mc.Merge = d, d, d, d
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = m.Shutdown()
		return nil, fmt.Errorf("membership: starting gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	m.ml = ml
	if err := m.joinSeeds(ctx); err != nil {
		_ = m.Shutdown()
		return nil, err
	}
	return m, nil
}

// joinSeeds contacts the seeds until one answers, someone joins us, or ctx ends.
func (m *Member) joinSeeds(ctx context.Context) error {
	if len(m.cfg.Seeds) == 0 {
		m.log.Info("membership: started a new cluster", "addr", m.Local().Addr)
		return nil
	}
	start := time.Now()
	backoff := m.cfg.JoinRetry
	var lastErr error
	for attempt := 1; ; attempt++ {
		// Resolve every round: a seed's name may not resolve until its
		// process (or pod) exists.
		addrs, onlySelf, err := m.resolveAddrs(ctx, m.cfg.Seeds)
		switch {
		case onlySelf:
			m.log.Info("membership: every seed is this member; started a new cluster", "addr", m.Local().Addr)
			return nil
		case len(addrs) > 0:
			err = m.joinOnce(ctx, addrs)
		}
		if err == nil || m.ml.NumMembers() > 1 {
			// Joined, or another member joined us while we were retrying
			// (two seeds that start together find each other either way).
			m.log.Info("membership: joined", "seeds", m.cfg.Seeds, "attempts", attempt,
				"members", m.ml.NumMembers(), "elapsed", time.Since(start))
			return nil
		}
		if m.triedForeign(addrs) {
			return fmt.Errorf("%w: %v (this member's job is %q)", ErrOtherJob, m.cfg.Seeds, m.jobID)
		}
		lastErr = err
		m.log.Debug("membership: join attempt failed", "attempt", attempt, "err", err)
		// Jitter keeps many workers started at once from retrying in lockstep.
		wait := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("membership: joining through %v: %w (last error: %v)", m.cfg.Seeds, ctx.Err(), lastErr)
		}
		backoff = min(2*backoff, m.cfg.JoinRetryMax)
	}
}

// Reconnect contacts the seeds once more, as Join did: a member cut off
// from them by a partition sees them as failed, and they see it so, and
// gossip alone never brings the two sides together again (each probes only
// the members it believes alive). A round through the seeds exchanges the
// full state: both sides learn that the other is alive (each refutes its
// own death) and the cluster is whole again. It returns nil once a seed
// answered, or the reason none did within ctx.
func (m *Member) Reconnect(ctx context.Context) error {
	return m.Contact(ctx, m.cfg.Seeds)
}

// Contact runs one join round through addrs ("host:port" gossip addresses
// of members, this member's own skipped), as Join does through the seeds: a
// member that started a cluster of its own (a driver taking a running job
// back at another address than the workers' seed) merges with the members
// at addrs, and gossip then tells every member of theirs about it. It
// returns nil once one of addrs answered, or the reason none did within ctx.
func (m *Member) Contact(ctx context.Context, addrs []string) error {
	resolved, onlySelf, err := m.resolveAddrs(ctx, addrs)
	switch {
	case onlySelf:
		return nil
	case len(resolved) == 0:
		return fmt.Errorf("membership: no address to contact the cluster through: %w", err)
	}
	return m.joinOnce(ctx, resolved)
}

// joinOnce runs one memberlist join round, abandoning the wait when ctx ends
// (the round itself ends within TCPTimeout per address).
func (m *Member) joinOnce(ctx context.Context, addrs []netip.AddrPort) error {
	hosts := make([]string, len(addrs))
	for i, a := range addrs {
		hosts[i] = a.String()
	}
	errc := make(chan error, 1)
	go func() {
		n, err := m.ml.Join(hosts)
		if n > 0 {
			err = nil
		} else if err == nil {
			err = errors.New("no seed answered")
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resolveAddrs returns the addresses of seeds (gossip addresses: the
// configured seeds, or those given to Contact) that are not this member.
// onlySelf is true when every one is this member. One that does not resolve
// yet counts as another member, so Join keeps trying it.
func (m *Member) resolveAddrs(ctx context.Context, seeds []string) (addrs []netip.AddrPort, onlySelf bool, err error) {
	self := m.Local().Addr
	others := 0
	var errs []error
	for _, seed := range seeds {
		ips, err := resolve(ctx, seed)
		if err != nil {
			others++
			errs = append(errs, err)
			continue
		}
		if slices.ContainsFunc(ips, func(a netip.AddrPort) bool { return m.isSelf(a, self) }) {
			continue
		}
		others++
		addrs = append(addrs, ips...)
	}
	return addrs, others == 0, errors.Join(errs...)
}

// resolve turns "host:port" into addresses, under ctx.
func resolve(ctx context.Context, seed string) ([]netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(seed); err == nil {
		return []netip.AddrPort{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
	}
	host, sport, err := net.SplitHostPort(seed)
	if err != nil {
		return nil, fmt.Errorf("membership: seed %q: %v", seed, err)
	}
	port, err := net.DefaultResolver.LookupPort(ctx, "tcp", sport)
	if err != nil {
		return nil, fmt.Errorf("membership: seed %q: %v", seed, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("membership: seed %q: %v", seed, err)
	}
	out := make([]netip.AddrPort, len(ips))
	for i, ip := range ips {
		out[i] = netip.AddrPortFrom(ip.Unmap(), uint16(port))
	}
	return out, nil
}

// isSelf reports whether a is this member's gossip address. A member bound to
// a wildcard address also answers on its loopback and interface addresses.
func (m *Member) isSelf(a, self netip.AddrPort) bool {
	if a == self {
		return true
	}
	if a.Port() != self.Port() {
		return false
	}
	bind, err := netip.ParseAddr(m.cfg.BindAddr)
	if err != nil || !bind.IsUnspecified() {
		return false
	}
	if a.Addr().IsLoopback() {
		return true
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ia := range ifaddrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil && p.Addr().Unmap() == a.Addr() {
			return true
		}
	}
	return false
}

// triedForeign reports whether one of addrs was refused as another job's.
func (m *Member) triedForeign(addrs []netip.AddrPort) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range addrs {
		if _, ok := m.foreignAddrs[a]; ok {
			return true
		}
	}
	return false
}

// Name returns this member's name (unique to this incarnation).
func (m *Member) Name() string { return m.name }

// Local returns this member with its current metadata.
func (m *Member) Local() Node {
	m.mu.Lock()
	addr := m.selfAddr
	m.mu.Unlock()
	m.metaMu.Lock()
	defer m.metaMu.Unlock()
	return Node{Name: m.name, Addr: addr, Meta: m.meta.Clone()}
}

// Members returns the alive members, this one included, oldest first (by
// StartedAt, then by name), so every member that knows the same set lists it
// in the same order. Members in State leaving are still listed until they go.
func (m *Member) Members() []Node {
	m.mu.Lock()
	out := make([]Node, 0, len(m.nodes))
	for _, e := range m.nodes {
		out = append(out, e.node.clone())
	}
	m.mu.Unlock()
	SortNodes(out)
	return out
}

// SortNodes sorts nodes oldest first: by Meta.StartedAt, then by Name.
func SortNodes(nodes []Node) {
	slices.SortFunc(nodes, func(a, b Node) int {
		return cmp.Or(cmp.Compare(a.Meta.StartedAt, b.Meta.StartedAt), cmp.Compare(a.Name, b.Name))
	})
}

// NumMembers returns how many members are alive, this one included.
func (m *Member) NumMembers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.nodes)
}

// Events returns the stream of membership changes seen here, this member's
// own Joined and Updated included. It is closed by Leave or Shutdown. See
// eventQueue for the overflow policy: a slow reader sees every member's latest
// state, possibly without the intermediate ones.
func (m *Member) Events() <-chan Event { return m.eventsCh }

// Messages returns the stream of messages other members sent with Send. It
// holds Config.MessageQueue messages; beyond that new ones are dropped and
// counted in Stats. It is closed by Leave or Shutdown.
func (m *Member) Messages() <-chan Message { return m.msgs }

// Stats returns the counters of dropped and refused traffic.
func (m *Member) Stats() Stats {
	return Stats{
		MessagesReceived:   m.messagesReceived.Load(),
		MessagesDropped:    m.messagesDropped.Load(),
		MessagesForeign:    m.messagesForeign.Load(),
		MessagesMalformed:  m.messagesMalformed.Load(),
		NodesRejected:      m.nodesRejected.Load(),
		EventsCoalesced:    m.events.coalesced.Load(),
		MessagesUnverified: m.messagesUnverified.Load(),
		MessagesReplayed:   m.messagesReplayed.Load(),
		KeysRefused:        m.keysRefused.Load(),
		MetaRefused:        m.metaRefused.Load(),
		AddrsRefused:       m.addrsRefused.Load(),
	}
}

// UpdateMeta changes this member's metadata with update and broadcasts it,
// waiting until the broadcast went out (bounded by ctx and
// Config.UpdateTimeout). An update that would not encode (too large, invalid,
// or a changed JobID) is refused and nothing changes. When the wait is cut
// short, the new metadata is already in force here and still reaches the
// others through gossip and push/pull.
func (m *Member) UpdateMeta(ctx context.Context, update func(*Meta)) error {
	return m.updateMeta(ctx, update, nil)
}

// Announce changes this member's metadata with update, as UpdateMeta does,
// and tells the members to about it directly, over their encrypted TCP
// streams (as Send), instead of leaving them to gossip: a change of State
// (ready, leaving) reaches the member that acts on it at once rather than
// after a few gossip rounds (tens to hundreds of milliseconds, more in a
// large cluster). Gossip spreads the change to everyone else in the
// background: Announce does not wait for its broadcast. A receiver applies
// what it is told only when it moves the member's State forward, so a late
// copy never undoes newer gossip. It returns once each of to received the
// metadata or could not (logged at debug level: gossip still brings it to
// them, so that is no error), or with ctx's error.
func (m *Member) Announce(ctx context.Context, update func(*Meta), to []Node) error {
	if to == nil {
		to = []Node{} // nobody to tell, and still no wait for the broadcast
	}
	return m.updateMeta(ctx, update, to)
}

// updateMeta is UpdateMeta, or with tell set Announce.
func (m *Member) updateMeta(ctx context.Context, update func(*Meta), tell []Node) error {
	if m.closed.Load() {
		return ErrClosed
	}
	select {
	case m.updateSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.updateSem }()

	// updateSem makes this the only writer of meta, so update can run without
	// metaMu held (and may call Local or Members).
	m.metaMu.Lock()
	cur := m.meta.Clone()
	m.metaMu.Unlock()
	next := cur.Clone()
	update(&next)
	if next.JobID != cur.JobID {
		return fmt.Errorf("membership: UpdateMeta may not change JobID (%q to %q)", cur.JobID, next.JobID)
	}
	if !bytes.Equal(next.SigningKey, cur.SigningKey) {
		return errors.New("membership: UpdateMeta may not change SigningKey")
	}
	if next.Equal(cur) {
		return nil
	}
	enc, err := next.MarshalBinary()
	if err != nil {
		return err
	}
	next = next.Clone() // update may have kept a reference to next.Extra
	m.metaMu.Lock()
	m.meta = next
	m.metaSeq++
	enc = sealMeta(m.signKey, m.name, enc, m.metaSeq)
	m.metaBytes.Store(&enc)
	m.metaMu.Unlock()

	timeout := boundedTimeout(ctx, m.cfg.UpdateTimeout)
	errc := make(chan error, 1)
	go func() { errc <- m.ml.UpdateNode(timeout) }()
	if tell != nil {
		m.tell(ctx, tell, enc)
		return ctx.Err()
	}
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("membership: metadata updated here, broadcast not confirmed: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("membership: metadata updated here, broadcast not confirmed: %w", ctx.Err())
	case <-m.done:
		return ErrClosed
	}
}

// Send delivers payload to member to over its own encrypted TCP stream,
// bounded by ctx and Config.TCPTimeout. It returns once the frame is written
// to a connection the receiver accepted, not once the receiver read it.
//
// What it does not promise, so protocols on top must cope (number and
// acknowledge what matters, as they must for a peer's crash anyway):
//   - order: each Send is a separate stream handled by its own goroutine, so
//     two Sends to one member may arrive in either order;
//   - delivery: a receiver that crashes, or whose Messages queue is full,
//     loses the message; so does one that has not yet learned this member's
//     signing key (its metadata, which gossip brings within moments of the
//     join): it cannot tell such a message from a forgery.
func (m *Member) Send(ctx context.Context, to Node, payload []byte) error {
	if len(payload) > m.cfg.MaxMessageSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, len(payload), m.cfg.MaxMessageSize)
	}
	return m.send(ctx, to, frameData, payload)
}

func (m *Member) send(ctx context.Context, to Node, kind uint8, payload []byte) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !to.Addr.IsValid() {
		return fmt.Errorf("membership: send to %q: no address", to.Name)
	}
	f := frame{kind: kind, jobID: m.jobID, from: m.name, seq: m.nextSeq(to.Name), payload: payload}
	b := signFrame(m.signKey, to.Name, &f)
	dst := &memberlist.Node{Name: to.Name, Addr: net.IP(to.Addr.Addr().AsSlice()), Port: to.Addr.Port()}
	errc := make(chan error, 1)
	// memberlist's SendReliable takes no context; it ends within TCPTimeout.
	go func() { errc <- m.ml.SendReliable(dst, b) }()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("membership: send to %s: %w", to, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.done:
		return ErrClosed
	}
}

// Leave departs gracefully and shuts the member down: it publishes
// State=leaving, says goodbye to each peer directly (so they report Left, not
// Failed), broadcasts memberlist's leave and waits for it to go out, all
// bounded by ctx and Config.LeaveTimeout. The member is shut down even when a
// step fails; the error reports what could not be confirmed.
func (m *Member) Leave(ctx context.Context) error {
	if m.closed.Load() {
		return ErrClosed
	}
	m.quiet.Store(true)
	ctx, cancel := context.WithTimeout(ctx, m.cfg.LeaveTimeout)
	defer cancel()
	var errs []error
	if err := m.UpdateMeta(ctx, func(meta *Meta) { meta.State = StateLeaving }); err != nil {
		errs = append(errs, err)
	}
	// A peer that died without a RST can hold a goodbye for TCPTimeout; keep
	// half of the budget for memberlist's own leave broadcast.
	gctx, gcancel := context.WithTimeout(ctx, boundedTimeout(ctx, m.cfg.LeaveTimeout)/2)
	m.sayGoodbye(gctx)
	gcancel()

	m.lifeMu.Lock()
	if !m.closed.Load() {
		if err := m.ml.Leave(boundedTimeout(ctx, m.cfg.LeaveTimeout)); err != nil {
			errs = append(errs, fmt.Errorf("membership: leave: %w", err))
		}
	}
	m.lifeMu.Unlock()
	if err := m.Shutdown(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Reach checks that member to's process still listens: it delivers an empty
// frame to its gossip port over a new stream, and returns nil once one was
// accepted, or the dial's error. A refused connection
// (errors.Is(err, syscall.ECONNREFUSED)) means that nothing listens there any
// more: the member's process is gone, while memberlist's own failure
// detection would take its probe and suspicion timeouts (most of a second)
// to say so. A silent peer (a dead machine, a cut cable) makes it wait for
// ctx or Config.TCPTimeout instead.
func (m *Member) Reach(ctx context.Context, to Node) error {
	return m.send(ctx, to, frameReach, nil)
}

// reachTimeout bounds one look of WhenGone: a refusal comes back within a
// round trip; a silent peer is left to memberlist's failure detection.
const reachTimeout = 500 * time.Millisecond

// WhenGone looks, in parallel, whether each of nodes other than this member
// still listens (Reach), and calls gone (from several goroutines at once) for
// each whose gossip port refuses connections, with the dial's error, as the
// refusal comes: its process is gone. It returns when every look has ended, within reachTimeout
// or ctx; a silent node is not reported.
func (m *Member) WhenGone(ctx context.Context, nodes []Node, gone func(Node, error)) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.Name == m.name {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, reachTimeout)
			defer cancel()
			if err := m.Reach(ctx, n); errors.Is(err, syscall.ECONNREFUSED) {
				gone(n, err)
			}
		})
	}
	wg.Wait()
}

// tell sends the encoded metadata enc to each of to, in parallel.
func (m *Member) tell(ctx context.Context, to []Node, enc []byte) {
	var wg sync.WaitGroup
	for _, n := range to {
		if n.Name == m.name {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, m.cfg.TCPTimeout)
			defer cancel()
			if err := m.send(ctx, n, frameMeta, enc); err != nil {
				m.log.Debug("membership: could not tell a member of this one's metadata; gossip will", "to", n.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// goodbyeConcurrency bounds the goodbye streams open at once.
const goodbyeConcurrency = 16

// sayGoodbye tells every peer, in parallel, that this member is leaving.
// Failures only cost a peer the distinction between Left and Failed.
func (m *Member) sayGoodbye(ctx context.Context) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, goodbyeConcurrency)
	for _, n := range m.Members() {
		if n.Name == m.name {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := m.send(ctx, n, frameBye, nil); err != nil {
				m.log.Debug("membership: goodbye not delivered", "to", n.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// Shutdown stops the member at once, without telling anyone: the others see
// it as Failed, as they would a crash. It closes Events and Messages. Calling
// it again, or after Leave, does nothing.
func (m *Member) Shutdown() error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed.Swap(true) {
		return nil
	}
	m.quiet.Store(true)
	var err error
	if m.ml != nil {
		err = m.ml.Shutdown()
	}
	if m.logLimiter != nil {
		m.logLimiter.Flush()
	}
	close(m.done)
	<-m.pumpDone
	m.msgMu.Lock()
	m.msgClosed = true
	close(m.msgs)
	m.msgMu.Unlock()
	return err
}

// boundedTimeout is the smaller of limit and ctx's remaining time, and always
// positive: memberlist waits forever on a zero timeout.
func boundedTimeout(ctx context.Context, limit time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	return max(limit, time.Millisecond)
}
