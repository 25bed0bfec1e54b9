package sync

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// toyWorker trains a small linear model whose gradient depends on the rank and
// step, so that any disagreement between workers shows in the parameters.
type toyWorker struct {
	name   string
	params []float32
	state  *State
	sess   *Session
	tr     *tcp.Transport
}

type stepRecord struct {
	worker string
	epoch  uint64
	size   int
	step   int64
	hash   [32]byte
}

type recorder struct {
	mu   stdsync.Mutex
	recs []stepRecord
}

func (r *recorder) add(rec stepRecord) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func hashParams(p []float32) [32]byte {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return sha256.Sum256(b)
}

// listenTCP starts a worker's collective transport, closed when the test ends.
func listenTCP(t testing.TB) *tcp.Transport {
	t.Helper()
	cfg := tcp.DefaultConfig()
	cfg.Secret = []byte("sync-test-secret")
	cfg.IOTimeout = 2 * time.Second
	tr, err := tcp.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// joinCoord joins the worker name, listening on tr, to the job coord
// proposes the worlds of.
func joinCoord(ctx context.Context, coord *driver.Coordinator, name string, tr *tcp.Transport, state *State, edits ...func(*Config)) (*Session, error) {
	sc := DefaultConfig()
	sc.JobID, sc.Self = "sync-test", epoch.Member{Name: name, Addr: tr.Addr()}
	for _, edit := range edits {
		edit(&sc)
	}
	return openSession(ctx, sc, tr, coord.View(name), state)
}

func startToy(t testing.TB, name string, coord *driver.Coordinator, size ...int) *toyWorker {
	t.Helper()
	tr := listenTCP(t)
	n := 3000
	if len(size) > 0 {
		n = size[0]
	}
	w := &toyWorker{name: name, params: make([]float32, n), state: NewState(), tr: tr}
	w.state.RegisterTensor("params", w.params)
	coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
	return w
}

// train joins through coord and runs the toy loop.
func (w *toyWorker) train(ctx context.Context, coord *driver.Coordinator, until int64, rec *recorder, vanish func(step int64) bool) error {
	sess, err := joinCoord(ctx, coord, w.name, w.tr, w.state, func(c *Config) { c.FusionBytes = 4096 })
	if err != nil {
		return err
	}
	defer sess.Close()
	return toyLoop(ctx, sess, w.name, w.params, until, rec, vanish, func() {
		w.tr.Close() // first: the coordinator's probe of this worker then fails
		sess.Communicator().Abort(errors.New("killed"))
	})
}

// toyLoop trains until the session's step counter reaches until. vanish, if
// set, is consulted before each step: returning true makes the worker vanish
// there through kill (its links close abruptly, as if the process died).
func toyLoop(ctx context.Context, sess *Session, name string, params []float32, until int64, rec *recorder, vanish func(step int64) bool, kill func()) error {
	grads := [][]float32{make([]float32, 1000), make([]float32, 2000)}
	bufs := []collective.Buffer{collective.SliceBuffer(grads[0]), collective.SliceBuffer(grads[1])}
	lastStep := sess.Step()
	for sess.Step() < until {
		if vanish != nil && vanish(sess.Step()) {
			kill()
			return nil
		}
		step := sess.Step()
		if step < lastStep-1 {
			return fmt.Errorf("step went back from %d to %d", lastStep, step)
		}
		lastStep = step
		for i := range grads[0] {
			grads[0][i] = float32((i+sess.Rank()+int(step))%7) - 3
		}
		for i := range grads[1] {
			grads[1][i] = float32(sess.Rank()) * 0.5
		}
		err := sess.Allreduce(ctx, Reduction{}, bufs...)
		if errors.Is(err, ErrWorldChanged) {
			continue
		}
		if err != nil {
			return err
		}
		for i := range params {
			g := grads[0][i%1000]
			if i >= 1000 {
				g = grads[1][i-1000]
			}
			params[i] -= 0.01 * g
		}
		if err := sess.Commit(ctx); err != nil {
			switch {
			case errors.Is(err, ErrExcluded):
				return nil
			case errors.Is(err, ErrWorldChanged):
				continue
			}
			return err
		}
		rec.add(stepRecord{name, sess.World().Number, sess.Size(), sess.Step(), hashParams(params)})
	}
	return nil
}

// waitEpoch blocks until the coordinator has proposed an epoch for which ok
// holds, so a test can make a change take effect at a known step.
func waitEpoch(t *testing.T, coord *driver.Coordinator, ok func(epoch.World) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var after uint64
	for {
		ep, err := coord.View("test").Await(ctx, after)
		if err != nil {
			t.Errorf("waiting for an epoch: %v", err)
			return
		}
		if ok(ep) {
			return
		}
		after = ep.Number
	}
}

// agree checks that the workers that recorded a step in one world hold the
// same parameters there, and returns, per step, how many recorded it in the
// newest world that did. (A step committed by a member that then left or was
// left out can be redone by the others in a later world: its last collective
// completed on some members and failed on others, and the world kept the
// state of the others, a step behind. The newest world's record is the one
// the job kept.)
func agree(t *testing.T, rec *recorder) map[int64]int {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	type key struct {
		step  int64
		epoch uint64
	}
	first := map[key]stepRecord{}
	workers := map[key]int{}
	newest := map[int64]uint64{}
	for _, r := range rec.recs {
		k := key{r.step, r.epoch}
		newest[r.step] = max(newest[r.step], r.epoch)
		workers[k]++
		f, ok := first[k]
		if !ok {
			first[k] = r
			continue
		}
		if f.hash != r.hash {
			t.Fatalf("step %d, epoch %d: %s and %s hold different parameters", r.step, r.epoch, f.worker, r.worker)
		}
	}
	out := map[int64]int{}
	for step, e := range newest {
		out[step] = workers[key{step, e}]
	}
	return out
}

func runToys(t *testing.T, workers []*toyWorker, coord *driver.Coordinator, until int64, rec *recorder, vanish map[string]func(int64) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, len(workers))
	var wg stdsync.WaitGroup
	for i, w := range workers {
		wg.Go(func() { errs[i] = w.train(ctx, coord, until, rec, vanish[w.name]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", workers[i].name, err)
		}
	}
}

func TestWorkersAgreeEveryStep(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx)
	var ws []*toyWorker
	for i := range 3 {
		ws = append(ws, startToy(t, fmt.Sprintf("w%d", i), coord))
	}
	rec := &recorder{}
	runToys(t, ws, coord, 20, rec, nil)
	if n := agree(t, rec); n[20] != 3 {
		t.Fatalf("step 20 recorded by %d workers", n[20])
	}
}

func TestJoinMidRunGetsState(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx)
	ws := []*toyWorker{startToy(t, "w0", coord), startToy(t, "w1", coord)}
	rec := &recorder{}
	var late *toyWorker
	var once stdsync.Once
	joined := make(chan struct{})
	// The joiner is admitted once the others have made progress.
	vanish := map[string]func(int64) bool{"w0": func(step int64) bool {
		if step == 5 {
			once.Do(func() {
				late = startToy(t, "w2", coord)
				close(joined)
				waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("w2") >= 0 })
			})
		}
		return false
	}}
	var lateErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-joined
		lctx, lcancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer lcancel()
		lateErr = late.train(lctx, coord, 30, rec, nil)
	}()
	runToys(t, ws, coord, 30, rec, vanish)
	<-done
	if lateErr != nil {
		t.Fatalf("joiner: %v", lateErr)
	}
	n := agree(t, rec)
	if n[30] != 3 {
		t.Fatalf("step 30 recorded by %d workers, want 3 (joiner included)", n[30])
	}
}

