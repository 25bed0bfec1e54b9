package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// adasumReference combines the ranks' inputs in one process, straight from
// the formula of the Adasum paper: ranks pair up level by level (r with
// r+m, m = 1, 2, 4, ..., the lower rank's vector on the left), and each
// tensor of layout combines as
//
//	(1 - a·b/(2|a|²)) a + (1 - a·b/(2|b|²)) b
//
// over its whole length, in float64, the result rounded to dt after each
// level as the ranks' buffers are. A squared norm under 2^-511 counts as 0.
func adasumReference(dt DType, inputs [][]float64, layout []int) []float64 {
	p := len(inputs)
	vecs := make([][]float64, p)
	for r := range inputs {
		vecs[r] = append([]float64(nil), inputs[r]...)
	}
	for m := 1; m < p; m *= 2 {
		for r := 0; r < p; r += 2 * m {
			a, b := vecs[r], vecs[r+m]
			start := 0
			for _, n := range layout {
				ta, tb := a[start:start+n], b[start:start+n]
				var dot, na, nb float64
				for i := range ta {
					dot += ta[i] * tb[i]
					na += ta[i] * ta[i]
					nb += tb[i] * tb[i]
				}
				ca, cb := 1.0, 1.0
				if na >= 0x1p-511 {
					ca = 1 - dot/(2*na)
				}
				if nb >= 0x1p-511 {
					cb = 1 - dot/(2*nb)
				}
				for i := range ta {
					ta[i] = roundTo(dt, ca*ta[i]+cb*tb[i])
				}
				start += n
			}
		}
	}
	return vecs[0]
}

// roundTo rounds v to the nearest value of dt.
func roundTo(dt DType, v float64) float64 {
	b := make([]byte, dt.Size())
	putElem(dt, b, 0, v)
	return elem(dt, b, 0)
}

// adasumInput is how a test case fills rank r's tensors: vals returns the
// values of tensor t (n elements) on rank r of p.
type adasumInput func(rng *rand.Rand, p, r, t, n int) []float64

// disjoint gives each rank its own elements (i % p == r): orthogonal
// vectors, whose Adasum is their sum.
func disjoint(_ *rand.Rand, p, r, t, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		if i%p == r {
			v[i] = float64(1 + (i+3*t)%7)
		}
	}
	return v
}

// identical gives every rank the same vector: their Adasum is that vector.
func identical(_ *rand.Rand, p, r, t, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64((i*5+t)%9 - 4)
	}
	return v
}

// scaled gives rank r the same direction times (r+1): parallel vectors,
// whose Adasum is their average.
func scaled(_ *rand.Rand, p, r, t, n int) []float64 {
	v := identical(nil, p, r, t, n)
	for i := range v {
		v[i] *= float64(r + 1)
	}
	return v
}

