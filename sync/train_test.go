package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/testing/testio"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/sampler"
)

// loopWorker trains a toy model through the loop. Its gradients are sums of
// small integers and its learning rate a power of two, so the parameters are
// exact whatever the world's size: workers that agree on the samples of
// every step hold bit-identical parameters, in any world.
type loopWorker struct {
	name   string
	params []float32
	grads  []float32
	data   *sampler.Sampler
	state  *State
	cfg    TrainConfig
	tr     *tcp.Transport // set by admit
}

// loopRecord is one committed step as a worker saw it.
type loopRecord struct {
	worker     string
	step       int64
	world      uint64
	rank, size int
	attempt    int
	plan       BatchPlan
	batch      sampler.Batch
	hash       [32]byte
}

type loopLog struct {
	mu        stdsync.Mutex
	steps     []loopRecord
	epochEnds []EpochEnd
	enders    []string
}

const (
	loopSamples = 120
	loopSeed    = 7
)

func newLoopWorker(t testing.TB, name string, log *loopLog, edit func(*TrainConfig)) *loopWorker {
	t.Helper()
	data, err := sampler.New(sampler.Config{N: loopSamples, Seed: loopSeed, Shuffle: true})
	if err != nil {
		t.Fatal(err)
	}
	w := &loopWorker{name: name, params: make([]float32, 32), grads: make([]float32, 32), data: data, state: NewState()}
	w.state.RegisterTensor("params", w.params)
	w.cfg = TrainConfig{Data: data, Epochs: 3, GlobalBatch: 12, NoLeaveSignal: true}
	w.cfg.Committed = func(ctx context.Context, s *TrainStep) error {
		log.mu.Lock()
		defer log.mu.Unlock()
		log.steps = append(log.steps, loopRecord{worker: name, step: s.Number, world: s.World, rank: s.Rank, size: s.Size,
			attempt: s.Attempt, plan: s.Plan, batch: s.Batch, hash: hashParams(w.params)})
		return nil
	}
	w.cfg.EpochEnd = func(ctx context.Context, e EpochEnd) error {
		log.mu.Lock()
		defer log.mu.Unlock()
		log.epochEnds = append(log.epochEnds, e)
		log.enders = append(log.enders, name)
		return nil
	}
	if edit != nil {
		edit(&w.cfg)
	}
	return w
}

// step is the trainer's step: integer gradients of the step's samples,
// summed over the world.
func (w *loopWorker) step(ctx context.Context, s *TrainStep) error {
	for j := range w.grads {
		var g int
		for _, idx := range s.Batch.Indices {
			g += (idx+j)%7 - 3
		}
		w.grads[j] = float32(g)
	}
	if err := s.Session.Allreduce(ctx, Sum(), collective.SliceBuffer(w.grads)); err != nil {
		return err
	}
	for j, g := range w.grads {
		w.params[j] -= g / 128
	}
	return nil
}

// coordMember is a worker of an in-process job whose worlds a Coordinator
// proposes: what Train's loop runs in for these tests.
type coordMember struct {
	sess  *Session
	coord *driver.Coordinator
	name  string
}

func (c *coordMember) session() *Session { return c.sess }
func (c *coordMember) requestLeave(context.Context) error {
	c.coord.Remove(c.name)
	return nil
}
func (c *coordMember) rejoin(context.Context) error { return ErrOutForGood }
func (c *coordMember) outForGood() bool             { return true }
func (c *coordMember) finish(context.Context) error { return c.sess.Close() }
func (c *coordMember) close() error                 { return c.sess.Close() }

// admit starts w's transport and adds w to coord's job: the coordinator's
// next world has it. train does it unless it was done.
func (w *loopWorker) admit(t testing.TB, coord *driver.Coordinator) {
	w.tr = listenTCP(t)
	coord.Add(epoch.Member{Name: w.name, Addr: w.tr.Addr()})
}

