package epoch_test

import (
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// Scenarios over the simulated network, each scripted and deterministic
// (fixed seed, no random loss unless the scenario says so).

func quietSim(t *testing.T) *sim {
	cfg := defaultSimConfig(1)
	cfg.net.wire = true
	return newSim(t, cfg)
}

// startJob starts a driver and n workers and waits until they train in one
// world.
func startJob(t *testing.T, s *sim, n int) (*simNode, []*simNode) {
	t.Helper()
	d := s.addDriver("driver")
	var ws []*simNode
	for i := range n {
		ws = append(ws, s.addWorker("w"+string(rune('0'+i))))
		s.run(time.Millisecond)
	}
	s.run(2 * time.Second)
	cur := d.prop.Current()
	if len(cur.Members) != n {
		t.Fatalf("after start-up the world is %s, want %d workers", describe(cur), n)
	}
	for _, w := range ws {
		if w.using.Number != cur.Number {
			t.Fatalf("%s is in epoch %d, not %s", w.name, w.using.Number, describe(cur))
		}
	}
	return d, ws
}

func checkAll(s *sim) {
	s.checkNumbering()
	s.checkUsage()
	s.checkDelivered()
	s.checkSettled()
}

// The driver dies right after proposing an epoch that only one worker
// received, and a worker arrives. The oldest worker takes over after the
// grace, learns that epoch from the worker that has it, and numbers the
// world with the newcomer after it: no number means two worlds.
func TestTakeoverLearnsTheDeadDriversLastEpoch(t *testing.T) {
	s := quietSim(t)
	d, ws := startJob(t, s, 3)
	last := d.prop.Current().Number
	// w2 leaves; the driver's next epoch reaches w1 only, and the driver dies.
	s.cfg.net.drop = func(from, to string, m epoch.Message) bool {
		return from == "driver" && m.Kind == epoch.MsgEpoch && m.World.Number > last && to != "w1"
	}
	s.onProposed = func(n *simNode, w epoch.World) {
		if n == d {
			s.after(time.Millisecond, func() { s.crash(d) })
		}
	}
	s.leave(ws[2])
	s.run(time.Second)
	if got := ws[1].fol.Latest().Number; got != last+1 {
		t.Fatalf("w1 knows epoch %d, want the driver's last, %d", got, last+1)
	}
	if got := ws[0].fol.Latest().Number; got != last {
		t.Fatalf("w0 knows epoch %d, want %d (the driver's last never reached it)", got, last)
	}
	s.onProposed = nil
	s.cfg.net.drop = nil
	w3 := s.addWorker("w3")
	s.run(6 * time.Second)
	p := ws[0].fol.Proposer()
	if p == nil {
		t.Fatal("w0, the oldest worker, did not take over")
	}
	if cur := p.Current(); cur.Number != last+2 || cur.Rank("w3") < 0 || cur.Rank("w2") >= 0 {
		t.Fatalf("w0 proposed %s, want epoch %d: the dead driver's last, %s, with w3", describe(cur), last+2, describe(s.proposed[last+1]))
	}
	if w3.using.Number != last+2 {
		t.Fatalf("w3 is in epoch %d", w3.using.Number)
	}
	checkAll(s)
}

// A worker blamed for a failure that answers its probe stays, and the world
// is formed again (the reporter waits for a newer epoch); a dead one is
// removed.
func TestBlamedButAliveStaysDeadGoes(t *testing.T) {
	s := quietSim(t)
	d, ws := startJob(t, s, 3)
	first := d.prop.Current()
	s.deliver(ws[0], "", epoch.ReportFailure{Number: first.Number, Blamed: "w1", Cause: "link reset"})
	s.run(time.Second)
	if cur := d.prop.Current(); cur.Number != first.Number+1 || !slicesEqualNames(cur, first) {
		t.Fatalf("after blaming a live worker the world is %s, want %s again under the next number", describe(cur), describe(first))
	}
	s.crash(ws[2])
	s.run(3 * time.Second)
	if cur := d.prop.Current(); cur.Rank("w2") >= 0 || cur.Rank("w1") < 0 || cur.Rank("w0") < 0 {
		t.Fatalf("after w2 died the world is %s", describe(cur))
	}
	checkAll(s)
}

func slicesEqualNames(a, b epoch.World) bool {
	if len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		if a.Members[i] != b.Members[i] {
			return false
		}
	}
	return true
}

// Workers arriving together cost one epoch.
func TestCoalescingOverTheNetwork(t *testing.T) {
	cfg := defaultSimConfig(1)
	cfg.gossip.delayMin, cfg.gossip.delayMax = time.Millisecond, 2*time.Millisecond
	s := newSim(t, cfg)
	s.addDriver("driver")
	for _, name := range []string{"w0", "w1", "w2", "w3"} {
		s.addWorker(name)
		s.run(time.Millisecond)
	}
	s.run(2 * time.Second)
	if len(s.proposed) != 1 || len(s.proposed[1].Members) != 4 {
		t.Fatalf("proposed %d epochs (%s), want one with the 4 workers", len(s.proposed), describe(s.proposed[1]))
	}
	checkAll(s)
}

// Below MinWorkers nothing is proposed; the job waits for a worker more.
func TestMinWorkersWaitOverTheNetwork(t *testing.T) {
	cfg := defaultSimConfig(1)
	cfg.minWorkers = 3
	s := newSim(t, cfg)
	s.addDriver("driver")
	s.addWorker("w0")
	s.addWorker("w1")
	s.run(5 * time.Second)
	if len(s.proposed) != 0 {
		t.Fatalf("proposed %s with 2 workers, minimum 3", describe(s.proposed[1]))
	}
	s.addWorker("w2")
	s.run(time.Second)
	if len(s.proposed) != 1 || len(s.proposed[1].Members) != 3 {
		t.Fatalf("proposed %v, want one epoch of 3", s.proposed)
	}
	checkAll(s)
}

