package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestJoin: 1..5 members (and 8, the size at which memberlist's stock timings
// stall for 15-29 s in 40 % of joins), starting together, join through one
// seed or through several; every member lists every other, in the same order,
// with the metadata each published, within joinBound.
func TestJoin(t *testing.T) {
	for _, mode := range []string{"one seed", "several seeds"} {
		for _, n := range []int{1, 2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/%d members", mode, n), func(t *testing.T) {
				first := []*Member{join(t, testConfig("m0"), testMeta(0))}
				if mode == "several seeds" && n > 2 {
					cfg := testConfig("m1")
					cfg.Seeds = []string{first[0].Local().Addr.String()}
					first = append(first, join(t, cfg, testMeta(1)))
				}
				var seeds []string
				for _, m := range first {
					seeds = append(seeds, m.Local().Addr.String())
				}
				start := time.Now()
				ms := joinAll(t, first, n, func(int) []string { return seeds })
				took := waitConverged(t, ms, start)
				t.Logf("%d members, %s: all see all after %v", n, mode, took.Round(time.Millisecond))

				want := ms[0].Members()
				for i, m := range ms {
					got := m.Members()
					if !slices.EqualFunc(got, want, func(a, b Node) bool { return a.Name == b.Name && a.Addr == b.Addr && a.Meta.Equal(b.Meta) }) {
						t.Fatalf("member %d lists %v, member 0 lists %v", i, got, want)
					}
				}
				for i, m := range ms {
					local := m.Local()
					pub := testMeta(i)
					if local.Meta.CollectiveAddr != pub.CollectiveAddr || local.Meta.GPUs != pub.GPUs ||
						local.Meta.Extra["slot"] != pub.Extra["slot"] || local.Meta.Role != RoleWorker ||
						local.Meta.State != StateJoining || local.Meta.StartedAt == 0 || local.Meta.Host != "host-a" {
						t.Fatalf("member %d publishes %+v", i, local.Meta)
					}
					seen := ms[0].Members()[slices.IndexFunc(ms[0].Members(), func(nd Node) bool { return nd.Name == m.Name() })]
					if !seen.Meta.Equal(local.Meta) || seen.Addr != local.Addr {
						t.Fatalf("member 0 sees member %d as %+v, it publishes %+v", i, seen, local)
					}
				}
				for i := 1; i < len(want); i++ {
					if want[i-1].Meta.StartedAt > want[i].Meta.StartedAt {
						t.Fatalf("Members not sorted oldest first: %v", want)
					}
				}
			})
		}
	}
}