func random(rng *rand.Rand, p, r, t, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

// adasumTolerance bounds the relative L2 distance between a result and the
// reference: the ranks sum each dot product in pieces, in another order, so
// a coefficient can differ in its last bits and an element round the other
// way.
func adasumTolerance(dt DType) float64 {
	switch dt {
	case Float64:
		return 1e-12
	case Float32:
		return 1e-6
	case Float16:
		return 4e-3
	}
	return 3e-2 // bfloat16
}

func relL2(got, want []float64) float64 {
	var d, w float64
	for i := range want {
		d += (got[i] - want[i]) * (got[i] - want[i])
		w += want[i] * want[i]
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

var floatDTypes = []DType{Float32, Float64, Float16, BFloat16}

// runAdasum fills every rank's buffer from inputs (tensor t of layout from
// fill), runs one Adasum allreduce (with Tensors(layout) when fused), checks
// that every rank ends with the same bytes, and returns rank 0's result and
// the inputs as dt holds them.
func runAdasum(t *testing.T, comms []*Communicator, dt DType, layout []int, fill adasumInput, seed uint64, fused bool, opts ...Option) ([]float64, [][]float64) {
	t.Helper()
	p := len(comms)
	total := 0
	for _, n := range layout {
		total += n
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	inputs := make([][]float64, p)
	bufs := make([][]byte, p)
	for r := range p {
		for ti, n := range layout {
			inputs[r] = append(inputs[r], fill(rng, p, r, ti, n)...)
		}
		bufs[r] = encode(dt, inputs[r])
		for i := range inputs[r] {
			inputs[r][i] = elem(dt, bufs[r], i)
		}
	}
	if fused {
		opts = append(opts, Tensors(layout))
	}
	noErrors(t, onAll(t, comms, 60*time.Second, func(ctx context.Context, c *Communicator) error {
		b := HostBuffer(dt, bufs[c.Rank()])
		return c.Allreduce(ctx, b, b, Adasum, opts...)
	}))
	for r := 1; r < p; r++ {
		if !bytes.Equal(bufs[r], bufs[0]) {
			t.Fatalf("rank %d's result differs from rank 0's", r)
		}
	}
	got := make([]float64, total)
	for i := range got {
		got[i] = elem(dt, bufs[0], i)
	}
	return got, inputs
}

// TestAdasumMatchesReference runs Adasum over loopback TCP against the
// one-process reference: orthogonal vectors add up, identical ones stay,
// parallel ones average, random ones match the formula — for every
// floating-point dtype, 2, 4 and 8 ranks, one tensor or several fused into
// one buffer (each then combined with its own dot product and norms), and
// tensors with fewer elements than ranks.
func TestAdasumMatchesReference(t *testing.T) {
	layouts := [][]int{{1000}, {3, 0, 517, 1, 64, 7}, {1}, {5, 2}}
	cases := []struct {
		name  string
		fill  adasumInput
		exact func(inputs [][]float64, i int) float64 // the expected element, when the formula gives it exactly
	}{
		{"orthogonal", disjoint, func(in [][]float64, i int) float64 {
			s := 0.0
			for _, v := range in {
				s += v[i]
			}
			return s
		}},
		{"identical", identical, func(in [][]float64, i int) float64 { return in[0][i] }},
		{"parallel", scaled, nil},
		{"random", random, nil},
	}
	for _, p := range []int{2, 4, 8} {
		comms := newWorld(t, tcpMesh, p, DefaultConfig())
		for _, dt := range floatDTypes {
			for li, layout := range layouts {
				for ci, tc := range cases {
					t.Run(fmt.Sprintf("p%d/%v/layout%d/%s", p, dt, li, tc.name), func(t *testing.T) {
						got, inputs := runAdasum(t, comms, dt, layout, tc.fill, uint64(p*1000+li*10+ci), len(layout) > 1)
						want := adasumReference(dt, inputs, layout)
						start := 0
						for ti, n := range layout {
							g, w := got[start:start+n], want[start:start+n]
							if e := relL2(g, w); e > adasumTolerance(dt) {
								t.Errorf("tensor %d (%d elements): relative distance %.3g from the reference (tolerance %.3g)", ti, n, e, adasumTolerance(dt))
							}
							if tc.exact != nil {
								for i := range g {
									if x := tc.exact(inputs, start+i); g[i] != x {
										t.Fatalf("tensor %d element %d: got %v, want exactly %v", ti, i, g[i], x)
									}
								}
							}
							start += n
						}
						if tc.name == "parallel" {
							// The average of (r+1)·v over the ranks.
							for i, v := range inputs[0] {
								avg := v * float64(p+1) / 2
								if math.Abs(got[i]-avg) > 4*adasumTolerance(dt)*math.Abs(avg)+1e-300 {
									t.Fatalf("element %d: got %v, want the average %v", i, got[i], avg)
								}
							}
						}
					})
				}
			}
		}
	}
}

// TestAdasumTensorsAreIndependent checks that fusing does not change the
// result: each tensor of a fused buffer comes out as it does when reduced
// alone, and differs from what one dot product over the whole buffer would
// give.
func TestAdasumTensorsAreIndependent(t *testing.T) {
	const p = 4
	comms := newWorld(t, tcpMesh, p, DefaultConfig())
	layout := []int{300, 41, 1000}
	// Tensor 0 orthogonal across ranks, tensor 1 identical, tensor 2 random.
	fill := func(rng *rand.Rand, p, r, t, n int) []float64 {
		return []adasumInput{disjoint, identical, random}[t](rng, p, r, t, n)
	}
	fused, inputs := runAdasum(t, comms, Float64, layout, fill, 42, true)
	start := 0
	for ti, n := range layout {
		alone, _ := runAdasum(t, comms, Float64, []int{n}, func(rng *rand.Rand, p, r, _, n int) []float64 {
			return inputs[r][start : start+n]
		}, 42, false)
		if e := relL2(fused[start:start+n], alone); e > 1e-12 {
			t.Errorf("tensor %d: fused result is %.3g away from the tensor reduced alone", ti, e)
		}
		start += n
	}
	whole := adasumReference(Float64, inputs, []int{1341})
	if e := relL2(fused, whole); e < 1e-3 {
		t.Errorf("the fused result is within %.3g of one Adasum over the whole buffer: the tensors were not kept apart", e)
	}
}

// TestAdasumOptions checks Horovod's order of scaling (prescale before the
// combination, postscale after), that MaxTag spreads through Adasum's frames,
// and a world of one.
func TestAdasumOptions(t *testing.T) {
	comms := newWorld(t, tcpMesh, 4, DefaultConfig())
	got, inputs := runAdasum(t, comms, Float32, []int{64}, disjoint, 1, false, Prescale(2), Postscale(3))
	for i := range got {
		want := 0.0
		for _, in := range inputs {
			want += 6 * in[i]
		}
		if got[i] != want {
			t.Fatalf("element %d: got %v, want %v (6 × the sum of orthogonal vectors)", i, got[i], want)
		}
	}
	tags := make([]uint64, 4)
	noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		tags[c.Rank()] = uint64(10 * (c.Rank() + 1))
		b := SliceBuffer(make([]float32, 9))
		return c.Allreduce(ctx, b, b, Adasum, MaxTag(&tags[c.Rank()]))
	}))
	for r, v := range tags {
		if v != 40 {
			t.Errorf("rank %d: MaxTag came out as %d, want 40", r, v)
		}
	}

	alone := newWorld(t, inprocMesh, 1, DefaultConfig())
	x := []float64{1, -2, 3}
	noErrors(t, onAll(t, alone, 5*time.Second, func(ctx context.Context, c *Communicator) error {
		b := SliceBuffer(x)
		return c.Allreduce(ctx, b, b, Adasum, Postscale(0.5))
	}))
	if x[0] != 0.5 || x[1] != -1 || x[2] != 1.5 {
		t.Errorf("a world of one: got %v, want its input times the postscale", x)
	}
}

// TestAdasumRefusals checks the inputs Adasum refuses before sending
// anything, each with its error on every rank and the communicator still
// working afterwards, and ranks that fused differently.
func TestAdasumRefusals(t *testing.T) {
	t.Run("not a power of two", func(t *testing.T) {
		comms := newWorld(t, tcpMesh, 3, DefaultConfig())
		errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer([]float32{1, 2})
			return c.Allreduce(ctx, b, b, Adasum)
		})
		for r, err := range errs {
			if !errors.Is(err, ErrNotPowerOfTwo) {
				t.Errorf("rank %d: got %v, want ErrNotPowerOfTwo", r, err)
			}
		}
		stillWorks(t, comms)
	})
	comms := newWorld(t, tcpMesh, 2, DefaultConfig())
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Communicator) error
		want string
	}{
		{"integer dtype", func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer([]int32{1, 2})
			return c.Allreduce(ctx, b, b, Adasum)
		}, "floating-point"},
		{"layout longer than the buffer", func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer([]float32{1, 2})
			return c.Allreduce(ctx, b, b, Adasum, Tensors([]int{1, 2}))
		}, "3 elements in all in a buffer of 2"},
		{"negative tensor", func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer([]float32{1, 2})
			return c.Allreduce(ctx, b, b, Adasum, Tensors([]int{3, -1}))
		}, "negative"},
		{"reducescatter", func(ctx context.Context, c *Communicator) error {
			return c.ReduceScatter(ctx, SliceBuffer([]float32{1, 2}), SliceBuffer([]float32{0}), Adasum)
		}, "reducescatter cannot use adasum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for r, err := range onAll(t, comms, 10*time.Second, tc.call) {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
					t.Errorf("rank %d: got %v, want an error with %q", r, err, tc.want)
				}
			}
			stillWorks(t, comms)
		})
	}
	t.Run("layouts differ", func(t *testing.T) {
		errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer(make([]float32, 10))
			return c.Allreduce(ctx, b, b, Adasum, Tensors([]int{4 + c.Rank(), 6 - c.Rank()}))
		})
		for r, err := range errs {
			var m *MismatchError
			if !errors.As(err, &m) || m.Field != "layout" {
				t.Errorf("rank %d: got %v, want a MismatchError on the layout", r, err)
			}
		}
	})
}