func TestWorkerVanishingMidRun(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx)
	var ws []*toyWorker
	for i := range 4 {
		ws = append(ws, startToy(t, fmt.Sprintf("w%d", i), coord))
	}
	rec := &recorder{}
	runToys(t, ws, coord, 25, rec, map[string]func(int64) bool{
		"w2": func(step int64) bool { return step == 10 },
	})
	n := agree(t, rec)
	if n[25] != 3 {
		t.Fatalf("step 25 recorded by %d workers, want the 3 survivors", n[25])
	}
	if coord.Current().Rank("w2") >= 0 {
		t.Fatal("the vanished worker is still a member")
	}
}

func TestGracefulRemoval(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx)
	var ws []*toyWorker
	for i := range 3 {
		ws = append(ws, startToy(t, fmt.Sprintf("w%d", i), coord))
	}
	rec := &recorder{}
	var once stdsync.Once
	runToys(t, ws, coord, 20, rec, map[string]func(int64) bool{
		"w0": func(step int64) bool {
			if step == 8 {
				once.Do(func() {
					coord.Remove("w1")
					waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("w1") < 0 })
				})
			}
			return false
		},
	})
	n := agree(t, rec)
	if n[20] != 2 {
		t.Fatalf("step 20 recorded by %d workers, want 2", n[20])
	}
}