// train joins w to coord's job and runs the loop; leave delivers its leave
// signal; step, if set, replaces w.step.
func (w *loopWorker) train(ctx context.Context, t testing.TB, coord *driver.Coordinator, leave <-chan os.Signal, step StepFunc) (TrainResult, error) {
	if w.tr == nil {
		w.admit(t, coord)
	}
	tr := w.tr
	if step == nil {
		step = w.step
	}
	cfg, err := w.cfg.prepare(w.state, step)
	if err != nil {
		return TrainResult{}, err
	}
	sess, err := joinCoord(ctx, coord, w.name, tr, w.state, func(sc *Config) { sc.GradientNoise = cfg.Worker.Session.GradientNoise })
	if err != nil {
		return TrainResult{}, err
	}
	return runLoop(ctx, cfg, &coordMember{sess: sess, coord: coord, name: w.name}, leave, func(ctx context.Context, s *TrainStep) error {
		if err := step(ctx, s); errors.Is(err, errKilled) {
			// The worker dies: its links close abruptly.
			tr.Close() // first: the coordinator's probe of this worker then fails
			s.Session.Communicator().Abort(err)
			return err
		} else {
			return err
		}
	})
}

var errKilled = errors.New("killed by the test")

// checkLoopLog checks what the workers committed: identical parameters at
// every step, the data epochs' samples tiled exactly once, each worker's
// share the sampler's split of its step, and steps numbered from 1 without
// gaps on each worker (going back by at most the step a world rolled back).
func checkLoopLog(t *testing.T, log *loopLog, epochs uint64) {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	byStep := map[int64]loopRecord{}
	last := map[string]int64{}
	for _, r := range log.steps {
		if f, ok := byStep[r.step]; ok {
			if f.hash != r.hash || f.batch.Start != r.batch.Start || f.batch.Global != r.batch.Global || f.batch.Epoch != r.batch.Epoch {
				t.Fatalf("step %d: %s (world %d) and %s (world %d) disagree: %+v / %+v", r.step, f.worker, f.world, r.worker, r.world, f.batch, r.batch)
			}
		} else {
			byStep[r.step] = r
		}
		if prev, ok := last[r.worker]; ok && (r.step > prev+1 || r.step < prev) {
			t.Fatalf("%s committed step %d after step %d", r.worker, r.step, prev)
		}
		last[r.worker] = r.step
		perm := sampler.Permutation(loopSamples, loopSeed, r.batch.Epoch)
		off, n := sampler.Split(r.batch.Global, r.rank, r.size)
		want := perm[r.batch.Start+off : r.batch.Start+off+n]
		if !slices.Equal(r.batch.Indices, want) {
			t.Fatalf("%s, step %d, rank %d of %d: samples %v, want %v", r.worker, r.step, r.rank, r.size, r.batch.Indices, want)
		}
	}
	next := map[uint64]int{}
	for s := int64(1); s <= int64(len(byStep)); s++ {
		r, ok := byStep[s]
		if !ok {
			t.Fatalf("no worker committed step %d of %d", s, len(byStep))
		}
		if r.batch.Start != next[r.batch.Epoch] {
			t.Fatalf("step %d starts data epoch %d at sample %d, want %d", s, r.batch.Epoch, r.batch.Start, next[r.batch.Epoch])
		}
		next[r.batch.Epoch] += r.batch.Global
	}
	for e := range epochs {
		if next[e] != loopSamples {
			t.Fatalf("data epoch %d trained on %d of %d samples", e, next[e], loopSamples)
		}
	}
}

