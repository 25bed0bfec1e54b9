package membership

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestAnnounceTellsDirectly: Announce delivers a change of state to the
// members it names without gossip (here gossip, probes and push/pull are all
// slowed to an hour, so only the direct message can carry it), and a copy
// older than what a member knows — told late, or gossiped late — never moves
// the state back.
func TestAnnounceTellsDirectly(t *testing.T) {
	quiet := func(name string) Config {
		cfg := testConfig(name)
		cfg.GossipInterval, cfg.PushPullInterval = time.Hour, time.Hour
		cfg.ProbeInterval, cfg.ProbeTimeout = time.Hour, time.Second
		return cfg
	}
	driverCfg := quiet("driver")
	driverMeta := testMeta(0)
	driverMeta.Role = RoleDriver
	drv := join(t, driverCfg, driverMeta)
	wcfg := quiet("worker")
	wcfg.Seeds = []string{drv.Local().Addr.String()}
	w := join(t, wcfg, testMeta(1))
	deadline := time.Now().Add(joinBound)
	waitFor(t, drv, deadline, "the driver knows the worker", func() bool { return hasMember(drv, w.Name()) })

	stateOf := func(name string) State {
		for _, n := range drv.Members() {
			if n.Name == name {
				return n.Meta.State
			}
		}
		return 0
	}
	for _, st := range []State{StateReady, StateLeaving} {
		start := time.Now()
		if err := w.Announce(t.Context(), func(m *Meta) { m.State = st }, []Node{drv.Local()}); err != nil {
			t.Fatalf("Announce %v: %v", st, err)
		}
		// The worker's Joined event may still be queued when the update
		// comes: the queue then keeps one Joined event with the newer
		// metadata (see eventQueue).
		e := waitEvent(t, drv, time.Now().Add(joinBound), "the announced state", func(e Event) bool {
			return (e.Kind == EventUpdated || e.Kind == EventJoined) && e.Node.Name == w.Name() && e.Node.Meta.State == st
		})
		t.Logf("the driver saw %v %v after Announce began", st, e.At.Sub(start).Round(time.Microsecond))
		if got := w.Local().Meta.State; got != st {
			t.Fatalf("the worker's own state is %v, want %v", got, st)
		}
	}

	// Late copies of the older state: told directly, and gossiped.
	old := w.Local().Meta
	old.State = StateReady
	enc := sealAs(t, w, old, 1)
	d := &delegate{drv}
	d.NotifyMsg(signedFrame(w, drv.Name(), frameMeta, enc))
	addr := w.Local().Addr
	d.NotifyUpdate(&memberlist.Node{Name: w.Name(), Addr: net.IP(addr.Addr().AsSlice()), Port: addr.Port(), Meta: enc})
	if got := stateOf(w.Name()); got != StateLeaving {
		t.Fatalf("a late copy moved the worker's state back to %v", got)
	}
	// Told metadata that does not decode, or names another job, is dropped.
	before := drv.Stats().MessagesMalformed
	d.NotifyMsg(signedFrame(w, drv.Name(), frameMeta, []byte{1, 2, 3}))
	if drv.Stats().MessagesMalformed != before+1 {
		t.Fatal("malformed told metadata was not counted")
	}
	if got := stateOf(w.Name()); got != StateLeaving {
		t.Fatalf("malformed told metadata changed the state to %v", got)
	}
}