// TestJoinRetriesUntilSeedStarts: a member whose seed is not up yet keeps
// trying; the seed, whose own address is its only seed, starts a new cluster.
func TestJoinRetriesUntilSeedStarts(t *testing.T) {
	port := freePort(t)
	seedAddr := fmt.Sprintf("127.0.0.1:%d", port)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	type result struct {
		m   *Member
		err error
	}
	early := make(chan result, 1)
	// The early member's first refused round shows in its debug log; wait for
	// it so the test really covers a retry.
	refused := make(chan struct{}, 1)
	cfg := testConfig("early")
	cfg.Seeds = []string{seedAddr}
	// The early member gets a port of its own: left to pick one (port 0), it
	// can be handed the seed's just-freed port, find itself the only seed and
	// start a cluster alone.
	cfg.BindPort = freePortExcept(t, port)
	cfg.Logger = slog.New(recordHandler{min: slog.LevelDebug, fn: func(r slog.Record) {
		if r.Message == "membership: join attempt failed" {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}})
	go func() {
		m, err := Join(ctx, cfg, testMeta(1))
		early <- result{m, err}
	}()
	select {
	case r := <-early:
		t.Fatalf("joined before the seed existed: %v", r.err)
	case <-refused:
	case <-ctx.Done():
		t.Fatal("no refused join round")
	}

	cfg = testConfig("seed")
	cfg.BindPort = port
	cfg.Seeds = []string{seedAddr, "localhost:" + fmt.Sprint(port)}
	seed := join(t, cfg, testMeta(0))

	r := <-early
	if r.err != nil {
		t.Fatalf("early member: %v", r.err)
	}
	t.Cleanup(func() { _ = r.m.Shutdown() })
	waitConverged(t, []*Member{seed, r.m}, time.Now())
}

// TestJoinGivesUpWithContext: unreachable seeds make Join fail when ctx ends,
// not hang, and leave nothing running.
func TestJoinGivesUpWithContext(t *testing.T) {
	cfg := testConfig("lonely")
	seedPort := freePort(t)
	cfg.Seeds = []string{fmt.Sprintf("127.0.0.1:%d", seedPort)}
	cfg.BindPort = freePortExcept(t, seedPort) // never itself its only seed
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	m, err := Join(ctx, cfg, testMeta(0))
	if err == nil {
		_ = m.Shutdown()
		t.Fatal("joined an unreachable seed")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v does not wrap the context's", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Join returned %v after its context ended", took)
	}
}

// TestUpdateMetaPropagates: a change published with UpdateMeta reaches every
// member as Updated; invalid or oversized changes are refused without effect.
func TestUpdateMetaPropagates(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	ms := joinAll(t, []*Member{seed}, 3, func(int) []string { return []string{seed.Local().Addr.String()} })
	waitConverged(t, ms, time.Now())
	target := ms[2]

	start := time.Now()
	err := target.UpdateMeta(t.Context(), func(m *Meta) {
		m.State = StateReady
		m.GPUs = 8
		m.CollectiveAddr = "127.0.0.1:50000"
		m.Extra = map[string]string{"rack": "r1"}
	})
	if err != nil {
		t.Fatalf("UpdateMeta: %v", err)
	}
	local := target.Local().Meta
	if local.State != StateReady || local.GPUs != 8 || local.Extra["rack"] != "r1" {
		t.Fatalf("Local after UpdateMeta: %+v", local)
	}
	for _, m := range ms[:2] {
		// Joined counts too: a Joined this test did not read yet absorbs the
		// update (the queue keeps each member's latest state).
		e := waitEvent(t, m, start.Add(joinBound), "update", func(e Event) bool {
			return (e.Kind == EventUpdated || e.Kind == EventJoined) && e.Node.Name == target.Name() && e.Node.Meta.State == StateReady
		})
		if !e.Node.Meta.Equal(local) {
			t.Fatalf("%s saw %+v, want %+v", m.Name(), e.Node.Meta, local)
		}
		t.Logf("%s saw the update after %v", m.Name(), e.At.Sub(start).Round(time.Millisecond))
	}

	for _, tc := range []struct {
		name   string
		change func(*Meta)
		is     error
	}{
		{"too large", func(m *Meta) {
			m.Extra = map[string]string{"big": strings.Repeat("x", 255), "big2": strings.Repeat("y", 255)}
		}, ErrMetaTooLarge},
		{"invalid state", func(m *Meta) { m.State = 9 }, nil},
		{"changed job", func(m *Meta) { m.JobID = "other" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := target.Local().Meta
			err := target.UpdateMeta(t.Context(), tc.change)
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("error %v is not %v", err, tc.is)
			}
			if !target.Local().Meta.Equal(before) {
				t.Fatal("a refused update changed the metadata")
			}
		})
	}

	// The update function may read the member (it runs without its locks).
	err = target.UpdateMeta(t.Context(), func(m *Meta) { m.GPUs = target.Local().Meta.GPUs + len(target.Members()) })
	if err != nil || target.Local().Meta.GPUs != 8+3 {
		t.Fatalf("UpdateMeta reading the member: %v, GPUs %d", err, target.Local().Meta.GPUs)
	}
}

// TestLeaveSeenAsLeft: a graceful Leave reaches the others quickly, as Left.
func TestLeaveSeenAsLeft(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	ms := joinAll(t, []*Member{seed}, 3, func(int) []string { return []string{seed.Local().Addr.String()} })
	waitConverged(t, ms, time.Now())
	leaver := ms[2]
	name := leaver.Name()

	start := time.Now()
	if err := leaver.Leave(t.Context()); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	leaveCall := time.Since(start)
	for _, m := range ms[:2] {
		e := waitEvent(t, m, start.Add(leaveBound), "leave", func(e Event) bool {
			return e.Node.Name == name && (e.Kind == EventLeft || e.Kind == EventFailed)
		})
		if e.Kind != EventLeft {
			t.Fatalf("%s saw %v, want left", m.Name(), e)
		}
		if hasMember(m, name) {
			t.Fatalf("%s still lists %s", m.Name(), name)
		}
		t.Logf("%s saw the leave after %v (Leave call took %v)", m.Name(), e.At.Sub(start).Round(time.Millisecond), leaveCall.Round(time.Millisecond))
	}

	// The member is spent.
	for range leaver.Events() {
	}
	if err := leaver.Leave(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Leave: %v", err)
	}
	if err := leaver.Send(t.Context(), ms[0].Local(), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Leave: %v", err)
	}
	if err := leaver.UpdateMeta(t.Context(), func(m *Meta) { m.GPUs = 1 }); !errors.Is(err, ErrClosed) {
		t.Fatalf("UpdateMeta after Leave: %v", err)
	}
	if err := leaver.Shutdown(); err != nil {
		t.Fatalf("Shutdown after Leave: %v", err)
	}
}

