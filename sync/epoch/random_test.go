package epoch_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var (
	randomSeeds = flag.Int("epoch.seeds", 100, "how many seeds TestRandomized runs")
	randomFirst = flag.Uint64("epoch.first", 1, "the first seed TestRandomized runs")
	randomSeed  = flag.Uint64("epoch.seed", 0, "run TestRandomized for this seed only, printing its trace")
	// The sessions as they were before issue 12, to show what they broke:
	rankZeroRoot = flag.Bool("epoch.rank0root", false, "model sessions that always take a new world's state from its rank 0")
	noRejoin     = flag.Bool("epoch.norejoin", false, "model workers that leave for good when a world leaves them out")
)

// TestRandomized runs the protocol through random jobs, each from a seed:
// workers join, crash (kill -9), leave gracefully, freeze and thaw
// (SIGSTOP/SIGCONT, long enough for gossip to declare them dead or not), are
// falsely declared dead by gossip at some members (a heavy load) and refute
// it, rejoin as new members when a world left them out, are evicted by the
// driver, blame live neighbours for failed collectives; the
// driver may crash, and a worker then takes over proposing; the network
// loses, duplicates, delays and reorders messages. Then the job runs quietly
// for a while, and training ends with some members' last step failing.
//
// Invariants, checked as they happen and at the end:
//   - no two live workers ever hold different worlds under one number (also
//     across a takeover), and proposals are numbered without gaps (a number
//     is proposed again, for another world, only when its first world died
//     with its proposer and every worker that received it);
//   - every member of an epoch that stays alive receives it or a later one;
//   - a worker adopts only higher numbers, enters only worlds it adopted that
//     include it, in increasing order — never two epochs at once;
//   - no world below the minimum size until training is over, none with a
//     member the proposer evicted, and an evicted worker is told it is out
//     for good (it must not come back as a new member);
//   - no world takes its state from a member that never held the job's
//     state while another member holds it (training never goes back to the
//     start);
//   - after the quiet time one proposer is left, every live worker knows its
//     epoch, every member trains in it and every ready worker is a member;
//   - after the end, every worker that trained finished (the rescue gave the
//     ones whose last step failed a world of their own), and the proposer
//     lists none unfinished.
//
// A failure prints the seed and the trace; -epoch.seed=N replays one seed
// with its trace (-v), -epoch.seeds=N runs more.
func TestRandomized(t *testing.T) {
	if *randomSeed != 0 {
		s := randomJob(t, *randomSeed)
		if testing.Verbose() {
			for _, line := range s.trace {
				t.Log(line)
			}
		}
		return
	}
	seeds := *randomSeeds
	if testing.Short() {
		seeds = min(seeds, 30)
	}
	var msgs, epochs int
	for i := range seeds {
		seed := *randomFirst + uint64(i)
		s := randomJob(t, seed)
		msgs += s.messages
		epochs += len(s.proposed)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d jobs: %d epochs, %d messages", seeds, epochs, msgs)
}

// randomJob runs the job of one seed and checks it.
func randomJob(t *testing.T, seed uint64) *sim {
	cfg := defaultSimConfig(seed)
	pick := rand.New(rand.NewPCG(seed, 1))
	cfg.net.loss = []float64{0, 0, 0.05, 0.2, 0.3}[pick.IntN(5)]
	cfg.net.dup = []float64{0, 0.1}[pick.IntN(2)]
	cfg.net.delayMax = []time.Duration{2 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond}[pick.IntN(3)]
	cfg.minWorkers = 1 + pick.IntN(3)
	cfg.work.falseBlame = []float64{0, 0.3}[pick.IntN(2)]
	cfg.net.wire = pick.IntN(8) == 0
	s := newSim(t, cfg)
	s.randomized = true
	s.rankZeroRoot, s.noRejoin = *rankZeroRoot, *noRejoin
	s.logf("seed %d: loss %.2f, dup %.2f, delay ≤ %v, min %d, false blame %.1f, wire %v",
		seed, cfg.net.loss, cfg.net.dup, cfg.net.delayMax, cfg.minWorkers, cfg.work.falseBlame, cfg.net.wire)

	driver := s.addDriver("driver")
	next := 0
	join := func() {
		s.addWorker(fmt.Sprintf("w%d", next))
		next++
	}
	for range 2 + pick.IntN(4) {
		join()
		s.run(time.Duration(pick.IntN(100)) * time.Millisecond)
	}
	// Faults, one every 0.1–1.5 s for 4–12 s; the driver may crash once,
	// and no worker freezes from then on (see checkNoForks in the brief of
	// Resume: a proposer that stops for good hands over cleanly).
	phase := time.Duration(4+pick.IntN(9)) * time.Second
	end := s.now.Add(phase)
	driverCrash := pick.IntN(5) < 2
	frozenUntil := s.now
	for s.now.Before(end) && !s.failed {
		s.run(time.Duration(100+pick.IntN(1400)) * time.Millisecond)
		var alive []*simNode
		for _, n := range s.nodes {
			if n.fol != nil && n.alive() && !n.frozen && !n.excluded && !n.evicted {
				alive = append(alive, n)
			}
		}
		spare := len(alive) > cfg.minWorkers+1
		victim := func() *simNode { return alive[pick.IntN(len(alive))] }
		if !driver.alive() {
			// Without a driver, the numbering lives on in the workers that
			// know the newest epoch: a worker taking over continues from
			// it. If all of them died, the numbering would start again
			// (harmless, as no live worker would hold an old epoch, but a
			// fork of the record): keep one.
			victim = func() *simNode {
				n := alive[pick.IntN(len(alive))]
				for _, o := range alive {
					if o != n && o.fol.Latest().Number == uint64(len(s.proposed)) {
						return n
					}
				}
				return nil
			}
		}
		if pick.IntN(3) == 0 && len(alive) > 0 && driver.alive() {
			// A loaded machine: gossip declares a live worker dead.
			s.falseDeath(alive[pick.IntN(len(alive))])
		}
		switch k := pick.IntN(10); {
		case k < 3 || len(alive) < 2:
			join()
		case k < 5 && spare:
			if v := victim(); v != nil {
				s.crash(v)
			}
			if pick.IntN(2) == 0 {
				join()
			}
		case k < 6 && spare:
			if v := victim(); v != nil {
				s.leave(v)
			}
		case k < 8 && driver.alive():
			s.freeze(victim(), time.Duration(200+pick.IntN(3000))*time.Millisecond)
			frozenUntil = s.now.Add(3200 * time.Millisecond)
		case k < 9 && spare && driver.alive():
			s.evict(driver, victim())
		case driverCrash && driver.alive():
			s.run(frozenUntil.Sub(s.now)) // every freeze has ended
			s.crash(driver)
		}
	}
	if driverCrash && driver.alive() && !s.failed {
		s.run(frozenUntil.Sub(s.now))
		s.crash(driver)
	}
	// A quiet time: no more faults (the network still misbehaves), with
	// enough workers for a world.
	s.run(frozenUntil.Sub(s.now))
	for range 3 {
		s.run(3 * time.Second)
		for range cfg.minWorkers - len(s.eligible()) {
			join()
		}
	}
	s.run(15 * time.Second)
	s.checkNumbering()
	s.checkUsage()
	s.checkDelivered()
	s.checkSettled()
	if s.failed {
		return s
	}
	// The end of training: some members' last step fails.
	var failing []string
	if props := s.proposers(); len(props) == 1 {
		for _, m := range s.proposerOf(props[0]).Current().Members {
			if pick.IntN(3) == 0 {
				failing = append(failing, m.Name)
			}
		}
	}
	slices.Sort(failing)
	s.finish(failing...)
	s.run(20 * time.Second)
	s.checkNumbering()
	s.checkUsage()
	s.checkFinished()
	return s
}
