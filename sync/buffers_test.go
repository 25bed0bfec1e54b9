package sync

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

var allDTypes = []collective.DType{collective.Float32, collective.Float64, collective.Float16, collective.BFloat16, collective.Int32, collective.Int64, collective.Uint8}

// mixedWorker keeps a state of every dtype, on the host and on a (fake)
// device, and trains it with gradients of every dtype: small integers, which
// every dtype holds exactly, so the expected sums are known.
type mixedWorker struct {
	name  string
	state *State
	// params[i] is state tensor i; grads[i] its gradient, of the same dtype
	// and memory kind.
	params, grads []collective.Buffer
}

// mixedLayout is the dtype, element count and memory kind of each tensor.
var mixedLayout = func() []tensorLayout {
	var l []tensorLayout
	for i, dt := range allDTypes {
		l = append(l, tensorLayout{dt, 5 + 3*i, false})
	}
	return append(l, tensorLayout{collective.Float32, 64, true}, tensorLayout{collective.Int64, 3, true}, tensorLayout{collective.BFloat16, 9, true})
}()

type tensorLayout struct {
	dt     collective.DType
	n      int
	device bool
}

func newMixedWorker(name string, layout []tensorLayout) *mixedWorker {
	w := &mixedWorker{name: name, state: NewState()}
	for i, l := range layout {
		zeros := make([]byte, l.n*l.dt.Size())
		var p, g collective.Buffer
		if l.device {
			p, g = fakedevice.New(zeros, nil).Buffer(l.dt), fakedevice.New(zeros, nil).Buffer(l.dt)
		} else {
			p, g = collective.HostBuffer(l.dt, zeros), collective.HostBuffer(l.dt, append([]byte(nil), zeros...))
		}
		w.params, w.grads = append(w.params, p), append(w.grads, g)
		w.state.RegisterBuffer(fmt.Sprintf("t%d-%v", i, l.dt), p)
	}
	return w
}

func bufferBytes(b collective.Buffer) []byte {
	if b.Device != nil {
		return b.Device.(*fakedevice.Memory).Bytes()[:b.Bytes()]
	}
	return b.Host
}

func setBuffer(b collective.Buffer, vals []float64) {
	copy(bufferBytes(b), fakedevice.Encode(b.DType, vals))
}

// gradient is rank's contribution to element j of tensor i at step.
func gradient(rank int, step int64, i, j int) float64 { return float64((rank + int(step) + i + j) % 5) }