// TestLeaveAlone: the last member leaves without waiting on anyone.
func TestLeaveAlone(t *testing.T) {
	m := join(t, testConfig("solo"), testMeta(0))
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := m.Leave(ctx); err != nil {
		t.Fatalf("Leave: %v", err)
	}
}

// TestCrashSeenAsFailed: a member that stops without a word (Shutdown is what
// a dead process looks like to the others) is reported Failed within the
// tuned bound.
func TestCrashSeenAsFailed(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	ms := joinAll(t, []*Member{seed}, 4, func(int) []string { return []string{seed.Local().Addr.String()} })
	waitConverged(t, ms, time.Now())
	victim := ms[3]
	name := victim.Name()

	start := time.Now()
	if err := victim.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:3] {
		e := waitEvent(t, m, start.Add(detectBound), "crash detection", func(e Event) bool {
			return e.Node.Name == name && (e.Kind == EventLeft || e.Kind == EventFailed)
		})
		if e.Kind != EventFailed {
			t.Fatalf("%s saw %v, want failed", m.Name(), e)
		}
		t.Logf("%s saw the crash after %v", m.Name(), e.At.Sub(start).Round(time.Millisecond))
	}
}

// TestWrongSecretCannotJoin: gossip is encrypted with the job secret; a member
// with another secret cannot join, and the cluster never lists it.
func TestWrongSecretCannotJoin(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	cfg := testConfig("intruder")
	cfg.Secret = []byte("not the job secret " + randHex(8))
	cfg.Seeds = []string{seed.Local().Addr.String()}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	m, err := Join(ctx, cfg, testMeta(1))
	if err == nil {
		_ = m.Shutdown()
		t.Fatal("joined with the wrong secret")
	}
	t.Logf("Join with the wrong secret: %v", err)
	if n := seed.NumMembers(); n != 1 {
		t.Fatalf("seed lists %d members: %v", n, names(seed.Members()))
	}
	// The seed reported nothing but itself.
	for {
		select {
		case e := <-seed.Events():
			if e.Node.Name != seed.Name() {
				t.Fatalf("seed saw %v", e)
			}
			continue
		default:
		}
		break
	}
}

