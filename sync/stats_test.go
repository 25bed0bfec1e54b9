package sync

import (
	"context"
	"errors"
	"slices"
	stdsync "sync"
	"testing"
	"time"
)

// statsSink collects one worker's step statistics.
type statsSink struct {
	mu      stdsync.Mutex
	batches []StatsBatch
}

func (s *statsSink) add(b StatsBatch) {
	s.mu.Lock()
	s.batches = append(s.batches, b)
	s.mu.Unlock()
}

// Sessions time every committed step: each is reported once, in the epoch it
// ran in, with the samples the trainer recorded; a worker that computes longer
// shows it in Compute, while both see the same step time; a world change
// sends the batch at once.
func TestSessionStepStatistics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := NewCoordinator(CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	const steps, growAt = 40, 20
	const slowCompute = 8 * time.Millisecond
	names := []string{"fast", "slow", "late"}
	sinks := map[string]*statsSink{}
	workers := map[string]*toyWorker{}
	for _, n := range names[:2] {
		workers[n] = startToy(t, n, coord, 256)
		sinks[n] = &statsSink{}
	}
	errs := make(chan error, 3)
	var run func(name string) error
	run = func(name string) error {
		w := workers[name]
		sc := DefaultConfig()
		sc.JobID, sc.Self = "sync-test", Member{Name: name, Addr: w.tr.Addr()}
		sc.OnStats, sc.StatsEvery = sinks[name].add, 5
		sess, err := Join(ctx, sc, w.tr, coord.View(name), w.state)
		if err != nil {
			return err
		}
		defer sess.Close()
		sess.SetTotalSteps(steps)
		grads := [][]float32{make([]float32, 256)}
		for sess.Step() < steps {
			if name == "slow" {
				time.Sleep(slowCompute) // simulated compute: the others wait for it
			}
			sess.RecordSamples(4)
			sess.RecordSamples(4)
			if err := sess.Allreduce(ctx, grads); err != nil {
				return err
			}
			if name == "fast" && sess.Step() == growAt-1 {
				workers["late"] = startToy(t, "late", coord, 256)
				sinks["late"] = &statsSink{}
				go func() { errs <- run("late") }()
			}
			if err := sess.Commit(ctx); err != nil {
				return err
			}
		}
		if b, ok := sess.clock.take(); ok {
			sinks[name].add(b)
		}
		return nil
	}
	go func() { errs <- run("fast") }()
	go func() { errs <- run("slow") }()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The joiner is admitted at whichever step boundary first learns of its
	// epoch: find that step from the fast worker's reports, then hold every
	// worker to it.
	lastOfFirst := int64(0)
	for _, b := range sinks["fast"].batches {
		for _, st := range b.Steps {
			if st.Epoch == 1 {
				lastOfFirst = max(lastOfFirst, st.Step)
			}
		}
	}
	if lastOfFirst < growAt-1 || lastOfFirst >= steps {
		t.Fatalf("the world changed after step %d; the joiner arrived at step %d", lastOfFirst, growAt-1)
	}
	medianCompute := map[string]time.Duration{}
	for _, name := range names {
		var got []StepStat
		for _, b := range sinks[name].batches {
			if b.TotalSteps != steps {
				t.Errorf("%s: batch with total %d, want %d", name, b.TotalSteps, steps)
			}
			got = append(got, b.Steps...)
			// A batch holding the last step of epoch 1 ends there.
			for i, st := range b.Steps {
				if st.Step == lastOfFirst && i != len(b.Steps)-1 {
					t.Errorf("%s: the batch with the last step of epoch 1 goes on to step %d", name, b.Steps[len(b.Steps)-1].Step)
				}
			}
		}
		first := int64(1)
		if name == "late" {
			first = lastOfFirst + 1
		}
		if len(got) != int(steps-first+1) {
			t.Fatalf("%s: %d steps reported, want %d..%d", name, len(got), first, steps)
		}
		var computes []time.Duration
		for i, st := range got {
			wantEpoch := uint64(1)
			if st.Step > lastOfFirst {
				wantEpoch = 2
			}
			if st.Step != first+int64(i) || st.Epoch != wantEpoch || st.Samples != 8 || st.Compute < 0 || st.Compute > st.StepTime {
				t.Fatalf("%s: report %d is %+v (want step %d, epoch %d, 8 samples)", name, i, st, first+int64(i), wantEpoch)
			}
			computes = append(computes, st.Compute)
		}
		slices.Sort(computes)
		medianCompute[name] = computes[len(computes)/2]
	}
	if medianCompute["slow"] < slowCompute || medianCompute["fast"] > slowCompute/2 {
		t.Errorf("median compute: slow %v, fast %v; want the slow worker's sleep in its compute only", medianCompute["slow"], medianCompute["fast"])
	}
}