func (w *mixedWorker) hash() [32]byte {
	h := sha256.New()
	for _, p := range w.params {
		h.Write(bufferBytes(p))
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// train runs steps until the state's step reaches until: every gradient is
// summed across the world, checked against the known sum, and added to its
// parameters (modulo 97, which keeps bfloat16 and uint8 exact).
func (w *mixedWorker) train(ctx context.Context, sess *Session, until int64, rec *recorder, vanish func(int64) bool, kill func()) error {
	for sess.Step() < until {
		step := sess.Step()
		if vanish != nil && vanish(step) {
			kill()
			return nil
		}
		for i, g := range w.grads {
			vals := make([]float64, g.Count)
			for j := range vals {
				vals[j] = gradient(sess.Rank(), step, i, j)
			}
			setBuffer(g, vals)
		}
		err := sess.Allreduce(ctx, Sum(), w.grads...)
		if errors.Is(err, ErrWorldChanged) {
			continue
		}
		if err != nil {
			return err
		}
		for i, g := range w.grads {
			got := fakedevice.Decode(g.DType, bufferBytes(g))
			params := fakedevice.Decode(g.DType, bufferBytes(w.params[i]))
			for j := range got {
				want := 0.0
				for r := range sess.Size() {
					want += gradient(r, step, i, j)
				}
				if got[j] != want {
					return fmt.Errorf("step %d: %v gradient %d[%d] summed to %v over %d workers, want %v", step, g.DType, i, j, got[j], sess.Size(), want)
				}
				params[j] = math.Mod(params[j]+got[j], 97)
			}
			setBuffer(w.params[i], params)
		}
		switch err := sess.Commit(ctx); {
		case errors.Is(err, ErrWorldChanged):
			continue
		case err != nil:
			return err
		}
		rec.add(stepRecord{w.name, sess.World().Number, sess.Size(), sess.Step(), w.hash()})
	}
	return nil
}

// Gradients and state of every dtype, on the host and on a device, go
// through the session: the sums are exact, every worker holds the same state
// at every step, a worker that vanishes mid-run costs a redo, and a joiner
// receives every tensor.
func TestSessionAnyDTypeAndMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	rec := &recorder{}
	const until = 24
	var wg stdsync.WaitGroup
	errs := make(chan error, 4)
	run := func(name string, vanish func(int64) bool) {
		tr := listenTCP(t)
		w := newMixedWorker(name, mixedLayout)
		coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
		wg.Go(func() {
			// A small fusion threshold: several buckets per dtype.
			sess, err := joinCoord(ctx, coord, name, tr, w.state, func(c *Config) { c.FusionBytes = 64 })
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				return
			}
			defer sess.Close()
			if err := w.train(ctx, sess, until, rec, vanish, func() {
				tr.Close() // first: the coordinator's probe of this worker then fails
				sess.Communicator().Abort(errors.New("killed"))
			}); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	var joined stdsync.Once
	run("m0", func(step int64) bool {
		if step == 12 {
			joined.Do(func() {
				run("m3", nil)
				waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("m3") >= 0 })
			})
		}
		return false
	})
	run("m1", nil)
	run("m2", func(step int64) bool { return step == 6 })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := agree(t, rec); n[until] != 3 {
		t.Fatalf("step %d recorded by %d workers, want m0, m1 and the joiner m3", until, n[until])
	}
}

// A worker whose registered state differs from rank 0's cannot join: it gets
// an error naming the difference, and rank 0 trains on without it.
func TestStateMismatchNamesTheTensor(t *testing.T) {
	rootLayout := []tensorLayout{{collective.Float32, 8, false}, {collective.Int64, 2, true}}
	tests := []struct {
		name   string
		layout []tensorLayout
		rename bool
		blob   bool
		want   string
	}{
		{name: "dtype", layout: []tensorLayout{{collective.Float16, 8, false}, {collective.Int64, 2, true}}, want: `state tensor "t0-float16" here is "t0-float32" on rank 0`},
		{name: "size", layout: []tensorLayout{{collective.Float32, 8, false}, {collective.Int64, 3, true}}, want: `state tensor "t1-int64" has 3 elements here but 2 on rank 0`},
		{name: "fewer tensors", layout: rootLayout[:1], want: "rank 0 registers 2 tensors and 0 blobs, this worker 1 and 0 (here: t0-float32 float32[8])"},
		{name: "extra blob", layout: rootLayout, blob: true, want: "rank 0 registers 2 tensors and 0 blobs, this worker 2 and 1"},
		{name: "same name, other dtype", layout: []tensorLayout{{collective.Float32, 8, false}, {collective.Int32, 2, true}}, rename: true, want: `state tensor "t1-int64" is int32 here but int64 on rank 0`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
			go coord.Run(ctx)
			rootTr := listenTCP(t)
			root := newMixedWorker("root", rootLayout)
			coord.Add(epoch.Member{Name: "root", Addr: rootTr.Addr()})
			sess, err := joinCoord(ctx, coord, "root", rootTr, root.state)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()

			badTr := listenTCP(t)
			bad := &mixedWorker{name: "bad", state: NewState()}
			for i, l := range tc.layout {
				name := fmt.Sprintf("t%d-%v", i, l.dt)
				if tc.rename {
					name = fmt.Sprintf("t%d-%v", i, rootLayout[i].dt)
				}
				b := collective.HostBuffer(l.dt, make([]byte, l.n*l.dt.Size()))
				if l.device {
					b = fakedevice.New(b.Host, nil).Buffer(l.dt)
				}
				bad.state.RegisterBuffer(name, b)
			}
			if tc.blob {
				bad.state.RegisterBlob("extra", func() ([]byte, error) { return nil, nil }, func([]byte) error { return nil })
			}
			coord.Add(epoch.Member{Name: "bad", Addr: badTr.Addr()})
			badErr := make(chan error, 1)
			go func() {
				_, err := joinCoord(ctx, coord, "bad", badTr, bad.state)
				if err != nil {
					coord.Remove("bad") // as gossip would once the process exits
				}
				badErr <- err
			}()
			// Rank 0 steps on, alone, until the joiner has given up, and then
			// some more.
			rec := &recorder{}
			err = nil
			for got, more := false, 5; more > 0; {
				if err := root.train(ctx, sess, sess.Step()+1, rec, nil, nil); err != nil {
					t.Fatalf("rank 0 at step %d: %v", sess.Step(), err)
				}
				select {
				case err = <-badErr:
					got = true
				default:
				}
				if got {
					more--
				}
			}
			if sess.Size() != 1 {
				t.Fatalf("rank 0 trains in a world of %d", sess.Size())
			}
			if !errors.Is(err, ErrStateMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("the mismatched joiner got %v, want ErrStateMismatch saying %q", err, tc.want)
			}
		})
	}
}

