package epoch_test

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

var scaleSizes = flag.String("epoch.scale", "", "the job sizes TestScale runs, comma-separated (default 64,256; 64 with -race or -short; 1024 takes minutes per link)")

// TestScale runs the protocol's machines at large sizes in the simulator and
// measures each kind of world change: a graceful leave, a crash (kill -9),
// a join, and churn (a crash, a leave and a join at once, a second crash
// while the first new world is on its way). For each it records the
// messages the machines sent and the simulated time, split where the
// protocol's own work begins: from the trigger to the proposal (gossip's
// detection, the coalescing window) and from the proposal to the moment the
// last member of the new world took its first step in it. Steps take a
// fixed time, so the second part is the protocol's round trips plus at most
// one step. Every invariant of TestRandomized is checked at every size.
//
// -epoch.scale=64,256,1024 sets the sizes; -v prints the table
// (docs/multihost.md records it).
func TestScale(t *testing.T) {
	list := *scaleSizes
	switch {
	case list != "":
	case testing.Short() || raceEnabled:
		list = "64"
	default:
		list = "64,256"
	}
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil || n < 4 {
			t.Fatalf("-epoch.scale: %q is not a size of 4 or more", f)
		}
		sizes = append(sizes, n)
	}
	type link struct {
		name       string
		delay      time.Duration // one way, the most; the least is half
		loss       float64
		changes    []string
		reportOnly bool
	}
	links := []link{
		{name: "0.1 ms", delay: 100 * time.Microsecond},
		{name: "1 ms", delay: time.Millisecond},
		{name: "5 ms", delay: 5 * time.Millisecond},
		{name: "1 ms, 2% loss", delay: time.Millisecond, loss: 0.02},
	}
	const step = 10 * time.Millisecond
	var table []string
	for _, n := range sizes {
		for _, l := range links {
			t.Run(fmt.Sprintf("%d/%s", n, l.name), func(t *testing.T) {
				cfg := defaultSimConfig(uint64(n))
				cfg.net.delayMin, cfg.net.delayMax, cfg.net.loss = l.delay/2, l.delay, l.loss
				cfg.work.stepMin, cfg.work.stepMax = step, step
				cfg.minWorkers = n / 2
				s := newSim(t, cfg)
				job := startScaleJob(t, s, n)
				for _, kind := range []string{"leave", "crash", "join", "churn"} {
					r := job.change(kind)
					if t.Failed() {
						return
					}
					rtt := 2 * l.delay
					// What the protocol promises at any size: no healthy member is
					// lost to a change, and over a lossless network the last
					// member takes its first step in the new world within three
					// round trips and one step of the proposal (a joiner may
					// first have to learn of the driver through gossip).
					if r.healthyLost > 0 {
						t.Errorf("%s: %d healthy members were left out of the new world", kind, r.healthyLost)
					}
					if l.loss == 0 && kind != "join" && r.toFirstStep > step+3*rtt {
						t.Errorf("%s: the last member took its first step %v after the proposal, more than one step (%v) and 3 round trips (%v)",
							kind, r.toFirstStep, step, 3*rtt)
					}
					table = append(table, fmt.Sprintf("| %d | %s | %s | %d | %.1f | %d | %d | %v | %v | %.1f |",
						n, l.name, kind, r.messages, float64(r.messages)/float64(n), r.epochs, r.healthyLost,
						r.toProposal.Round(time.Microsecond), r.toFirstStep.Round(time.Microsecond), float64(r.toFirstStep-step)/float64(rtt)))
				}
				s.run(5 * time.Second) // rejoiners settle
				checkAll(s)
			})
		}
	}
	t.Logf("\n| members | link (one way, most) | change | messages | per member | epochs | healthy members lost | trigger → proposal | proposal → last member's first step | (that − one step) / round trip |\n|---|---|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(table, "\n"))
}

// scaleJob is a running simulated job and the clock marks of its changes.
type scaleJob struct {
	t      *testing.T
	s      *sim
	driver *simNode
	next   int
	// set by the hooks: when the newest proposal was made, and when each
	// member entered each epoch
	proposedAt map[uint64]time.Time
	enteredAt  map[uint64]map[string]time.Time
}

type changeCost struct {
	messages    int
	epochs      int           // proposed for the change (1 when no world had to be formed again)
	healthyLost int           // members alive throughout that the new world left out
	toProposal  time.Duration // trigger → the proposal of the settled world without (or with) the changed members
	toFirstStep time.Duration // that proposal → the last member's first step in it
}

