package membership

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/gossipforge"
)

// These tests attack gossip from outside the members' processes, as another
// process on the network would: memberlist's own suspect, dead and alive
// messages and push/pull exchanges, built by internal/testing/gossipforge
// and sent to the members' gossip ports over loopback sockets. An outsider
// has no key (or a wrong one); an insider holds the job secret, and so the
// gossip key, but not any member's signing key.

// logCounter counts a member's log records by the text they contain: the
// drops memberlist logs are the events these tests wait on.
type logCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCounter) WithGroup(string) slog.Handler            { return c }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.lines = append(c.lines, r.Message)
	c.mu.Unlock()
	return nil
}

func (c *logCounter) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// eventLog records what a member reports about one other member, from the
// moment it is made until the test ends.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func watchEvents(t *testing.T, m *Member, about string) *eventLog {
	l := &eventLog{}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case e, ok := <-m.Events():
				if !ok {
					return
				}
				if e.Node.Name == about {
					l.mu.Lock()
					l.events = append(l.events, e)
					l.mu.Unlock()
				}
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return l
}

func (l *eventLog) snapshot() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// forgeCluster is three members that log what memberlist drops, each line
// (no repeats held back): a and b, and the victim v the attacks name.
type forgeCluster struct {
	a, b, v          *Member
	logA, logB, logV *logCounter
}

func startForgeCluster(t *testing.T) *forgeCluster {
	t.Helper()
	c := &forgeCluster{logA: &logCounter{}, logB: &logCounter{}, logV: &logCounter{}}
	cfg := func(name string, l *logCounter) Config {
		cfg := testConfig(name)
		cfg.Logger = slog.New(l)
		cfg.LogRepeatWindow = time.Nanosecond
		return cfg
	}
	c.a = join(t, cfg("a", c.logA), testMeta(0))
	seeds := []string{c.a.Local().Addr.String()}
	cb, cv := cfg("b", c.logB), cfg("v", c.logV)
	cb.Seeds, cv.Seeds = seeds, seeds
	c.b = join(t, cb, testMeta(1))
	c.v = join(t, cv, testMeta(2))
	waitConverged(t, []*Member{c.a, c.b, c.v}, time.Now())
	return c
}

// observationWindow is how long a forged message that a member had
// accepted takes, at most, to show: an alive or dead message is applied
// (an Updated or Failed event) as it is handled; a suspicion nobody refutes
// turns into a death after the suspicion timeout, at most
// SuspicionMaxTimeoutMult × SuspicionMult × ProbeInterval (log10 of the
// cluster size is under 1 here). One probe interval more covers the
// gossip round that carries it.
func observationWindow(cfg Config) time.Duration {
	return time.Duration(cfg.SuspicionMaxTimeoutMult*cfg.SuspicionMult)*cfg.ProbeInterval + cfg.ProbeInterval
}