func TestAsyncAllreduceAndRecovery(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx)
	ws := []*toyWorker{startToy(t, "a0", coord), startToy(t, "a1", coord), startToy(t, "a2", coord)}
	errs := make([]error, len(ws))
	var wg stdsync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			errs[i] = func() error {
				sess, err := joinCoord(ctx, coord, w.name, w.tr, w.state)
				if err != nil {
					return err
				}
				defer sess.Close()
				changed := false
				for sess.Step() < 15 {
					if w.name == "a2" && sess.Step() == 6 {
						w.tr.Close() // first: the coordinator's probe of this worker then fails
						sess.Communicator().Abort(errors.New("killed"))
						return nil
					}
					// Layers of several dtypes, one of them on a device: the
					// averages (ranks 0..size-1, plus the layer's index) are
					// halves, exact in each.
					layers := []collective.Buffer{
						collective.SliceBuffer(make([]float32, 500)), collective.SliceBuffer(make([]collective.BF16, 7)),
						collective.SliceBuffer(make([]float64, 3000)), fakedevice.New(make([]byte, 2*40), nil).Buffer(collective.Float16),
					}
					var hs []*Handle
					// Backward order: the last layer's gradient is ready first.
					for l := len(layers) - 1; l >= 0; l-- {
						vals := make([]float64, layers[l].Count)
						for j := range vals {
							vals[j] = float64(sess.Rank() + l)
						}
						setBuffer(layers[l], vals)
						hs = append(hs, sess.AllreduceAsync(ctx, Reduction{}, layers[l]))
					}
					err := sess.WaitAll(ctx, hs...)
					if errors.Is(err, ErrWorldChanged) {
						changed = true
						continue
					}
					if err != nil {
						return err
					}
					for l, layer := range layers {
						want := float64(sess.Size()-1)/2 + float64(l)
						for j, got := range fakedevice.Decode(layer.DType, bufferBytes(layer)) {
							if got != want {
								return fmt.Errorf("%v layer %d[%d] averaged to %v, want %v", layer.DType, l, j, got, want)
							}
						}
					}
					if err := sess.Commit(ctx); err != nil && !errors.Is(err, ErrWorldChanged) {
						return err
					}
				}
				if !changed {
					return errors.New("the world never changed")
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", ws[i].name, err)
		}
	}
}