// stillWorks runs a Sum allreduce on comms and checks its result.
func stillWorks(t *testing.T, comms []*Communicator) {
	t.Helper()
	sums := make([][]float32, len(comms))
	noErrors(t, onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
		sums[c.Rank()] = []float32{1}
		b := SliceBuffer(sums[c.Rank()])
		return c.Allreduce(ctx, b, b, Sum)
	}))
	if sums[0][0] != float32(len(comms)) {
		t.Fatalf("a sum after the refusal gave %v, want %d", sums[0][0], len(comms))
	}
}

// TestAdasumDeviceMemory checks that device buffers (reached only through
// DeviceMemory) give the host's result, with send and receive apart.
func TestAdasumDeviceMemory(t *testing.T) {
	const p, n = 4, 333
	comms := newWorld(t, tcpMesh, p, DefaultConfig())
	host := make([][]byte, p)
	sends, recvs := make([]*fakeDevice, p), make([]*fakeDevice, p)
	var calls atomic.Int64
	rng := rand.New(rand.NewPCG(3, 4))
	for r := range p {
		host[r] = encode(Float32, random(rng, p, r, 0, n))
		sends[r] = newFakeDevice(host[r], &calls)
		recvs[r] = newFakeDevice(make([]byte, len(host[r])), &calls)
	}
	noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		b := HostBuffer(Float32, host[c.Rank()])
		return c.Allreduce(ctx, b, b, Adasum, Prescale(0.5))
	}))
	noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		return c.Allreduce(ctx, devBuffer(Float32, sends[r]), devBuffer(Float32, recvs[r]), Adasum, Prescale(0.5))
	}))
	if calls.Load() == 0 {
		t.Fatal("the device memory was never called")
	}
	for r := range p {
		if !bytes.Equal(recvs[r].mem, host[0]) {
			t.Fatalf("rank %d: the device result differs from the host's", r)
		}
	}
}