func startScaleJob(t *testing.T, s *sim, n int) *scaleJob {
	t.Helper()
	j := &scaleJob{t: t, s: s, proposedAt: map[uint64]time.Time{}, enteredAt: map[uint64]map[string]time.Time{}}
	s.onProposed = j.recordProposal
	s.onEntered = func(m *simNode, w epoch.World) {
		if j.enteredAt[w.Number] == nil {
			j.enteredAt[w.Number] = map[string]time.Time{}
		}
		j.enteredAt[w.Number][m.name] = s.now
	}
	j.driver = s.addDriver("driver")
	for range n {
		j.add()
	}
	j.settle(fmt.Sprintf("a %d-worker world", n), func(w epoch.World) bool { return len(w.Members) == n })
	return j
}

func (j *scaleJob) recordProposal(_ *simNode, w epoch.World) {
	if _, ok := j.proposedAt[w.Number]; !ok {
		j.proposedAt[w.Number] = j.s.now
	}
}

func (j *scaleJob) add() *simNode {
	j.next++
	return j.s.addWorker(fmt.Sprintf("w%d", j.next))
}

// settle runs the job until the driver's current world passes ok and every
// member trains in it, or fails the test after a minute of simulated time.
func (j *scaleJob) settle(what string, ok func(epoch.World) bool) epoch.World {
	j.t.Helper()
	for deadline := j.s.now.Add(time.Minute); j.s.now.Before(deadline) && !j.s.failed; {
		j.s.run(5 * time.Millisecond)
		cur := j.driver.prop.Current()
		if cur.Number == 0 || !ok(cur) {
			continue
		}
		entered := j.enteredAt[cur.Number]
		all := true
		for _, m := range cur.Members {
			if _, in := entered[m.Name]; !in {
				all = false
				break
			}
		}
		if all {
			return cur
		}
	}
	j.t.Fatalf("no %s after a minute of simulated time; the driver is at %s", what, describe(j.driver.prop.Current()))
	return epoch.World{}
}

// change makes one world change of the kind and measures it.
func (j *scaleJob) change(kind string) changeCost {
	j.t.Helper()
	s := j.s
	// A quiet second first: the previous change's reannouncements and
	// probes are over, so the count is this change's.
	s.run(2 * time.Second)
	before := j.driver.prop.Current()
	living := func() []*simNode {
		var out []*simNode
		for _, m := range before.Members {
			if n := s.byN[m.Name]; n.alive() && !n.excluded {
				out = append(out, n)
			}
		}
		return out
	}
	members := living()
	victim := members[len(members)/2]
	changed := map[string]bool{victim.name: true}
	msgs := s.messages
	start := s.now
	var want func(epoch.World) bool
	switch kind {
	case "leave":
		s.leave(victim)
		want = func(w epoch.World) bool { return w.Rank(victim.name) < 0 }
	case "crash":
		s.crash(victim)
		want = func(w epoch.World) bool { return w.Rank(victim.name) < 0 }
	case "join":
		joiner := j.add()
		start = start.Add(s.cfg.work.startup) // from the moment it is ready
		want = func(w epoch.World) bool { return w.Rank(joiner.name) >= 0 }
	case "churn":
		second := members[len(members)/3]
		leaver := members[len(members)/4]
		changed[second.name], changed[leaver.name] = true, true
		s.crash(victim)
		s.leave(leaver)
		joiner := j.add()
		// The second crash lands while the first new world is on its way.
		s.onProposed = func(n *simNode, w epoch.World) {
			j.recordProposal(n, w)
			if w.Number > before.Number && second.alive() {
				s.crash(second)
			}
		}
		defer func() { s.onProposed = j.recordProposal }()
		want = func(w epoch.World) bool {
			return w.Rank(victim.name) < 0 && w.Rank(second.name) < 0 && w.Rank(leaver.name) < 0 && w.Rank(joiner.name) >= 0
		}
	default:
		j.t.Fatalf("no change %q", kind)
	}
	w := j.settle(kind, want)
	last := j.proposedAt[w.Number]
	for _, at := range j.enteredAt[w.Number] {
		if at.After(last) {
			last = at
		}
	}
	// Members of the old world that were alive throughout and are missing
	// from the new one: removed although healthy (they come back as new
	// members, but lose their place and the step).
	lost := 0
	for _, m := range before.Members {
		if n := s.byN[m.Name]; n.excluded && !changed[m.Name] {
			lost++
		}
	}
	return changeCost{
		messages:    s.messages - msgs,
		epochs:      int(w.Number - before.Number),
		healthyLost: lost,
		toProposal:  j.proposedAt[w.Number].Sub(start),
		toFirstStep: last.Sub(j.proposedAt[w.Number]),
	}
}
