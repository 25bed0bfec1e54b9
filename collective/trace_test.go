package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingTracer keeps what a communicator tells it, as lines.
type recordingTracer struct {
	mu    sync.Mutex
	lines []string
	ops   []OpInfo
}

func (r *recordingTracer) add(s string) {
	r.mu.Lock()
	r.lines = append(r.lines, s)
	r.mu.Unlock()
}

func (r *recordingTracer) CollectiveStart(op OpInfo, at time.Time) {
	r.add(fmt.Sprintf("start %s #%d", op.Collective, op.Seq))
}

func (r *recordingTracer) CollectivePhase(op OpInfo, ph PhaseInfo) {
	s := fmt.Sprintf("phase %s #%d %s", op.Collective, op.Seq, ph.Phase)
	if ph.End.Before(ph.Start) || ph.Start.IsZero() {
		s += " BAD TIMES"
	}
	r.add(s)
}

func (r *recordingTracer) CollectiveEnd(op OpInfo, start, end time.Time, err error) {
	s := fmt.Sprintf("end %s #%d", op.Collective, op.Seq)
	if err != nil {
		s += " failed"
	}
	if end.Before(start) {
		s += " BAD TIMES"
	}
	r.add(s)
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

func TestTracerSeesEveryCollective(t *testing.T) {
	const p = 4
	tracers := make([]*recordingTracer, p)
	cfg := DefaultConfig()
	cfg.SmallMessageBytes, cfg.ChunkBytes = 1<<10, 1<<10
	w := newWorld(t, inprocMesh, p, cfg)
	for r := range w {
		// Tracers are configured per communicator; the harness builds them
		// with one Config, so set them after.
		tracers[r] = &recordingTracer{}
		w[r].tracer = tracers[r]
	}
	noErrors(t, onAll(t, w, 30*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		big := make([]float32, 1024) // 4 KiB: ring
		if err := Allreduce(ctx, c, big, big, Sum); err != nil {
			return err
		}
		small := make([]int32, 4) // recursive doubling
		if err := Allreduce(ctx, c, small, small, Max); err != nil {
			return err
		}
		out := make([]float32, 256)
		if err := ReduceScatter(ctx, c, big, out, Sum); err != nil {
			return err
		}
		if err := Allgather(ctx, c, out, big); err != nil {
			return err
		}
		if err := Broadcast(ctx, c, big, 3); err != nil {
			return err
		}
		a2a := make([]uint8, 4*p)
		if err := Alltoall(ctx, c, a2a, make([]uint8, 4*p)); err != nil {
			return err
		}
		_ = r
		return c.Barrier(ctx)
	}))
	for r, tr := range tracers {
		want := []string{
			"start allreduce #1", "phase allreduce #1 reduce-scatter", "phase allreduce #1 allgather", "end allreduce #1",
			"start allreduce #2", "end allreduce #2",
			"start reducescatter #3", "phase reducescatter #3 reduce-scatter", "end reducescatter #3",
			"start allgather #4", "end allgather #4",
			"start broadcast #5", "end broadcast #5",
			"start alltoall #6", "end alltoall #6",
			"start barrier #7", "end barrier #7",
		}
		if got := strings.Join(tr.lines, "\n"); got != strings.Join(want, "\n") {
			t.Errorf("rank %d saw:\n%s\nwant:\n%s", r, got, strings.Join(want, "\n"))
		}
		wantOps := []OpInfo{
			{Collective: "allreduce", Algorithm: "ring", DType: Float32, Op: Sum, Count: 1024, Bytes: 4096},
			{Collective: "allreduce", Algorithm: "recursive-doubling", DType: Int32, Op: Max, Count: 4, Bytes: 16},
			{Collective: "reducescatter", Algorithm: "ring", DType: Float32, Op: Sum, Count: 1024, Bytes: 4096},
			{Collective: "allgather", Algorithm: "ring", DType: Float32, Count: 1024, Bytes: 4096},
			{Collective: "broadcast", Algorithm: "chain", DType: Float32, Count: 1024, Bytes: 4096, Root: 3},
			{Collective: "alltoall", Algorithm: "pairwise", DType: Uint8, Bytes: 4 * p},
			{Collective: "barrier", Algorithm: "dissemination"},
		}
		for i, op := range tr.ops {
			want := wantOps[i]
			want.Epoch, want.Rank, want.Size, want.Seq = 1, r, p, uint64(i+1)
			if op != want {
				t.Errorf("rank %d op %d: %+v, want %+v", r, i, op, want)
			}
		}
	}
}

func TestTracerSeesFailure(t *testing.T) {
	w := newWorld(t, inprocMesh, 2, DefaultConfig())
	tr := &recordingTracer{}
	w[0].tracer = tr
	w[1].Close() // rank 1 is gone
	buf := make([]float32, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Allreduce(ctx, w[0], buf, buf, Sum); err == nil {
		t.Fatal("allreduce with a closed peer succeeded")
	}
	if got := strings.Join(tr.lines, "; "); got != "start allreduce #1; end allreduce #1 failed" {
		t.Fatalf("tracer saw %q", got)
	}
}

// TestProgressNamesThePeerWaitedFor: the collective-level half of the stall
// inspector. Rank 1 has not entered the allreduce that ranks 0 and 2 are in;
// Progress says which collective each is in and whom it waits for.
func TestProgressNamesThePeerWaitedFor(t *testing.T) {
	const p = 3
	w := newWorld(t, inprocMesh, p, DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r, c := range w {
		if pr := c.Progress(); pr.InFlight || pr.Started != 0 || pr.WaitingOn != -1 || pr.Rank != r || pr.Size != p || pr.Epoch != 1 {
			t.Fatalf("rank %d before any collective: %+v", r, pr)
		}
	}
	bufs := make([][]float32, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for _, r := range []int{0, 2} {
		bufs[r] = make([]float32, 8)
		wg.Go(func() { errs[r] = Allreduce(ctx, w[r], bufs[r], bufs[r], Sum) })
	}
	// Recursive doubling with p=3: rank 0 sends to rank 1 and waits for the
	// result from it; rank 2 exchanges with rank 1. Both end up waiting for
	// rank 1.
	for _, r := range []int{0, 2} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			pr := w[r].Progress()
			if pr.InFlight && pr.WaitingOn == 1 {
				if pr.Started != 1 || pr.Op.Seq != 1 || pr.Op.Collective != "allreduce" || pr.Op.Bytes != 32 || pr.Failed != nil {
					t.Fatalf("rank %d: %+v", r, pr)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d never showed waiting for rank 1: %+v", r, pr)
			}
			time.Sleep(time.Millisecond) // polling, as a stall inspector does
		}
	}
	if pr := w[1].Progress(); pr.InFlight || pr.Started != 0 {
		t.Fatalf("rank 1, which has not entered: %+v", pr)
	}
	bufs[1] = make([]float32, 8)
	errs[1] = Allreduce(ctx, w[1], bufs[1], bufs[1], Sum)
	wg.Wait()
	noErrors(t, errs)
	for r, c := range w {
		if pr := c.Progress(); pr.InFlight || pr.Started != 1 || pr.WaitingOn != -1 {
			t.Fatalf("rank %d after the allreduce: %+v", r, pr)
		}
	}
	w[0].Abort(errors.New("test"))
	if pr := w[0].Progress(); !errors.Is(pr.Failed, ErrAborted) {
		t.Fatalf("Progress after Abort: %+v", pr)
	}
}
