package collective

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/internal/half"
)

// meshFunc builds the links of a p-rank world: mesh[i] are rank i's links.
type meshFunc func(t testing.TB, w transport.World) [][]transport.Link

func inprocMesh(t testing.TB, w transport.World) [][]transport.Link {
	return inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: 5 * time.Second}, w.Size())
}

// newWorld returns p communicators over mk's links.
func newWorld(t testing.TB, mk meshFunc, p int, cfg Config) []*Communicator {
	t.Helper()
	w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, p)}
	mesh := mk(t, w)
	comms := make([]*Communicator, p)
	for r := range comms {
		w.Rank = r
		c, err := NewFromLinks(w, mesh[r], cfg)
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		comms[r] = c
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// onAll runs fn on every rank concurrently under a deadline and returns each
// rank's error.
func onAll(t testing.TB, comms []*Communicator, timeout time.Duration, fn func(ctx context.Context, c *Communicator) error) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(ctx, c) })
	}
	wg.Wait()
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// Test values are small integers (times powers of two for products), so that
// every reduction order gives exactly the same result and the naive reference
// is exact in every dtype.
func testValue(dt DType, op ReduceOp, rank, i int) float64 {
	h := (rank*7919 + i*104729 + int(dt)*31) % 17
	switch {
	case op == Product && dt.IsFloat():
		return []float64{-2, -1, -0.5, 0.5, 1, 2}[h%6]
	case op == Product:
		return float64(1 + h%2)
	case dt == Uint8:
		return float64(h)
	}
	return float64(h - 8)
}

// encode stores float64 values as dt elements.
func encode(dt DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		putElem(dt, b, i, v)
	}
	return b
}

func putElem(dt DType, b []byte, i int, v float64) {
	switch dt {
	case Float32:
		view[float32](b)[i] = float32(v)
	case Float64:
		view[float64](b)[i] = v
	case Float16:
		view[uint16](b)[i] = half.F32ToF16(float32(v))
	case BFloat16:
		view[uint16](b)[i] = half.F32ToBF16(float32(v))
	case Int32:
		view[int32](b)[i] = int32(v)
	case Int64:
		view[int64](b)[i] = int64(v)
	case Uint8:
		b[i] = uint8(int64(v))
	}
}

func elem(dt DType, b []byte, i int) float64 {
	switch dt {
	case Float32:
		return float64(view[float32](b)[i])
	case Float64:
		return view[float64](b)[i]
	case Float16:
		return float64(half.F16ToF32(view[uint16](b)[i]))
	case BFloat16:
		return float64(half.BF16ToF32(view[uint16](b)[i]))
	case Int32:
		return float64(view[int32](b)[i])
	case Int64:
		return float64(view[int64](b)[i])
	case Uint8:
		return float64(b[i])
	}
	return math.NaN()
}

// referenceReduce computes the expected result of reducing rank inputs with op,
// prescale and postscale, following the documented rounding: integers wrap,
// scale factors on floats are applied in the element's arithmetic precision
// (float32 for the half types).
func referenceReduce(dt DType, op ReduceOp, inputs [][]float64, pre, post float64) []float64 {
	p := len(inputs)
	n := len(inputs[0])
	out := make([]float64, n)
	for i := range out {
		var acc float64
		for r := range p {
			v := scaleRef(dt, inputs[r][i], pre)
			if r == 0 {
				acc = v
				continue
			}
			switch op {
			case Sum, Average:
				acc += v
			case Product:
				acc *= v
			case Min:
				acc = math.Min(acc, v)
			case Max:
				acc = math.Max(acc, v)
			}
			acc = wrap(dt, acc)
		}
		factor, divisor, _ := finalScale(dt, op, post, p) // p >= 1: no error
		if divisor > 1 {
			acc = math.Trunc(acc / float64(divisor))
		}
		out[i] = scaleRef(dt, acc, factor)
	}
	return out
}

func scaleRef(dt DType, v, f float64) float64 {
	if f == 1 {
		return v
	}
	switch dt {
	case Float32:
		return float64(float32(v) * float32(f))
	case Float16:
		return float64(half.F16ToF32(half.F32ToF16(float32(v) * float32(f))))
	case BFloat16:
		return float64(half.BF16ToF32(half.F32ToBF16(float32(v) * float32(f))))
	case Float64:
		return v * f
	}
	return wrapSaturate(dt, math.RoundToEven(v*f))
}

func wrap(dt DType, v float64) float64 {
	switch dt {
	case Int32:
		return float64(int32(int64(v)))
	case Uint8:
		return float64(uint8(int64(v)))
	}
	return v
}

func wrapSaturate(dt DType, v float64) float64 {
	switch dt {
	case Int32:
		return math.Max(math.MinInt32, math.Min(math.MaxInt32, v))
	case Uint8:
		return math.Max(0, math.Min(255, v))
	}
	return v
}

func sameElems(dt DType, got []byte, want []float64) error {
	for i, w := range want {
		g := elem(dt, got, i)
		if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
			return fmt.Errorf("element %d of %d: got %v, want %v", i, len(want), g, w)
		}
	}
	return nil
}

var allDTypes = []DType{Float32, Float64, Float16, BFloat16, Int32, Int64, Uint8}
var allOps = []ReduceOp{Sum, Average, Min, Max, Product}