// TestOtherJobIgnored: a process that holds the secret but belongs to another
// job is refused at once when it tries to join, never listed, and its messages
// are dropped and counted.
func TestOtherJobIgnored(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	peer := joinAll(t, []*Member{seed}, 2, func(int) []string { return []string{seed.Local().Addr.String()} })[1]
	waitConverged(t, []*Member{seed, peer}, time.Now())

	cfg := testConfig("stranger")
	cfg.Seeds = []string{seed.Local().Addr.String()}
	other := testMeta(2)
	other.JobID = "another-job"
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	m, err := Join(ctx, cfg, other)
	if err == nil {
		_ = m.Shutdown()
		t.Fatal("a member of another job joined")
	}
	if !errors.Is(err, ErrOtherJob) {
		t.Fatalf("Join error %v is not ErrOtherJob", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("refusal took %v; it should not retry", took)
	}
	// The seed merges (and refuses) the stranger's state after answering it.
	eventually(t, 2*time.Second, "seed counts the refused node", func() bool { return seed.Stats().NodesRejected > 0 })
	if n := seed.NumMembers(); n != 2 {
		t.Fatalf("seed lists %v", names(seed.Members()))
	}

	// A stranger on its own cluster can still address a member directly; its
	// messages are dropped.
	cfg = testConfig("stranger2")
	stranger := join(t, cfg, other)
	if err := stranger.Send(t.Context(), seed.Local(), []byte("hello from another job")); err != nil {
		t.Fatalf("Send: %v", err)
	}
	eventually(t, 2*time.Second, "foreign message counted", func() bool { return seed.Stats().MessagesForeign == 1 })
	select {
	case msg := <-seed.Messages():
		t.Fatalf("delivered a foreign message: %+v", msg)
	default:
	}
	if n := seed.NumMembers(); n != 2 {
		t.Fatalf("seed lists %v", names(seed.Members()))
	}
}

// TestMessages: Send reaches the addressed member with the sender identified;
// oversized, malformed and overflowing messages are refused or dropped and
// counted.
func TestMessages(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	ms := joinAll(t, []*Member{seed}, 3, func(int) []string { return []string{seed.Local().Addr.String()} })
	waitConverged(t, ms, time.Now())

	deadline := time.Now().Add(5 * time.Second)
	for i, to := range ms {
		payload := []byte(fmt.Sprintf("proposal for %d", i))
		if err := ms[0].Send(t.Context(), to.Local(), payload); err != nil {
			t.Fatalf("Send to %d: %v", i, err)
		}
		select {
		case msg := <-to.Messages():
			if string(msg.Payload) != string(payload) || msg.From.Name != ms[0].Name() || msg.From.Meta.JobID != testJob {
				t.Fatalf("member %d got %+v", i, msg)
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("member %d got nothing", i)
		}
	}

	big := make([]byte, DefaultConfig().MaxMessageSize+1)
	if err := ms[0].Send(t.Context(), ms[1].Local(), big); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("oversized Send: %v", err)
	}

	d := &delegate{ms[1]}
	d.NotifyMsg([]byte("garbage"))
	d.NotifyMsg(unsignedFrame(testJob, "x", frameData, big))
	if got := ms[1].Stats().MessagesMalformed; got != 2 {
		t.Fatalf("MessagesMalformed = %d, want 2", got)
	}

	// A sender whose signing key is not known here cannot be told from a
	// forger: its message is dropped and counted.
	d.NotifyMsg(unsignedFrame(testJob, "not-yet-known", frameData, []byte("hi")))
	if got := ms[1].Stats().MessagesUnverified; got != 1 {
		t.Fatalf("MessagesUnverified = %d, want 1", got)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := ms[0].Send(ctx, ms[1].Local(), []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send with a cancelled context: %v", err)
	}
}

// TestMessageQueueOverflow: a member that does not read its messages keeps
// MessageQueue of them and counts the rest as dropped.
func TestMessageQueueOverflow(t *testing.T) {
	cfg := testConfig("slow")
	cfg.MessageQueue = 2
	slow := join(t, cfg, testMeta(0))
	cfg = testConfig("fast")
	cfg.Seeds = []string{slow.Local().Addr.String()}
	fast := join(t, cfg, testMeta(1))
	// Messages from a member whose signing key has not reached the receiver
	// are dropped as unverifiable, not queued.
	waitConverged(t, []*Member{slow, fast}, time.Now())
	for i := range 5 {
		if err := fast.Send(t.Context(), slow.Local(), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Second, "5 messages accounted", func() bool {
		s := slow.Stats()
		return s.MessagesReceived+s.MessagesDropped == 5
	})
	if s := slow.Stats(); s.MessagesReceived != 2 || s.MessagesDropped != 3 {
		t.Fatalf("stats %+v", s)
	}
	if err := slow.Shutdown(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range slow.Messages() {
		n++
	}
	if n != 2 {
		t.Fatalf("%d queued messages readable after Shutdown, want 2", n)
	}
}

// TestContactMergesAClusterOfOne: a member that started a cluster of its
// own (a driver taking a job back at a new address, whose workers' seed is
// gone) contacts one member of a running cluster by its gossip address, and
// every member of that cluster, the others included through gossip, sees it;
// a Contact through addresses where nothing listens says so.
func TestContactMergesAClusterOfOne(t *testing.T) {
	first := join(t, testConfig("w0"), testMeta(0))
	seed := []string{first.Local().Addr.String()}
	ms := joinAll(t, []*Member{first}, 3, func(int) []string { return seed })
	waitConverged(t, ms, time.Now())
	alone := join(t, testConfig("d"), testMeta(9))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := alone.Contact(ctx, []string{"127.0.0.1:" + fmt.Sprint(freePort(t))}); err == nil {
		t.Fatal("Contact through an address where nothing listens succeeded")
	}
	if err := alone.Contact(ctx, []string{ms[2].Local().Addr.String()}); err != nil {
		t.Fatalf("Contact: %v", err)
	}
	waitConverged(t, append(ms, alone), time.Now())
}