// The last step completes on some members and fails on others: those finish
// and leave; the others get a world without them, below the minimum, redo the
// step there and finish. The driver then lists no one unfinished.
func TestLastStepRescue(t *testing.T) {
	cfg := defaultSimConfig(1)
	cfg.minWorkers = 3
	s := newSim(t, cfg)
	d, ws := startJob(t, s, 3)
	first := d.prop.Current()
	last := first.Members[2].Name // (rank 0 finishes in the model)
	s.finish(last)
	s.run(5 * time.Second)
	if cur := d.prop.Current(); len(cur.Members) != 1 || cur.Rank(last) != 0 {
		dumpTrace(t, s)
		t.Fatalf("the last world is %s, want %s alone", describe(cur), last)
	}
	for _, w := range ws {
		if !w.finished {
			t.Errorf("%s did not finish", w.name)
		}
	}
	if u := d.prop.Unfinished(); len(u) != 0 {
		t.Fatalf("unfinished: %v", u)
	}
	s.checkNumbering()
	s.checkUsage()
	s.checkFinished()
}

// Without a driver, the worker that proposes stays after it finished until
// the members still finishing the last step are done: its successor would
// not know that training is over, and would wait for the minimum.
func TestProposingWorkerLeavesLast(t *testing.T) {
	cfg := defaultSimConfig(1)
	cfg.minWorkers = 3
	s := newSim(t, cfg)
	d, ws := startJob(t, s, 3)
	s.crash(d)
	s.run(5 * time.Second)
	if ws[0].fol.Proposer() == nil {
		t.Fatal("w0 did not take over")
	}
	s.finish("w1", "w2")
	s.run(10 * time.Second)
	for _, w := range ws {
		if !w.finished || w.alive() {
			t.Errorf("%s: finished %v, still in the job %v", w.name, w.finished, w.alive())
		}
	}
	s.checkNumbering()
	s.checkUsage()
	s.checkFinished()
}

// A network that loses, duplicates and reorders a third of the messages,
// while workers join and die: the workers still converge on one world, and
// no number ever means two worlds.
func TestLossyNetworkConverges(t *testing.T) {
	cfg := defaultSimConfig(7)
	cfg.net.loss, cfg.net.dup, cfg.net.delayMax = 0.3, 0.3, 100*time.Millisecond
	s := newSim(t, cfg)
	s.addDriver("driver")
	var ws []*simNode
	for i := range 6 {
		ws = append(ws, s.addWorker("w"+string(rune('0'+i))))
		s.run(150 * time.Millisecond)
	}
	s.crash(ws[1])
	s.run(300 * time.Millisecond)
	s.crash(ws[4])
	s.addWorker("w6")
	s.run(20 * time.Second)
	checkAll(s)
}

// A worker frozen long enough for gossip to declare it dead is removed; when
// it thaws, it learns that it is out and leaves (or, if it never saw that
// epoch, is admitted again under its name); the others train on.
func TestFrozenWorkerComesBack(t *testing.T) {
	s := quietSim(t)
	d, ws := startJob(t, s, 3)
	s.freeze(ws[1], 4*time.Second)
	s.run(3 * time.Second)
	if cur := d.prop.Current(); cur.Rank("w1") >= 0 {
		t.Fatalf("w1 frozen, the world is still %s", describe(cur))
	}
	s.run(10 * time.Second)
	if !ws[1].excluded && d.prop.Current().Rank("w1") < 0 {
		t.Fatalf("w1 thawed, neither excluded nor back in %s", describe(d.prop.Current()))
	}
	checkAll(s)
}

func dumpTrace(t *testing.T, s *sim) {
	for _, l := range s.trace {
		t.Log(l)
	}
}

// The driver dies and the oldest worker proposes in its place; a new driver
// adopts the job (epoch.Adopt): it learns the workers' epoch, the worker
// steps down, and with the same members no epoch is proposed — the workers
// go on in their world. A worker that dies afterwards is left out by the
// new driver, and the numbering has no gap.
func TestAdoptingDriverTakesTheJobBack(t *testing.T) {
	s := quietSim(t)
	d, ws := startJob(t, s, 3)
	s.crash(d)
	s.run(6 * time.Second)
	if ws[0].fol.Proposer() == nil {
		t.Fatal("w0, the oldest worker, did not take over")
	}
	before := uint64(len(s.proposed))
	nd := s.addAdoptingDriver("driver2", 5*time.Second)
	s.run(3 * time.Second)
	if ws[0].fol.Proposer() != nil {
		t.Fatal("w0 still proposes with a driver in view")
	}
	if nd.prop.Adopting() {
		t.Fatal("the new driver is still learning the job 3 s after it started (every worker answers within ms)")
	}
	if got := uint64(len(s.proposed)); got != before {
		t.Fatalf("adopting a job with unchanged members proposed %d epochs, want none", got-before)
	}
	if cur := nd.prop.Current(); cur.Number != before || len(cur.Members) != 3 {
		t.Fatalf("the new driver continues from %s, want epoch %d with the 3 workers", describe(cur), before)
	}
	s.crash(ws[2])
	s.run(3 * time.Second)
	if cur := nd.prop.Current(); cur.Number != before+1 || cur.Rank("w2") >= 0 || len(cur.Members) != 2 {
		t.Fatalf("after w2 died the new driver proposed %s, want epoch %d without w2", describe(cur), before+1)
	}
	for _, w := range ws[:2] {
		if w.using.Number != before+1 {
			t.Fatalf("%s is in epoch %d, want %d", w.name, w.using.Number, before+1)
		}
	}
	checkAll(s)
}