// Bad arguments are refused before anything is sent: the world stays intact
// and the next allreduce works.
func TestAllreduceRefusesBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	sessions := make([]*Session, 2)
	var wg stdsync.WaitGroup
	for i := range sessions {
		w := startToy(t, fmt.Sprintf("r%d", i), coord, 4)
		wg.Go(func() {
			s, err := joinCoord(ctx, coord, w.name, w.tr, w.state)
			if err != nil {
				t.Error(err)
				return
			}
			sessions[i] = s
			t.Cleanup(func() { s.Close() })
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	good := collective.SliceBuffer([]float32{1, 2})
	bad := []struct {
		name string
		how  Reduction
		bufs []collective.Buffer
		want string
	}{
		{"invalid op", Reduction{Op: 99}, []collective.Buffer{good}, "invalid reduce op"},
		{"infinite prescale", Reduction{Prescale: math.Inf(1)}, []collective.Buffer{good}, "not finite"},
		{"NaN postscale", Reduction{Postscale: math.NaN()}, []collective.Buffer{good}, "not finite"},
		{"short buffer", Reduction{}, []collective.Buffer{good, {DType: collective.Int32, Count: 3, Host: make([]byte, 4)}}, "tensor 1: 4 host bytes for 3 int32"},
	}
	for _, tc := range bad {
		for _, async := range []bool{false, true} {
			var err error
			if async {
				err = sessions[0].WaitAll(ctx, sessions[0].AllreduceAsync(ctx, tc.how, tc.bufs...))
			} else {
				err = sessions[0].Allreduce(ctx, tc.how, tc.bufs...)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrWorldChanged) {
				t.Errorf("%s (async %v): %v, want an error saying %q", tc.name, async, err, tc.want)
			}
		}
	}
	epochBefore := sessions[0].World().Number
	// Both workers step on, with Average and the scales passed through.
	errs := make([]error, 2)
	got := make([][]float64, 2)
	for i, s := range sessions {
		wg.Go(func() {
			x := []float64{float64(i), 10}
			errs[i] = s.Allreduce(ctx, Reduction{Prescale: 2, Postscale: 3}, collective.SliceBuffer(x))
			if errs[i] == nil {
				errs[i] = s.Commit(ctx)
			}
			got[i] = x
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d after the refusals: %v", i, err)
		}
		// Average of (0, 1)·2·3 = 3; of (10, 10)·2·3 = 60.
		if got[i][0] != 3 || got[i][1] != 60 {
			t.Fatalf("worker %d: %v, want [3 60]", i, got[i])
		}
	}
	if n := sessions[0].World().Number; n != epochBefore {
		t.Fatalf("the refusals changed the world: epoch %d, then %d", epochBefore, n)
	}
}

// A description of rank 0's state comes off the wire: whatever its bytes, a
// worker refuses a malformed or different one with ErrStateMismatch, and
// accepts its own.
func FuzzStateDescription(f *testing.F) {
	mine := NewState()
	mine.RegisterBuffer("w", collective.SliceBuffer(make([]collective.BF16, 3)))
	mine.RegisterTensor("v", make([]float32, 2))
	mine.RegisterBlob("pos", func() ([]byte, error) { return []byte("abc"), nil }, func([]byte) error { return nil })
	own := mine.describe([][]byte{[]byte("abc")})
	f.Add(own)
	f.Add([]byte{})
	f.Add(own[:len(own)-1])
	f.Add(append(own, 0))
	f.Fuzz(func(t *testing.T, desc []byte) {
		sizes, err := mine.compare(desc, 0)
		if err != nil {
			if !errors.Is(err, ErrStateMismatch) {
				t.Fatalf("error %v does not wrap ErrStateMismatch", err)
			}
			return
		}
		if len(sizes) != 1 || sizes[0] > maxDescription {
			t.Fatalf("accepted blob sizes %v", sizes)
		}
	})
}