// TestGossipForgeryKeyMatches: the forger derives the gossip key as a
// member does (the insider tests rely on it).
func TestGossipForgeryKeyMatches(t *testing.T) {
	want, err := gossipKey(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := gossipforge.GossipKey(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("gossipforge.GossipKey differs from the members' gossip key")
	}
}

// TestOutsiderCannotForgeGossip: a process without the gossip key sends
// memberlist's suspect, dead (from another member and from the victim
// itself, which memberlist reads as a leave) and alive (another address,
// other metadata) messages about a live member, in clear and encrypted with
// a wrong key, as UDP packets and as TCP push/pull exchanges (joins and
// periodic ones), to every member. Every one is dropped where it arrives
// (memberlist logs the drop: that is what each case waits for); and
// through an observation window after the last of them, no member reports
// anything about the victim, which every member still lists with its own
// address and metadata, and which never had anything to refute.
//
// This guards existing behaviour (memberlist's encryption with
// GossipVerifyIncoming): it passes on main.
func TestOutsiderCannotForgeGossip(t *testing.T) {
	c := startForgeCluster(t)
	v := c.v.Local()
	watchA, watchB := watchEvents(t, c.a, v.Name), watchEvents(t, c.b, v.Name)
	wrongKey, err := gossipforge.GossipKey([]byte("not the job secret " + randHex(8)))
	if err != nil {
		t.Fatal(err)
	}
	evil := netip.MustParseAddrPort("127.0.0.1:9")
	forgedMeta := v.Meta.Clone()
	forgedMeta.CollectiveAddr = evil.String()
	metaBytes, err := forgedMeta.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	const inc = 1 << 20
	alive := gossipforge.Alive{Incarnation: inc, Node: v.Name, Addr: evil.Addr().AsSlice(), Port: evil.Port(), Meta: metaBytes, Vsn: gossipforge.Versions}
	packets := []struct {
		name string
		msg  any
	}{
		{"suspect", gossipforge.Suspect{Incarnation: inc, Node: v.Name, From: c.a.Name()}},
		{"dead", gossipforge.Dead{Incarnation: inc, Node: v.Name, From: c.a.Name()}},
		{"left", gossipforge.Dead{Incarnation: inc, Node: v.Name, From: v.Name}},
		{"alive elsewhere", alive},
	}
	states := []struct {
		name  string
		state gossipforge.State
	}{
		{"suspect", gossipforge.StateSuspect}, {"dead", gossipforge.StateDead},
		{"left", gossipforge.StateLeft}, {"alive elsewhere", gossipforge.StateAlive},
	}
	keys := []struct {
		name string
		key  []byte
	}{{"in clear", nil}, {"wrong key", wrongKey}}
	receivers := []struct {
		m   *Member
		log *logCounter
	}{{c.a, c.logA}, {c.b, c.logB}, {c.v, c.logV}}

	type attack struct {
		name string
		send func(t *testing.T, to netip.AddrPort)
		drop string // what memberlist logs when it drops it
	}
	var attacks []attack
	for _, k := range keys {
		for _, p := range packets {
			packet, err := gossipforge.MessagePacket(k.key, p.msg)
			if err != nil {
				t.Fatal(err)
			}
			attacks = append(attacks, attack{"udp " + p.name + " " + k.name, func(t *testing.T, to netip.AddrPort) {
				if err := gossipforge.SendPacket(to, packet); err != nil {
					t.Fatal(err)
				}
			}, "Decrypt packet failed"})
		}
		for _, s := range states {
			for _, joining := range []bool{false, true} {
				node := gossipforge.NodeState{Name: v.Name, Addr: evil.Addr().AsSlice(), Port: evil.Port(),
					Meta: metaBytes, Incarnation: inc, State: s.state, Vsn: gossipforge.Versions}
				if s.state != gossipforge.StateAlive {
					node.Addr, node.Port = v.Addr.Addr().AsSlice(), v.Addr.Port()
				}
				stream, err := gossipforge.PushPull(k.key, joining, []gossipforge.NodeState{node})
				if err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("tcp push/pull %s %s join=%v", s.name, k.name, joining)
				attacks = append(attacks, attack{name, func(t *testing.T, to netip.AddrPort) {
					if _, err := gossipforge.Exchange(t.Context(), to, stream, 5*time.Second); err != nil {
						t.Logf("exchange with %v: %v", to, err)
					}
				}, "failed to receive"})
			}
		}
	}

	for _, at := range attacks {
		t.Run(at.name, func(t *testing.T) {
			for _, r := range receivers {
				before := r.log.count(at.drop)
				at.send(t, r.m.Local().Addr)
				eventually(t, detectBound, r.m.Name()+" drops it", func() bool { return r.log.count(at.drop) > before })
			}
		})
	}

	// Nothing that was dropped can still act; this window is for anything
	// that was not (see observationWindow).
	watched := []struct {
		m   *Member
		log *eventLog
	}{{c.a, watchA}, {c.b, watchB}}
	quiet(t, observationWindow(c.v.cfg), func() error {
		for _, w := range watched {
			for _, e := range w.log.snapshot() {
				if e.Kind != EventJoined || e.Node.Addr != v.Addr || !e.Node.Meta.Equal(v.Meta) {
					return fmt.Errorf("%s reported %v %s at %v (collective %s) after the attacks", w.m.Name(), e.Kind, e.Node.Name, e.Node.Addr, e.Node.Meta.CollectiveAddr)
				}
			}
		}
		return nil
	})
	for _, w := range watched {
		checkListed(t, w.m, v)
	}
	if n := c.logV.count("Refuting"); n != 0 {
		t.Errorf("the victim refuted %d messages: one reached memberlist", n)
	}
}

// checkListed fails unless m lists member v at its own address with its
// own metadata.
func checkListed(t *testing.T, m *Member, v Node) {
	t.Helper()
	for _, n := range m.Members() {
		if n.Name == v.Name {
			if n.Addr != v.Addr || !n.Meta.Equal(v.Meta) {
				t.Errorf("%s lists %s at %v with collective %s, want %v and %s", m.Name(), v.Name, n.Addr, n.Meta.CollectiveAddr, v.Addr, v.Meta.CollectiveAddr)
			}
			return
		}
	}
	t.Errorf("%s does not list %s any more", m.Name(), v.Name)
}

// quiet checks that calm keeps returning nil through window (an
// observation window: what is checked is that nothing happens), failing at
// the first error.
func quiet(t *testing.T, window time.Duration, calm func() error) {
	t.Helper()
	end := time.NewTimer(window)
	defer end.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := calm(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-end.C:
			if err := calm(); err != nil {
				t.Fatal(err)
			}
			return
		case <-tick.C:
		}
	}
}

