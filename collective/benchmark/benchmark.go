package benchmark

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/collective"
)

// opNames are the collectives the benchmark measures. "replicate" is a
// joiner's state transfer (Communicator.Replicate): every rank but the
// last holds the buffer and the last receives it, in stripes from
// Config.StripeSources of them.
var opNames = []string{"allreduce", "broadcast", "allgather", "reducescatter", "alltoall", "replicate"}

// Ops returns the names of the collectives the benchmark measures.
func Ops() []string { return slices.Clone(opNames) }

// Spec says what to measure.
type Spec struct {
	Op     string // one of Ops()
	DType  collective.DType
	Reduce collective.ReduceOp // for allreduce and reducescatter
	Sizes  []int               // message sizes in bytes, nccl-tests style (see Result.Bytes)
	Warmup int                 // untimed runs per size
	Iters  int                 // timed samples per size; the median is reported
	// BatchTime is the least time one timed sample should take: small messages
	// run back to back in batches so timer resolution and start-up skew stay
	// negligible. 0 means one operation per sample.
	BatchTime time.Duration
}

// DefaultSpec measures float32 sum allreduce from 4 KiB to 64 MiB.
func DefaultSpec() Spec {
	return Spec{
		Op: "allreduce", DType: collective.Float32, Reduce: collective.Sum,
		Sizes: Sizes(4<<10, 64<<20, 2), Warmup: 5, Iters: 20, BatchTime: time.Millisecond,
	}
}

// Validate reports a spec that cannot run.
func (s Spec) Validate() error {
	if !slices.Contains(opNames, s.Op) {
		return fmt.Errorf("benchmark: unknown collective %q (want one of %s)", s.Op, strings.Join(opNames, ", "))
	}
	if !s.DType.Valid() {
		return fmt.Errorf("benchmark: invalid dtype")
	}
	if (s.Op == "allreduce" || s.Op == "reducescatter") && !s.Reduce.Valid() {
		return fmt.Errorf("benchmark: invalid reduce op")
	}
	if s.Reduce == collective.Adasum {
		// Its results are not element-wise, so the check after the runs
		// (workload.verify) cannot compute them.
		return fmt.Errorf("benchmark: the adasum op is not benchmarked (sum, average, min, max or product)")
	}
	if len(s.Sizes) == 0 {
		return fmt.Errorf("benchmark: no sizes")
	}
	for _, b := range s.Sizes {
		if b < 0 {
			return fmt.Errorf("benchmark: negative size %d", b)
		}
	}
	if s.Iters < 1 || s.Warmup < 0 {
		return fmt.Errorf("benchmark: need at least one iteration and no negative warm-up")
	}
	return nil
}

// Result is one measured size. Bytes follows nccl-tests: the buffer for
// allreduce, broadcast and replicate, the whole gathered buffer for
// allgather, the whole input for reducescatter and alltoall.
type Result struct {
	Op      string  `json:"op"`
	NP      int     `json:"np"`
	Bytes   int     `json:"bytes"`
	Count   int     `json:"count"`
	DType   string  `json:"dtype"`
	Reduce  string  `json:"redop,omitempty"`
	TimeUS  float64 `json:"time_us"`
	AlgBW   float64 `json:"algbw_gbps"`
	BusBW   float64 `json:"busbw_gbps"`
	Correct bool    `json:"correct"`
	Iters   int     `json:"iters"`
	Batch   int     `json:"batch"`
	// Algorithm is what ran an allreduce or allgather (OpInfo.Algorithm).
	Algorithm string `json:"algorithm,omitempty"`
	// ChunkBytes is the pipelining unit the communicator ran with
	// (Communicator.ChunkBytes): the one configured, or the one it chose.
	ChunkBytes int `json:"chunk_bytes"`
	// PhasesUS is, when the worker traced its phases (PhaseTimes), the mean
	// time of each phase per collective of this size on the reporting rank,
	// warm-up included, in microseconds ("total": the whole collective).
	PhasesUS map[string]float64 `json:"phases_us,omitempty"`
}