func TestStatsWireRoundTrip(t *testing.T) {
	in := StatsBatch{TotalSteps: 1000, Steps: []StepStat{
		{Epoch: 3, Step: 17, Samples: 32, Compute: 12345 * time.Microsecond, StepTime: 20001 * time.Microsecond},
		{Epoch: 3, Step: 18, Compute: 0, StepTime: time.Millisecond},
	}}
	m, err := decodeControl(encodeStats(in))
	if err != nil {
		t.Fatal(err)
	}
	if out := m.statsBatch(); !slices.Equal(out.Steps, in.Steps) || out.TotalSteps != in.TotalSteps {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
	// The largest batch a session sends fits one membership message.
	big := StatsBatch{TotalSteps: 1 << 40}
	for i := range statsMax {
		big.Steps = append(big.Steps, StepStat{Epoch: 1 << 30, Step: 1<<40 + int64(i), Samples: 1 << 20, Compute: time.Hour, StepTime: time.Hour})
	}
	if n := len(encodeStats(big)); n > 64<<10 {
		t.Fatalf("a full batch encodes to %d bytes, over the 64 KiB message limit", n)
	}
}

func TestDecodeControlRejects(t *testing.T) {
	for _, tc := range []struct{ name, msg string }{
		{"not json", `{"t":"stats"`},
		{"unknown type", `{"t":"bogus"}`},
		{"stats without steps", `{"t":"stats"}`},
		{"stats step 0", `{"t":"stats","s":[{"e":1,"n":0,"c":1,"d":2}]}`},
		{"stats epoch 0", `{"t":"stats","s":[{"e":0,"n":1,"c":1,"d":2}]}`},
		{"compute over step time", `{"t":"stats","s":[{"e":1,"n":1,"c":3,"d":2}]}`},
		{"negative samples", `{"t":"stats","s":[{"e":1,"n":1,"b":-1,"c":1,"d":2}]}`},
		{"negative total", `{"t":"stats","T":-5,"s":[{"e":1,"n":1,"c":1,"d":2}]}`},
		{"epoch without members", `{"t":"epoch","n":3}`},
		{"repeated member", `{"t":"epoch","n":3,"m":[{"Name":"a","Addr":"x"},{"Name":"a","Addr":"y"}]}`},
		{"failure without epoch", `{"t":"failure","b":"a"}`},
		{"ping without nonce", `{"t":"ping"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeControl([]byte(tc.msg)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// FuzzDecodeControl: whatever arrives on the gossip channel, decoding returns
// a checked message or an error, and an accepted message re-encodes.
func FuzzDecodeControl(f *testing.F) {
	f.Add(encodeStats(StatsBatch{TotalSteps: 9, Steps: []StepStat{{Epoch: 1, Step: 1, Samples: 2, Compute: 1, StepTime: 2}}}))
	f.Add(encodeEpoch(Epoch{Number: 2, Members: []Member{{Name: "a", Addr: "127.0.0.1:1"}}}))
	f.Add(encodeFailure(3, "a", errors.New("boom")))
	f.Add(encodePing(msgPing, 7))
	f.Add(encodeDone(4))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeControl(b)
		if err != nil {
			return
		}
		if m.Type == msgStats {
			for _, s := range m.statsBatch().Steps {
				if s.Compute > s.StepTime || s.Step < 1 || s.Epoch == 0 {
					t.Fatalf("accepted an impossible step %+v", s)
				}
			}
		}
	})
}