// Three workers train three data epochs through the loop while one dies, one
// joins and one leaves on its signal: every worker holds the same parameters
// at every step, every sample of each data epoch is trained on once, rank 0
// (whoever it is then) evaluates each epoch once, and each worker's training
// ends as it should.
func TestTrainLoopThroughWorldChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The first world the coordinator proposes is kept for the check below
	// (OnEpoch runs on Run's goroutine, which is the only sender).
	first := make(chan epoch.World, 1)
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1, OnEpoch: func(e epoch.World) {
		select {
		case first <- e:
		default:
		}
	}})
	log := &loopLog{}
	type outcome struct {
		name string
		res  TrainResult
		err  error
	}
	results := make(chan outcome, 4)
	var wg stdsync.WaitGroup
	start := func(name string, leave <-chan os.Signal, step func(w *loopWorker) StepFunc) {
		w := newLoopWorker(t, name, log, nil)
		w.admit(t, coord) // before the goroutine: the coordinator has w when start returns
		wg.Go(func() {
			var f StepFunc
			if step != nil {
				f = step(w)
			}
			res, err := w.train(ctx, t, coord, leave, f)
			results <- outcome{name, res, err}
		})
	}
	leave := make(chan os.Signal, 1)
	var joined, left, gone stdsync.Once
	start("w0", nil, func(w *loopWorker) StepFunc {
		return func(ctx context.Context, s *TrainStep) error {
			switch {
			case s.Number == 8:
				joined.Do(func() {
					start("w3", nil, nil)
					waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("w3") >= 0 })
				})
			case s.Number == 18:
				left.Do(func() { leave <- syscall.SIGTERM })
			case s.Number == 19:
				// w1 saw its signal at the top of this step; the world
				// without it comes before this step ends.
				gone.Do(func() { waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("w1") < 0 }) })
			}
			return w.step(ctx, s)
		}
	})
	start("w1", leave, nil)
	start("w2", nil, func(w *loopWorker) StepFunc {
		return func(ctx context.Context, s *TrainStep) error {
			if s.Number >= 5 && s.Size >= 3 { // mid-run, once the others train with it
				return errKilled
			}
			return w.step(ctx, s)
		}
	})
	// w0, w1 and w2 must all be in the first world: w0's steps make the
	// join and the leave, and w2 dies only in a world of three. With
	// MinWorkers 1, a coordinator that ran while they were being added
	// could propose a world of the first one or two, which would train on
	// without w0 (through the leave's step, or to the end) before it came.
	// It proposes nothing before it runs: all three are added by now.
	go coord.Run(ctx)
	wg.Wait()
	select {
	case e := <-first:
		if e.Number != 1 || len(e.Members) != 3 {
			t.Fatalf("first world %d %v, want w0, w1 and w2", e.Number, e.Members)
		}
	case <-ctx.Done():
		t.Fatal("the coordinator proposed no world")
	}
	close(results)
	got := map[string]outcome{}
	for o := range results {
		got[o.name] = o
	}
	const steps = 3 * loopSamples / 12
	for name, want := range map[string]Outcome{"w0": Completed, "w1": Left, "w3": Completed} {
		o := got[name]
		if o.err != nil || o.res.Outcome != want {
			t.Fatalf("%s: %+v, %v; want outcome %v", name, o.res, o.err, want)
		}
		if want == Completed && o.res.Steps != steps {
			t.Fatalf("%s completed at step %d, want %d", name, o.res.Steps, steps)
		}
	}
	if !errors.Is(got["w2"].err, errKilled) {
		t.Fatalf("w2: %+v, %v; want the test's kill", got["w2"].res, got["w2"].err)
	}
	checkLoopLog(t, log, 3)
	redone := false
	for _, r := range log.steps {
		redone = redone || r.attempt > 0
	}
	if !redone {
		t.Error("no step was redone, though a worker died mid-step")
	}
	if len(log.epochEnds) != 3 {
		t.Fatalf("%d epoch ends (%v), want 3", len(log.epochEnds), log.enders)
	}
	for i, e := range log.epochEnds {
		if e.Epoch != uint64(i) || e.Rank != 0 || e.Step != int64(i+1)*steps/3 {
			t.Fatalf("epoch end %d: %+v by %s", i, e, log.enders[i])
		}
	}
}