// TestAllreduceAsyncOverlaps: AllreduceAsync returns without waiting for the
// other workers, so a trainer can hand over each layer's gradients as its
// backward pass produces them and go on computing. Rank 0 starts every
// layer's allreduce before rank 1 starts any (rank 1 waits until rank 0's
// calls have all returned); were one of them to wait for its peers, rank 0
// would never get there and rank 1 would give up at its deadline. Then both
// collect the averages.
func TestAllreduceAsyncOverlaps(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go coord.Run(ctx)
	ws := []*toyWorker{startToy(t, "o0", coord), startToy(t, "o1", coord)}
	waitEpoch(t, coord, func(e epoch.World) bool { return len(e.Members) == 2 })
	sessions := make([]*Session, len(ws))
	errs := make([]error, len(ws))
	var wg stdsync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { sessions[i], errs[i] = joinCoord(ctx, coord, w.name, w.tr, w.state) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", ws[i].name, err)
		}
		defer sessions[i].Close()
	}
	const layers, n = 4, 1 << 16
	rank0Started := make(chan struct{})
	for _, sess := range sessions {
		wg.Go(func() {
			r := sess.Rank()
			errs[r] = func() error {
				if r != 0 {
					select {
					case <-rank0Started:
					case <-ctx.Done():
						return fmt.Errorf("rank 0 did not return from its %d AllreduceAsync calls while this rank had started none: they wait for the peers", layers)
					}
				}
				grads := make([][]float32, layers)
				var hs []*Handle
				for l := layers - 1; l >= 0; l-- { // the last layer's gradient first, as backward makes them
					grads[l] = make([]float32, n)
					for j := range grads[l] {
						grads[l][j] = float32(2*r + l)
					}
					hs = append(hs, sess.AllreduceAsync(ctx, Reduction{}, collective.SliceBuffer(grads[l])))
				}
				if r == 0 {
					close(rank0Started)
				}
				if err := sess.WaitAll(ctx, hs...); err != nil {
					if r == 0 {
						// The peer started its allreduces once these calls
						// had returned: unless they returned at once, they
						// timed out waiting for it.
						return fmt.Errorf("rank 0's allreduces, which it started before rank 1 started any: %w (does AllreduceAsync wait for the peers?)", err)
					}
					return err
				}
				for l, g := range grads {
					if want := float32(1 + l); g[0] != want || g[n-1] != want {
						return fmt.Errorf("rank %d layer %d averaged to %v..%v, want %v", r, l, g[0], g[n-1], want)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// An allreduce can complete on one rank and fail on another, so the next
// world's rank 0 may not have committed a step that another member has. That
// member's Commit must then report the step undone (ErrWorldChanged, the state
// rolled back to rank 0's), never success at a step it did not finish: a
// trainer would log or count the step twice. Here rank 0 misses the step by
// skipping its Commit, which leaves it in the state a failed allreduce would.
func TestCommitIntoWorldWhoseRootMissedTheStep(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go coord.Run(ctx)
	root, behind := startToy(t, "root", coord, 16), startToy(t, "ahead", coord, 16)
	waitEpoch(t, coord, func(e epoch.World) bool { return len(e.Members) == 2 })
	join := func(w *toyWorker) (*Session, error) {
		return joinCoord(ctx, coord, w.name, w.tr, w.state)
	}
	// both runs f on each session at once and returns their errors.
	both := func(a, b *Session, f func(*Session) error) (error, error) {
		var errA, errB error
		var wg stdsync.WaitGroup
		wg.Go(func() { errA = f(a) })
		wg.Go(func() { errB = f(b) })
		wg.Wait()
		return errA, errB
	}
	var sessRoot, sessAhead *Session
	var errRoot, errAhead error
	var wg stdsync.WaitGroup
	wg.Go(func() { sessRoot, errRoot = join(root) })
	wg.Go(func() { sessAhead, errAhead = join(behind) })
	wg.Wait()
	if errRoot != nil || errAhead != nil {
		t.Fatalf("join: %v, %v", errRoot, errAhead)
	}
	defer sessRoot.Close()
	defer sessAhead.Close()
	if sessRoot.Rank() != 0 {
		t.Fatalf("root has rank %d", sessRoot.Rank())
	}
	grads := func() collective.Buffer { return collective.SliceBuffer(make([]float32, 16)) }
	step := func(s *Session) error {
		if err := s.Allreduce(ctx, Reduction{}, grads()); err != nil {
			return err
		}
		return s.Commit(ctx)
	}
	// Step 1 everywhere; then step 2's allreduce completes, but only the
	// member ahead commits it.
	if errRoot, errAhead = both(sessRoot, sessAhead, step); errRoot != nil || errAhead != nil {
		t.Fatalf("step 1: %v, %v", errRoot, errAhead)
	}
	if errRoot, errAhead = both(sessRoot, sessAhead, func(s *Session) error { return s.Allreduce(ctx, Reduction{}, grads()) }); errRoot != nil || errAhead != nil {
		t.Fatalf("step 2's allreduce: %v, %v", errRoot, errAhead)
	}
	if err := sessAhead.Commit(ctx); err != nil {
		t.Fatalf("step 2's commit: %v", err)
	}
	// A third worker asks in; both move to its world at the next boundary:
	// rank 0 after its (second) step 2, the other after a step 3 that rank 0
	// never ran.
	late := startToy(t, "late", coord, 16)
	lateDone := make(chan error, 1)
	go func() {
		s, err := join(late)
		if err == nil {
			defer s.Close()
			if s.Step() != 2 {
				err = fmt.Errorf("the joiner starts at step %d, want rank 0's 2", s.Step())
			}
		}
		lateDone <- err
	}()
	waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("late") >= 0 })
	errRoot, errAhead = both(sessRoot, sessAhead, step)
	if errRoot != nil {
		t.Fatalf("rank 0's step 2: %v", errRoot)
	}
	if !errors.Is(errAhead, ErrWorldChanged) {
		t.Fatalf("the member ahead committed step 3 into a world at step 2: Commit returned %v, step %d", errAhead, sessAhead.Step())
	}
	if sessAhead.Step() != 2 || sessRoot.Step() != 2 || sessAhead.Size() != 3 {
		t.Fatalf("after the move: steps %d (rank 0) and %d, world of %d", sessRoot.Step(), sessAhead.Step(), sessAhead.Size())
	}
	if err := <-lateDone; err != nil {
		t.Fatal(err)
	}
}
