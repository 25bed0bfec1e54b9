package benchmark

import (
	"context"
	"encoding/binary"
	"math"
	"slices"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/half"
)

// workload holds one size's buffers and knows what a correct result looks like.
// Inputs are small integers so that every dtype and every reduction order gives
// an exact, predictable answer.
type workload struct {
	spec       Spec
	p, rank    int
	bytes      int
	count      int // elements of the nccl-tests size
	send, recv []byte
	root       int
	// holders and receivers of a replicate: every rank but the last
	// holds the buffer and the last receives it (a world of one: a holder
	// alone).
	holders, receivers []int
}

func value(rank, i int) float64 { return float64((rank + i) % 4) }

func newWorkload(spec Spec, size, p, rank int) *workload {
	esz := spec.DType.Size()
	n := size / esz
	if spec.Op != "allreduce" && spec.Op != "broadcast" && spec.Op != "replicate" {
		n -= n % p // the per-rank share must be whole
	}
	w := &workload{spec: spec, p: p, rank: rank, count: n, bytes: n * esz}
	fill := func(cnt, r, base int) []byte {
		b := make([]byte, cnt*esz)
		for i := range cnt {
			put(spec.DType, b, i, value(r, base+i))
		}
		return b
	}
	switch spec.Op {
	case "allreduce":
		w.send, w.recv = fill(n, rank, 0), make([]byte, n*esz)
	case "broadcast":
		w.recv = fill(n, rank, 0)
	case "replicate":
		// The holders' buffers are rank 0's (one state); the receiver's
		// starts empty.
		w.holders = []int{0}
		for r := 1; r < p-1; r++ {
			w.holders = append(w.holders, r)
		}
		if p > 1 {
			w.receivers = []int{p - 1}
		}
		if slices.Contains(w.holders, rank) {
			w.recv = fill(n, 0, 0)
		} else {
			w.recv = make([]byte, n*esz)
		}
	case "allgather":
		w.send, w.recv = fill(n/p, rank, 0), make([]byte, n*esz)
	case "reducescatter":
		w.send, w.recv = fill(n, rank, 0), make([]byte, n/p*esz)
	case "alltoall":
		w.send, w.recv = fill(n, rank, 0), make([]byte, n*esz)
	}
	return w
}

func (w *workload) run(ctx context.Context, c *collective.Communicator) error {
	dt := w.spec.DType
	send, recv := collective.HostBuffer(dt, w.send), collective.HostBuffer(dt, w.recv)
	switch w.spec.Op {
	case "allreduce":
		return c.Allreduce(ctx, send, recv, w.spec.Reduce)
	case "broadcast":
		return c.Broadcast(ctx, recv, w.root)
	case "allgather":
		return c.Allgather(ctx, send, recv)
	case "reducescatter":
		return c.ReduceScatter(ctx, send, recv, w.spec.Reduce)
	case "replicate":
		return c.Replicate(ctx, recv, w.holders, w.receivers)
	default:
		return c.Alltoall(ctx, send, recv)
	}
}

// verify checks the receive buffer after the last run.
func (w *workload) verify() bool {
	dt := w.spec.DType
	n := len(w.recv) / dt.Size()
	block := w.count / w.p
	for i := range n {
		var want float64
		switch w.spec.Op {
		case "allreduce":
			want = w.reduced(i)
		case "reducescatter":
			want = w.reduced(w.rank*block + i)
		case "broadcast":
			want = value(w.root, i)
		case "replicate":
			want = value(0, i)
		case "allgather":
			want = value(i/block, i%block)
		case "alltoall":
			// Block j of the result came from rank j's block for this rank.
			want = value(i/block, w.rank*block+i%block)
		}
		if got := get(dt, w.recv, i); got != want && math.Abs(got-want) > 1e-2*math.Abs(want) {
			return false
		}
	}
	return true
}

func (w *workload) reduced(i int) float64 {
	acc := value(0, i)
	for r := 1; r < w.p; r++ {
		v := value(r, i)
		switch w.spec.Reduce {
		case collective.Sum, collective.Average:
			acc += v
		case collective.Min:
			acc = math.Min(acc, v)
		case collective.Max:
			acc = math.Max(acc, v)
		case collective.Product:
			acc *= v
		}
	}
	if w.spec.Reduce == collective.Average {
		if w.spec.DType.IsFloat() {
			return acc / float64(w.p)
		}
		return math.Trunc(acc / float64(w.p))
	}
	return wrapInt(w.spec.DType, acc)
}

func wrapInt(dt collective.DType, v float64) float64 {
	switch dt {
	case collective.Uint8:
		return float64(uint8(int64(v)))
	case collective.Int32:
		return float64(int32(int64(v)))
	}
	return v
}

func put(dt collective.DType, b []byte, i int, v float64) {
	switch dt {
	case collective.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case collective.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	case collective.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToF16(float32(v)))
	case collective.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToBF16(float32(v)))
	case collective.Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	case collective.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
	case collective.Uint8:
		b[i] = uint8(v)
	}
}

func get(dt collective.DType, b []byte, i int) float64 {
	switch dt {
	case collective.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case collective.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case collective.Float16:
		return float64(half.F16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case collective.BFloat16:
		return float64(half.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case collective.Int32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case collective.Int64:
		return float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
	case collective.Uint8:
		return float64(b[i])
	}
	return math.NaN()
}