// TestToOddFloat32 checks that rounding through float32 with round-to-odd
// gives float16 and bfloat16 what rounding float64 directly gives, on the
// values where plain float32 rounding first goes wrong: just above a
// half-way point of the narrow type, by less than float32 can hold.
func TestToOddFloat32(t *testing.T) {
	for _, tc := range []struct {
		dt      DType
		v, want float64
	}{
		// 1 + 2^-11 is half-way between float16's 1 and 1+2^-10; a hair
		// above it rounds up, but float32(v) drops the hair and ties to 1.
		{Float16, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-10},
		{Float16, 1 + 0x1p-11 - 0x1p-40, 1},
		{BFloat16, 1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-7},
		{BFloat16, -(1 + 0x1p-8 + 0x1p-40), -(1 + 0x1p-7)},
		{Float16, 3, 3},
	} {
		b := make([]byte, 2)
		x := toOddFloat32(tc.v)
		if tc.dt == Float16 {
			putElem(Float16, b, 0, float64(x))
		} else {
			putElem(BFloat16, b, 0, float64(x))
		}
		if got := elem(tc.dt, b, 0); got != tc.want {
			t.Errorf("%v %v: got %v, want %v", tc.dt, tc.v, got, tc.want)
		}
	}
}

// TestScaledAddRoundsOnce checks that the 16-bit combination rounds its
// float64 value once: 1·1 + (1+2^-30)·2^-11 lies a hair above float16's
// half-way point between 1 and 1+2^-10, so it rounds up, where rounding to
// float32 first would make it a tie and round it down to 1.
func TestScaledAddRoundsOnce(t *testing.T) {
	a, b := encode(Float16, []float64{1}), encode(Float16, []float64{0x1p-11})
	scaledAdd(Float16, a, 1, b, 1+0x1p-30)
	if got := elem(Float16, a, 0); got != 1+0x1p-10 {
		t.Errorf("got %v, want %v", got, 1+0x1p-10)
	}
}

// TestAdasumPeerFailures checks that a peer that closes its communicator in
// the middle of an Adasum allreduce, or never calls it, gives the others a
// typed error naming a peer (never a hang), over loopback TCP.
func TestAdasumPeerFailures(t *testing.T) {
	const p = 4
	t.Run("closes", func(t *testing.T) {
		comms := newWorld(t, tcpMesh, p, Config{AbortTimeout: time.Second})
		victim := p - 1
		errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
			b := SliceBuffer(make([]float32, 1<<20))
			if err := c.Allreduce(ctx, b, b, Adasum); err != nil {
				return fmt.Errorf("first allreduce: %w", err)
			}
			if c.Rank() == victim {
				c.Close()
				return nil
			}
			return c.Allreduce(ctx, b, b, Adasum)
		})
		for r, err := range errs {
			if r != victim && (err == nil || !isTypedFailure(err) || errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("rank %d: want a typed failure, got %v", r, err)
			}
		}
	})
	t.Run("silent", func(t *testing.T) {
		comms := newWorld(t, tcpMesh, p, DefaultConfig())
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errs := make(chan error, p-1)
		for _, c := range comms[:p-1] {
			go func() {
				b := SliceBuffer(make([]float64, 1000))
				errs <- c.Allreduce(ctx, b, b, Adasum)
			}()
		}
		for range p - 1 {
			select {
			case err := <-errs:
				if !isTypedFailure(err) {
					t.Errorf("want a PeerError or RemoteAbortError, got %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Adasum did not return after its deadline")
			}
		}
	})
}