// insiderKey is the gossip key, as a process that holds the job secret
// derives it.
func insiderKey(t *testing.T) []byte {
	t.Helper()
	key, err := gossipforge.GossipKey(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// TestInsiderForgedDeathIsRefuted: a process holding the job secret sends
// correctly encrypted suspect, dead and left messages about a live member,
// as UDP packets and in a TCP push/pull, to one member (b). What gossip does
// with them: a suspicion is re-gossiped, reaches the victim, and the victim
// refutes it (an alive message with a higher incarnation) before anyone
// declares it dead: no member reports it Failed. A death (or a leave in the
// victim's name) is believed at once: b reports the victim Failed, and
// re-gossips the death; the victim hears it, refutes it, and b reports it
// Joined again, at its own address with its own metadata. So a secret
// holder can make members see a live member die and come back; what the
// job does with that is the proposer's probe (sync/driver, sync:
// TestForgedGossipDeathKeepsTheWorld).
//
// This guards existing behaviour (memberlist's refutation): it passes on
// main.
func TestInsiderForgedDeathIsRefuted(t *testing.T) {
	c := startForgeCluster(t)
	v := c.v.Local()
	watchB := watchEvents(t, c.b, v.Name)
	key := insiderKey(t)
	udp := func(msg any) func(t *testing.T) {
		return func(t *testing.T) {
			if err := gossipforge.SendMessage(c.b.Local().Addr, key, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	tcp := func(state gossipforge.State, inc uint32) func(t *testing.T) {
		return func(t *testing.T) {
			stream, err := gossipforge.PushPull(key, false, []gossipforge.NodeState{{Name: v.Name, Addr: v.Addr.Addr().AsSlice(),
				Port: v.Addr.Port(), Incarnation: inc, State: state, Vsn: gossipforge.Versions}})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := gossipforge.Exchange(t.Context(), c.b.Local().Addr, stream, 5*time.Second); err != nil || n == 0 {
				t.Fatalf("push/pull with b: %d bytes back, %v", n, err)
			}
		}
	}
	inc := func(i int) uint32 { return 1<<20 + uint32(i)<<10 } // above every refutation before it
	for i, tc := range []struct {
		name    string
		send    func(t *testing.T)
		refutes string // what the victim logs
		dies    bool   // b reports it Failed (then Joined)
	}{
		{"udp suspect", udp(gossipforge.Suspect{Incarnation: inc(0), Node: v.Name, From: c.a.Name()}), "Refuting a suspect message", false},
		{"udp dead", udp(gossipforge.Dead{Incarnation: inc(1), Node: v.Name, From: c.a.Name()}), "Refuting a dead message", true},
		{"udp left", udp(gossipforge.Dead{Incarnation: inc(2), Node: v.Name, From: v.Name}), "Refuting a dead message", true},
		{"tcp push/pull dead (read as a suspicion)", tcp(gossipforge.StateDead, inc(3)), "Refuting a suspect message", false},
		{"tcp push/pull left", tcp(gossipforge.StateLeft, inc(4)), "Refuting a dead message", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := len(watchB.snapshot())
			// A victim that hears of its death by gossip to the dead refutes
			// a dead message; one that hears of it first in its own
			// push/pull refutes a suspicion (memberlist merges a remote
			// "dead" as a suspicion): either is the refutation.
			refutes := tc.refutes
			if tc.dies {
				refutes = "Refuting a "
			}
			refuted := c.logV.count(refutes)
			tc.send(t)
			// The victim hears of its death from b's gossip to the dead
			// (GossipToTheDeadTime) or its own push/pull (PushPullInterval),
			// whichever comes first: on a loaded machine that can take
			// longer than detectBound, so it gets both on top.
			refuteBound := detectBound + c.b.cfg.GossipToTheDeadTime + c.b.cfg.PushPullInterval
			eventually(t, refuteBound, "the victim's refutation", func() bool { return c.logV.count(refutes) > refuted })
			if tc.dies {
				eventually(t, detectBound, "b reports the victim Failed, then Joined", func() bool {
					evs := watchB.snapshot()[seen:]
					return len(evs) >= 2 && evs[0].Kind == EventFailed && evs[len(evs)-1].Kind == EventJoined
				})
			} else {
				quiet(t, observationWindow(c.b.cfg), func() error {
					for _, e := range watchB.snapshot()[seen:] {
						return fmt.Errorf("b reported %v for the victim of a refuted suspicion", e.Kind)
					}
					return nil
				})
			}
			checkListed(t, c.b, v)
			t.Logf("case %d: b reported %d events about the victim", i, len(watchB.snapshot())-seen)
		})
	}
}

// TestInsiderCannotForgeMeta: a process holding the job secret gossips
// alive messages for a live member v, correctly encrypted, with an
// incarnation above v's, to the other members: v's metadata with its own
// CollectiveAddr (unsealed, or sealed with a key of its own), v's earlier
// metadata replayed after v changed its CollectiveAddr, and v's current
// metadata at another gossip address. No member takes the forged metadata:
// they refuse what v did not seal (MetaRefused), do not apply what v sealed
// before the newest they have (MetaRefused), and refuse v at another gossip
// address than the one they first saw it at (AddrsRefused; memberlist
// itself would refuse it too, a live member's "Conflicting address"; see
// TestInsiderCannotMoveGossipAddress for when it would not). Every member
// keeps listing v at its own address with its own CollectiveAddr, so no
// world's collective dials the forger.
//
// Without the seal (NodeMeta being the bare Meta encoding, as before the
// seal existed) the first case is applied: the members report v Updated
// with the forger's CollectiveAddr until v refutes it.
func TestInsiderCannotForgeMeta(t *testing.T) {
	c := startForgeCluster(t)
	key := insiderKey(t)
	// v's metadata before it moves its collective transport: what a
	// replay offers.
	older := bytes.Clone(*c.v.metaBytes.Load())
	moved := netip.MustParseAddrPort("127.0.0.1:45999")
	if err := c.v.UpdateMeta(t.Context(), func(m *Meta) { m.CollectiveAddr = moved.String() }); err != nil {
		t.Fatal(err)
	}
	v := c.v.Local()
	for _, m := range []*Member{c.a, c.b} {
		waitFor(t, m, time.Now().Add(joinBound), "v's new collective address", func() bool {
			for _, n := range m.Members() {
				if n.Name == v.Name {
					return n.Meta.CollectiveAddr == moved.String()
				}
			}
			return false
		})
	}
	watchA, watchB := watchEvents(t, c.a, v.Name), watchEvents(t, c.b, v.Name)

	evil := netip.MustParseAddrPort("127.0.0.1:9")
	forged := v.Meta.Clone()
	forged.CollectiveAddr = evil.String()
	unsealed, err := forged.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	_, forgerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	current := bytes.Clone(*c.v.metaBytes.Load())

	refusedMeta := func(m *Member) uint64 { return m.Stats().MetaRefused + m.Stats().NodesRejected }
	refusedAddr := func(m *Member) uint64 { return m.Stats().AddrsRefused }
	for i, tc := range []struct {
		name    string
		meta    []byte
		at      netip.AddrPort
		refusal func(*Member) uint64 // counts the refusal at a receiver
	}{
		{"another collective address, unsealed", unsealed, v.Addr, refusedMeta},
		{"another collective address, sealed by the forger", sealMeta(forgerKey, v.Name, unsealed, 1<<30), v.Addr, refusedMeta},
		{"v's earlier metadata replayed", older, v.Addr, refusedMeta},
		{"v's metadata at another gossip address", current, evil, refusedAddr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alive := gossipforge.Alive{Incarnation: 1<<20 + uint32(i)<<10, Node: v.Name, Addr: tc.at.Addr().AsSlice(), Port: tc.at.Port(),
				Meta: tc.meta, Vsn: gossipforge.Versions}
			p, err := gossipforge.MessagePacket(key, alive)
			if err != nil {
				t.Fatal(err)
			}
			// Both counts are taken before the packet goes to either
			// member: a member that takes the message gossips it on, so the
			// other may see it first from there.
			type receiver struct {
				m            *Member
				log          *eventLog
				before, seen int
			}
			receivers := []*receiver{{m: c.a, log: watchA}, {m: c.b, log: watchB}}
			for _, w := range receivers {
				w.before, w.seen = int(tc.refusal(w.m)), len(w.log.snapshot())
			}
			for _, w := range receivers {
				if err := gossipforge.SendPacket(w.m.Local().Addr, p); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range receivers {
				applied := func() *Event {
					for _, e := range w.log.snapshot()[w.seen:] {
						if e.Node.Addr != v.Addr || e.Node.Meta.CollectiveAddr != v.Meta.CollectiveAddr {
							return &e
						}
					}
					return nil
				}
				eventually(t, detectBound, w.m.Name()+" refuses it or applies it", func() bool { return int(tc.refusal(w.m)) > w.before || applied() != nil })
				if e := applied(); e != nil {
					t.Fatalf("%s took the forgery: %v %s at %v with collective %s", w.m.Name(), e.Kind, e.Node.Name, e.Node.Addr, e.Node.Meta.CollectiveAddr)
				}
				checkListed(t, w.m, v)
			}
		})
	}
}

// TestInsiderCannotMoveGossipAddress: memberlist lets a member that left
// come back at another address, and takes a dead message that names its
// own sender as a leave. A process holding the job secret that sends a
// member (a) "v left" in v's name and then "v is alive" at another gossip
// address, with v's own sealed metadata (which it can replay), would have a
// send v's gossip, and the proposer's probes, to an address where nothing
// answers: v's refutation from its real address is then a conflicting
// address to a, and v is out for good. Members pin the gossip address a
// name was first seen at, as they pin its signing key: the alive message
// at the other address is refused (AddrsRefused), and once v refutes the
// forged leave, a lists v at its own address again.
func TestInsiderCannotMoveGossipAddress(t *testing.T) {
	c := startForgeCluster(t)
	key := insiderKey(t)
	v := c.v.Local()
	watchA := watchEvents(t, c.a, v.Name)
	evil := netip.MustParseAddrPort("127.0.0.1:9")
	send := func(msg any) {
		if err := gossipforge.SendMessage(c.a.Local().Addr, key, msg); err != nil {
			t.Fatal(err)
		}
	}
	const inc = 1 << 20
	refused := c.a.Stats().AddrsRefused
	send(gossipforge.Dead{Incarnation: inc, Node: v.Name, From: v.Name})
	eventually(t, detectBound, "a takes the forged leave", func() bool {
		return slices.ContainsFunc(watchA.snapshot(), func(e Event) bool { return e.Kind == EventFailed })
	})
	send(gossipforge.Alive{Incarnation: inc + 1, Node: v.Name, Addr: evil.Addr().AsSlice(), Port: evil.Port(),
		Meta: bytes.Clone(*c.v.metaBytes.Load()), Vsn: gossipforge.Versions})
	moved := func() bool {
		return slices.ContainsFunc(watchA.snapshot(), func(e Event) bool { return e.Kind == EventJoined && e.Node.Addr == evil })
	}
	eventually(t, detectBound, "a refuses the alive message at another address, or takes it", func() bool {
		return c.a.Stats().AddrsRefused > refused || moved()
	})
	if moved() {
		t.Fatalf("a took %s at %v", v.Name, evil)
	}
	eventually(t, detectBound, "a lists v again", func() bool { return hasMember(c.a, v.Name) })
	checkListed(t, c.a, v)
}