// The batch policy is asked every step and its plan holds on every worker:
// a global batch that doubles after the first steps.
func TestTrainBatchPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	log := &loopLog{}
	growing := policyFunc(func(p Progress) BatchPlan {
		if p.Step < 4 {
			return BatchPlan{Global: 6}
		}
		return BatchPlan{Global: 12}
	})
	var wg stdsync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		w := newLoopWorker(t, fmt.Sprintf("p%d", i), log, func(c *TrainConfig) { c.GlobalBatch, c.BatchPolicy, c.Epochs = 0, growing, 2 })
		wg.Go(func() { _, errs[i] = w.train(ctx, t, coord, nil, nil) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	checkLoopLog(t, log, 2)
	for _, r := range log.steps {
		want := growing.PlanBatch(Progress{Step: r.step - 1})
		if r.plan != want || r.batch.Global > want.Global {
			t.Fatalf("step %d ran with plan %+v and %d samples, want plan %+v", r.step, r.plan, r.batch.Global, want)
		}
	}
}

type policyFunc func(Progress) BatchPlan

func (f policyFunc) PlanBatch(p Progress) BatchPlan { return f(p) }

// A worker the job scales down ends its training cleanly with Outcome
// Excluded, having committed the step at whose end it left.
func TestTrainExcluded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	log := &loopLog{}
	var wg stdsync.WaitGroup
	var res [2]TrainResult
	var errs [2]error
	var once stdsync.Once
	for i := range 2 {
		w := newLoopWorker(t, fmt.Sprintf("x%d", i), log, func(c *TrainConfig) { c.EpochEndOnAllRanks = true })
		wg.Go(func() {
			res[i], errs[i] = w.train(ctx, t, coord, nil, func(ctx context.Context, s *TrainStep) error {
				if i == 0 && s.Number == 6 {
					once.Do(func() {
						coord.Remove("x1")
						waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("x1") < 0 })
					})
				}
				return w.step(ctx, s)
			})
		})
	}
	waitEpoch(t, coord, func(e epoch.World) bool { return len(e.Members) == 2 })
	wg.Wait()
	if errs[0] != nil || res[0].Outcome != Completed || errs[1] != nil || res[1].Outcome != Excluded {
		t.Fatalf("results %+v, %v and %+v, %v; want x0 completed, x1 excluded", res[0], errs[0], res[1], errs[1])
	}
	last := int64(0)
	for _, r := range log.steps {
		if r.worker == "x1" {
			last = max(last, r.step)
		}
	}
	if last != res[1].Steps || last < 6 {
		t.Fatalf("x1 last committed step %d, ended at step %d", last, res[1].Steps)
	}
	checkLoopLog(t, log, 3)
	// Every worker evaluated the epochs it saw end.
	if n := strings.Count(strings.Join(log.enders, ","), "x0"); n != 3 {
		t.Fatalf("x0 saw %d epoch ends, want 3 (%v)", n, log.enders)
	}
}

