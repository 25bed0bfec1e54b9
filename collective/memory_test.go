package collective

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/reduce"
)

// TestHostKernelErrors checks that the host kernels under the collectives
// turn an op or a divisor they cannot apply into an error, and leave the
// memory as it was, rather than panicking or reducing with some other op.
// An op is refused by internal/reduce's kernels (their error is carried:
// is), in words that name the collective's op.
func TestHostKernelErrors(t *testing.T) {
	ctx := context.Background()
	src := bytes.Repeat([]byte{3}, 16)
	cases := []struct {
		name string
		call func(dst []byte) error
		want string
		is   error // what the error wraps, when set
	}{
		{"unknown op", func(dst []byte) error { return reduceHost(Int32, ReduceOp(17), dst, src, src) },
			"collective: reduce op 17 unknown", reduce.ErrUnknownOp},
		{"op 0", func(dst []byte) error { return reduceHost(Float32, 0, dst, src, src) },
			"collective: reduce op 0 unknown", reduce.ErrUnknownOp},
		{"adasum elementwise", func(dst []byte) error { return reduceHost(Float32, Adasum, dst, src, src) },
			"collective: adasum combines whole tensors", reduce.ErrUnknownOp},
		{"reduce unknown dtype", func(dst []byte) error { return reduceHost(DType(99), Sum, dst, src, src) },
			"collective: cannot reduce dtype(99)", nil},
		{"reduceFrom unknown op", func(dst []byte) error {
			return memory{host: dst}.reduceFrom(ctx, 0, memory{host: src}, 0, src, Uint8, ReduceOp(200))
		}, "collective: reduce op 200 unknown", reduce.ErrUnknownOp},
		{"integer average over 0", func(dst []byte) error {
			return memory{host: dst}.scale(ctx, 0, len(dst), Int32, 1, 0)
		}, "collective: integer average over 0 members", nil},
		{"integer average over -2", func(dst []byte) error {
			return memory{host: dst}.scale(ctx, 0, len(dst), Int64, 1, -2)
		}, "collective: integer average over -2 members", nil},
		{"average over 0 of nothing", func(dst []byte) error {
			return memory{host: dst}.scale(ctx, 0, 0, Uint8, 1, 0)
		}, "collective: integer average over 0 members", nil},
		{"scale unknown dtype", func(dst []byte) error { return scaleHost(DType(99), dst, 2, 1) },
			"collective: cannot scale dtype(99)", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := bytes.Repeat([]byte{7}, 16)
			err := c.call(dst)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v does not wrap %v", err, c.is)
			}
			if !bytes.Equal(dst, bytes.Repeat([]byte{7}, 16)) {
				t.Errorf("memory changed to %v", dst)
			}
		})
	}
}

func TestFinalScale(t *testing.T) {
	cases := []struct {
		dt          DType
		op          ReduceOp
		p           int
		factor      float64
		divisor     int
		errContains string
	}{
		{Float32, Sum, 4, 2, 1, ""},
		{Float32, Average, 4, 0.5, 1, ""},
		{Int32, Average, 4, 2, 4, ""},
		{Int32, Average, 1, 2, 1, ""},
		{Int32, Sum, 0, 2, 1, ""}, // nothing to divide
		{Int32, Average, 0, 0, 0, "collective: int32 average over 0 members"},
		{Float32, Average, 0, 0, 0, "collective: float32 average over 0 members"},
		{Uint8, Average, -1, 0, 0, "collective: uint8 average over -1 members"},
	}
	for _, c := range cases {
		factor, divisor, err := finalScale(c.dt, c.op, 2, c.p)
		switch {
		case c.errContains == "" && err != nil:
			t.Errorf("%v %v over %d: %v", c.dt, c.op, c.p, err)
		case c.errContains != "" && (err == nil || !strings.Contains(err.Error(), c.errContains)):
			t.Errorf("%v %v over %d: error %v, want one containing %q", c.dt, c.op, c.p, err, c.errContains)
		case factor != c.factor || divisor != c.divisor:
			t.Errorf("%v %v over %d: factor %v divisor %d, want %v and %d", c.dt, c.op, c.p, factor, divisor, c.factor, c.divisor)
		}
	}
}

// TestUnknownReduceOp checks that the public reducing collectives reject an
// unknown op, naming it, before sending anything: the world still works.
func TestUnknownReduceOp(t *testing.T) {
	comms := newWorld(t, inprocMesh, 2, DefaultConfig())
	c := comms[0]
	ctx := context.Background()
	f := make([]byte, 16)
	cases := []struct {
		name string
		call func() error
	}{
		{"allreduce", func() error { return c.Allreduce(ctx, HostBuffer(Int32, f), HostBuffer(Int32, f), ReduceOp(17)) }},
		{"reducescatter", func() error {
			return c.ReduceScatter(ctx, HostBuffer(Int32, f), HostBuffer(Int32, f[:8]), ReduceOp(17))
		}},
		{"typed allreduce", func() error {
			x := []float32{1, 2}
			return Allreduce(ctx, c, x, x, ReduceOp(17))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), "collective: reduce op 17 unknown") {
				t.Fatalf("error %v, want one naming reduce op 17 as unknown", err)
			}
		})
	}
	noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
		return c.Barrier(ctx)
	}))
}