// busFactor converts algorithm bandwidth to bus bandwidth (nccl-tests), the
// share of the data every link must carry, comparable across world sizes.
func busFactor(op string, p int) float64 {
	switch op {
	case "allreduce":
		return 2 * float64(p-1) / float64(p)
	case "broadcast", "replicate":
		return 1
	}
	return float64(p-1) / float64(p)
}

// Sizes returns min, min·factor, … up to max.
func Sizes(min, max, factor int) []int {
	if factor < 2 {
		factor = 2
	}
	var s []int
	for b := min; b <= max && b >= 0; b *= factor {
		s = append(s, b)
		if b == 0 {
			break
		}
	}
	return s
}

// ParseSize reads "4096", "4K", "64M", "1G" (binary multiples).
func ParseSize(s string) (int, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := 1
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q (want a number with an optional K, M or G)", s)
	}
	return n * mult, nil
}

// Run measures spec on c and hands every size's result to emit (on every rank;
// results are identical across ranks).
func Run(ctx context.Context, c *collective.Communicator, spec Spec, emit func(Result) error) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	for _, size := range spec.Sizes {
		r, err := measure(ctx, c, spec, size)
		if err != nil {
			return fmt.Errorf("%s of %d bytes: %w", spec.Op, size, err)
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return nil
}

func measure(ctx context.Context, c *collective.Communicator, spec Spec, size int) (Result, error) {
	p := c.Size()
	w := newWorkload(spec, size, p, c.Rank())
	res := Result{Op: spec.Op, NP: p, Bytes: w.bytes, Count: w.count, DType: spec.DType.String(), Iters: spec.Iters,
		ChunkBytes: c.ChunkBytes()}
	if spec.Op == "allreduce" || spec.Op == "reducescatter" {
		res.Reduce = spec.Reduce.String()
	}
	switch spec.Op {
	case "allreduce":
		res.Algorithm = c.AllreduceAlgorithm(spec.DType, w.count)
	case "allgather":
		res.Algorithm = c.AllgatherAlgorithm()
	}
	run := func() error { return w.run(ctx, c) }
	// Warm up, then size the batch so one sample lasts about BatchTime.
	// Every rank must run the same batch, sized by the slowest rank's warm
	// run: a rank that takes no part in the transfer (a holder that feeds
	// no stripe of a replicate) returns at once, and a batch sized by its
	// time would run the collective a thousand times per sample.
	var warm time.Duration
	for i := 0; i < max(1, spec.Warmup); i++ {
		t0 := time.Now()
		if err := run(); err != nil {
			return res, err
		}
		warm = time.Since(t0)
	}
	slowest := []int64{int64(warm)}
	if err := collective.Allreduce(ctx, c, slowest, slowest, collective.Max); err != nil {
		return res, err
	}
	warm = time.Duration(slowest[0])
	batch := 1
	if spec.BatchTime > 0 && warm > 0 && warm < spec.BatchTime {
		batch = int(min(1000, spec.BatchTime/warm+1))
	}
	res.Batch = batch
	samples := make([]float64, spec.Iters)
	for i := range samples {
		if err := c.Barrier(ctx); err != nil {
			return res, err
		}
		t0 := time.Now()
		for range batch {
			if err := run(); err != nil {
				return res, err
			}
		}
		samples[i] = time.Since(t0).Seconds() / float64(batch)
	}
	// A sample lasts as long as its slowest rank.
	if err := collective.Allreduce(ctx, c, samples, samples, collective.Max); err != nil {
		return res, err
	}
	ok := int32(0)
	if w.verify() {
		ok = 1
	}
	all := []int32{ok}
	if err := collective.Allreduce(ctx, c, all, all, collective.Min); err != nil {
		return res, err
	}
	res.Correct = all[0] == 1
	slices.Sort(samples)
	med := samples[len(samples)/2]
	if len(samples)%2 == 0 {
		med = (samples[len(samples)/2-1] + samples[len(samples)/2]) / 2
	}
	res.TimeUS = med * 1e6
	if med > 0 {
		res.AlgBW = float64(w.bytes) / med / 1e9
		res.BusBW = res.AlgBW * busFactor(spec.Op, p)
	}
	if math.IsInf(res.AlgBW, 0) {
		res.AlgBW, res.BusBW = 0, 0
	}
	return res, nil
}