// Alone, Train runs a real session in a world of one: steps numbered from 1,
// the leave signal ends training at a step boundary, and with the signal off
// it is left to others.
func TestTrainAlone(t *testing.T) {
	if UnderLauncher() {
		t.Skip("the test process was started by a launcher")
	}
	run := func(cfg TrainConfig, during func(step int64)) (TrainResult, []int64, error) {
		state := NewState()
		x := make([]float64, 3)
		state.RegisterBuffer("x", collective.SliceBuffer(x))
		var committed []int64
		cfg.Committed = func(ctx context.Context, s *TrainStep) error {
			if s.Rank != 0 || s.Size != 1 || s.World == 0 {
				return fmt.Errorf("step %d in rank %d of %d, world %d", s.Number, s.Rank, s.Size, s.World)
			}
			committed = append(committed, s.Number)
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := Train(ctx, cfg, state, func(ctx context.Context, s *TrainStep) error {
			if during != nil {
				during(s.Number)
			}
			for i := range x {
				x[i] = float64(s.Number)
			}
			return s.Session.Allreduce(ctx, Reduction{}, collective.SliceBuffer(x))
		})
		return res, committed, err
	}

	res, committed, err := run(TrainConfig{Steps: 20}, nil)
	if err != nil || res.Outcome != Completed || res.Steps != 20 || res.Size != 1 || len(committed) != 20 || committed[19] != 20 {
		t.Fatalf("%+v, %v, committed %v", res, err, committed)
	}

	// The leave signal mid-run: training ends at the next step boundary.
	// Step 5 waits until the signal has been delivered (to this test's
	// channel too): steps alone take microseconds, and on a loaded machine
	// the delivery could otherwise come hundreds of steps later.
	delivered := make(chan os.Signal, 1)
	signal.Notify(delivered, syscall.SIGUSR2)
	res, committed, err = run(TrainConfig{Steps: 1000, LeaveSignal: syscall.SIGUSR2}, func(step int64) {
		if step == 5 {
			syscall.Kill(os.Getpid(), syscall.SIGUSR2)
			select {
			case <-delivered:
			case <-time.After(10 * time.Second):
			}
		}
	})
	signal.Stop(delivered)
	if err != nil || res.Outcome != Left || res.Steps < 5 || res.Steps > 900 || int64(len(committed)) != res.Steps {
		t.Fatalf("after the leave signal: %+v, %v, %d steps committed", res, err, len(committed))
	}

	// With NoLeaveSignal the signal is someone else's: training goes on.
	mine := make(chan os.Signal, 1)
	signal.Notify(mine, syscall.SIGUSR2)
	defer signal.Stop(mine)
	res, _, err = run(TrainConfig{Steps: 30, NoLeaveSignal: true}, func(step int64) {
		if step == 5 {
			syscall.Kill(os.Getpid(), syscall.SIGUSR2)
			<-mine
		}
	})
	if err != nil || res.Outcome != Completed || res.Steps != 30 {
		t.Fatalf("with the leave signal off: %+v, %v", res, err)
	}

	// A cancelled context ends training with its error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st := NewState()
	if _, err := Train(ctx, TrainConfig{Steps: 3}, st, func(context.Context, *TrainStep) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// Under a job (an explicit WorkerConfig here, as the launcher's environment
// would give it), Train joins through gossip, trains and reports the end to
// the driver; a worker still waiting to be admitted leaves on its signal.
func TestTrainInAJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := driver.Start(ctx, driver.Config{JobID: "train-test", Secret: []byte("train-test-secret"), MinWorkers: 2, Membership: membership.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	workerCfg := WorkerConfig{JobID: "train-test", Secret: []byte("train-test-secret"), Seeds: []string{d.GossipAddr()}, Transport: multi.Config{IOTimeout: 2 * time.Second}}

	// Alone below MinWorkers, a worker waits to be admitted: its leave
	// signal ends the wait.
	leaveCtx, leaveCancel := context.WithTimeout(ctx, 20*time.Second)
	defer leaveCancel()
	waiting := make(chan struct{})
	go func() {
		// The worker is in the driver's view once it waits.
		for len(d.Workers()) == 0 {
			select {
			case <-leaveCtx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		close(waiting)
		syscall.Kill(os.Getpid(), syscall.SIGUSR2)
	}()
	res, err := Train(leaveCtx, TrainConfig{Steps: 5, LeaveSignal: syscall.SIGUSR2, Worker: workerCfg}, NewState(), func(context.Context, *TrainStep) error { return nil })
	select {
	case <-waiting:
	default:
		t.Fatalf("Train returned %+v, %v before the worker was waiting", res, err)
	}
	if err != nil || res.Outcome != Left || res.Steps != 0 {
		t.Fatalf("leave while waiting to be admitted: %+v, %v", res, err)
	}

	log := &loopLog{}
	var wg stdsync.WaitGroup
	var results [2]TrainResult
	var errs [2]error
	for i := range 2 {
		w := newLoopWorker(t, fmt.Sprintf("j%d", i), log, func(c *TrainConfig) { c.Worker = workerCfg })
		wg.Go(func() { results[i], errs[i] = Train(ctx, w.cfg, w.state, w.step) })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || results[i].Outcome != Completed || results[i].Size != 2 {
			t.Fatalf("worker %d: %+v, %v", i, results[i], errs[i])
		}
	}
	checkLoopLog(t, log, 3)
	select {
	case <-d.Finished():
	case <-time.After(10 * time.Second):
		t.Fatal("the driver was not told that training finished")
	}
}

// A worker the driver takes out of the job (a scale-down) ends its training
// as Excluded and says so at Info: no warning of a failure (being left out
// while unreachable), which a user would take for one, and no attempt to
// come back.
func TestTrainRemovedByTheDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := driver.Start(ctx, driver.Config{JobID: "remove-test", Secret: []byte("remove-test-secret"), MinWorkers: 2, Membership: membership.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	workerCfg := WorkerConfig{JobID: "remove-test", Secret: []byte("remove-test-secret"), Seeds: []string{d.GossipAddr()}, Transport: multi.Config{IOTimeout: 2 * time.Second}}
	log := &loopLog{}
	var wg stdsync.WaitGroup
	var results [2]TrainResult
	var errs [2]error
	var logs [2]testio.Buffer
	var removed stdsync.Once
	var victim string
	out := -1 // the worker of rank 1 at step 6, which is removed
	for i := range 2 {
		w := newLoopWorker(t, fmt.Sprintf("r%d", i), log, func(c *TrainConfig) {
			c.Worker = workerCfg
			c.Worker.Logger = slog.New(slog.NewTextHandler(&logs[i], nil))
		})
		wg.Go(func() {
			results[i], errs[i] = Train(ctx, w.cfg, w.state, func(ctx context.Context, s *TrainStep) error {
				if s.Number == 6 && s.Rank == 1 {
					out = i
				}
				if s.Number == 6 && s.Rank == 0 && s.Size == 2 {
					removed.Do(func() {
						victim = s.Session.World().Members[1].Name
						d.SetMinWorkers(1)
						d.Remove(victim)
						for d.Current().Rank(victim) >= 0 {
							select {
							case <-ctx.Done():
								return
							case <-time.After(5 * time.Millisecond):
							}
						}
					})
				}
				return w.step(ctx, s)
			})
		})
	}
	wg.Wait()
	if victim == "" {
		t.Fatalf("no world of 2 reached step 6: %+v, %v; %+v, %v", results[0], errs[0], results[1], errs[1])
	}
	if out < 0 {
		t.Fatalf("no worker was rank 1 at step 6")
	}
	stay := 1 - out
	if errs[stay] != nil || results[stay].Outcome != Completed || errs[out] != nil || results[out].Outcome != Excluded {
		t.Fatalf("worker %d (stays): %+v, %v; worker %d (removed): %+v, %v", stay, results[stay], errs[stay], out, results[out], errs[out])
	}
	text := logs[out].String()
	if strings.Contains(text, "left out of the world") || !strings.Contains(text, "left out for good") {
		t.Fatalf("the removed worker's log:\n%s", text)
	}
}

func TestTrainConfigErrors(t *testing.T) {
	data, err := sampler.New(sampler.Config{N: 10})
	if err != nil {
		t.Fatal(err)
	}
	step := func(context.Context, *TrainStep) error { return nil }
	tests := []struct {
		name string
		cfg  TrainConfig
		want string
	}{
		{"no end", TrainConfig{}, "needs Steps"},
		{"negative steps", TrainConfig{Steps: -1}, "Steps -1"},
		{"epochs without data", TrainConfig{Epochs: 2}, "Data, which is not set"},
		{"data without batch", TrainConfig{Data: data, Epochs: 1}, "needs GlobalBatch or BatchPolicy"},
		{"both batch sizes", TrainConfig{Steps: 1, GlobalBatch: 4, BatchPolicy: FixedBatch(4)}, "both GlobalBatch and BatchPolicy"},
		{"negative batch", TrainConfig{Steps: 1, GlobalBatch: -4}, "GlobalBatch -4"},
		{"signal on and off", TrainConfig{Steps: 1, LeaveSignal: syscall.SIGUSR1, NoLeaveSignal: true}, "both LeaveSignal and NoLeaveSignal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Train(context.Background(), tc.cfg, NewState(), step); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
	if _, err := Train(context.Background(), TrainConfig{Steps: 1}, nil, step); err == nil {
		t.Fatal("a nil state was accepted")
	}
	// A policy that gives the sampler no batch is reported with the plan.
	_, err = Train(context.Background(), TrainConfig{Data: data, Epochs: 1, BatchPolicy: FixedBatch(0)}, NewState(), step)
	if err == nil || !strings.Contains(err.Error(), "global batch 0") {
		t.Fatalf("a zero global batch: %v", err)
	}
}
