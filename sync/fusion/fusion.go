package fusion

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"

	"github.com/gorovod/gorovod/collective"
)

// DefaultBytes is Horovod's fusion buffer size: tensors are packed into
// buckets of up to this many bytes, one allreduce each.
const DefaultBytes = 128 << 20

// Fuser allreduces many float32 tensors as few collectives: it packs them, in
// order, into buckets of at most ThresholdBytes (a tensor larger than that
// travels alone, in place) and unpacks the results. A model with hundreds of
// small layers then costs a handful of allreduces instead of hundreds of
// round trips.
//
// A Fuser is used by one goroutine at a time; its buffer is reused between calls.
type Fuser struct {
	threshold int // elements
	buf       []float32
}

// NewFuser returns a fuser with buckets of at most thresholdBytes (<= 0 means
// DefaultBytes).
func NewFuser(thresholdBytes int) *Fuser {
	if thresholdBytes <= 0 {
		thresholdBytes = DefaultBytes
	}
	return &Fuser{threshold: max(1, thresholdBytes/4)}
}

// Allreduce reduces every tensor across the ranks of c with op (and opts), in
// place. Every rank must pass tensors of the same sizes in the same order.
func (f *Fuser) Allreduce(ctx context.Context, c *collective.Communicator, tensors [][]float32, op collective.ReduceOp, opts ...collective.Option) error {
	for start := 0; start < len(tensors); {
		if n := len(tensors[start]); n >= f.threshold {
			if err := collective.Allreduce(ctx, c, tensors[start], tensors[start], op, opts...); err != nil {
				return err
			}
			start++
			continue
		}
		end, total := start, 0
		for end < len(tensors) && total+len(tensors[end]) <= f.threshold {
			total += len(tensors[end])
			end++
		}
		if err := f.bucket(ctx, c, tensors[start:end], total, op, opts); err != nil {
			return err
		}
		start = end
	}
	return nil
}

func (f *Fuser) bucket(ctx context.Context, c *collective.Communicator, tensors [][]float32, total int, op collective.ReduceOp, opts []collective.Option) error {
	if len(tensors) == 1 {
		return collective.Allreduce(ctx, c, tensors[0], tensors[0], op, opts...)
	}
	if cap(f.buf) < total {
		f.buf = make([]float32, total)
	}
	buf := f.buf[:total]
	off := 0
	for _, t := range tensors {
		off += copy(buf[off:], t)
	}
	if err := collective.Allreduce(ctx, c, buf, buf, op, opts...); err != nil {
		return err
	}
	off = 0
	for _, t := range tensors {
		off += copy(t, buf[off:])
	}
	return nil
}

// ErrQueueClosed is returned for work submitted to an AsyncReducer after Close.
var ErrQueueClosed = errors.New("fusion: async reducer closed")

// AsyncReducer lets a trainer hand gradients over as soon as each is computed
// (during the backward pass) and wait for all of them at the end of the step:
// submissions run in order on one background goroutine, so the communication
// of early layers overlaps the computation of later ones.
type AsyncReducer struct {
	comm  *collective.Communicator
	fuser *Fuser
	op    collective.ReduceOp
	opts  []collective.Option
	work  chan *Pending
	done  chan struct{}
	once  stdsync.Once
}

// Pending is one submitted group of tensors.
type Pending struct {
	ctx     context.Context
	tensors [][]float32
	err     error
	ready   chan struct{}
}

// Wait returns once the tensors are reduced (or the context ends) and reports
// the group's error.
func (p *Pending) Wait(ctx context.Context) error {
	select {
	case <-p.ready:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewAsyncReducer starts the background goroutine for c. Close stops it.
func NewAsyncReducer(c *collective.Communicator, fusionBytes int, op collective.ReduceOp, opts ...collective.Option) *AsyncReducer {
	a := &AsyncReducer{
		comm: c, fuser: NewFuser(fusionBytes), op: op, opts: opts,
		work: make(chan *Pending, 1024), done: make(chan struct{}),
	}
	go a.loop()
	return a
}

// Submit queues tensors for an in-place allreduce; their memory must not be
// touched until the returned Pending is done. Every rank must submit the same
// sizes in the same order.
func (a *AsyncReducer) Submit(ctx context.Context, tensors ...[]float32) *Pending {
	p := &Pending{ctx: ctx, tensors: tensors, ready: make(chan struct{})}
	select {
	case <-a.done:
		p.err = ErrQueueClosed
		close(p.ready)
		return p
	default:
	}
	select {
	case a.work <- p:
	case <-a.done:
		p.err = ErrQueueClosed
		close(p.ready)
	case <-ctx.Done():
		p.err = ctx.Err()
		close(p.ready)
	}
	return p
}

func (a *AsyncReducer) loop() {
	var failed error
	for {
		select {
		case p := <-a.work:
			if failed != nil {
				// The collectives after a failure cannot run on a spent
				// communicator: fail the rest of the queue with the cause.
				p.err = fmt.Errorf("fusion: an earlier submission failed: %w", failed)
			} else if p.err = a.fuser.Allreduce(p.ctx, a.comm, p.tensors, a.op, a.opts...); p.err != nil {
				failed = p.err
			}
			close(p.ready)
		case <-a.done:
			return
		}
	}
}

// Close stops the background goroutine. Submissions still queued fail with
// ErrQueueClosed; one already running finishes first.
func (a *AsyncReducer) Close() {
	a.once.Do(func() { close(a.done) })
	for {
		select {
		case p := <-a.work:
			p.err = ErrQueueClosed
			close(p.ready)
		default:
			return
		}
	}
}
