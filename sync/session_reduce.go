// The Session's gradient allreduces: the Reduction they apply, Allreduce and
// AllreduceAsync with WaitAll, the one path both take (reduceGradients), and
// what a failed one does to the world (failed).

package sync

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/fusion"
)

// Reduction says how a gradient allreduce combines the workers' tensors. The
// zero value averages (Horovod's default).
type Reduction struct {
	// Op combines the workers' elements; zero means collective.Average.
	Op collective.ReduceOp
	// Prescale multiplies each worker's tensors before they are combined, and
	// Postscale the result (Horovod's prescale_factor and postscale_factor;
	// with Average the division by the world size comes on top). Zero means 1.
	Prescale, Postscale float64
}

// Sum returns the Reduction that adds the workers' tensors.
func Sum() Reduction { return Reduction{Op: collective.Sum} }

// check refuses an invalid reduction and returns it with the defaults filled
// in.
func (r Reduction) check() (Reduction, error) {
	if r.Op == 0 {
		r.Op = collective.Average
	}
	if !r.Op.Valid() {
		return r, fmt.Errorf("sync: invalid reduce op %v", r.Op)
	}
	for _, f := range []*float64{&r.Prescale, &r.Postscale} {
		switch {
		case *f == 0:
			*f = 1
		case math.IsNaN(*f) || math.IsInf(*f, 0):
			return r, fmt.Errorf("sync: scale factor %v is not finite", *f)
		}
	}
	return r, nil
}

// Allreduce reduces the gradient tensors in place across the current world:
// any dtype, host or device memory, fused into few collectives (see
// fusion.Fuser). Every worker must pass the same dtypes and sizes in the same
// order. If the world breaks meanwhile, the session rebuilds it,
// re-synchronizes the state from the new rank 0 and returns ErrWorldChanged;
// if the world it recovers into leaves this worker out (the proposer dropped
// it as unreachable: a starved or paused process), it returns an error
// wrapping ErrExcluded, which a trainer answers as Train does: Worker.Rejoin,
// unless the worker is leaving or out for good. Malformed tensors (see fusion.Check) or an invalid reduction are refused
// with an error before anything is sent; the world is untouched.
func (s *Session) Allreduce(ctx context.Context, how Reduction, tensors ...collective.Buffer) error {
	how, err := how.check()
	if err != nil {
		return err
	}
	began := time.Now()
	defer s.clock.Wait(began)
	bytes := s.obs.gradients(tensors)
	newest := s.tagEpoch()
	err = reduceGradients(ctx, s.fuser, s.comm, tensors, how, &newest, s.noise)
	if s.obs.tl != nil {
		s.obs.reduced("allreduce gradients", began, time.Now(), len(tensors), bytes, err)
	}
	if err == nil {
		s.clock.AddBytes(bytes)
		if len(tensors) > 0 {
			if newest > s.epoch.Number && s.newest <= s.epoch.Number {
				// For the transition's breakdown: when each member learnt,
				// from this step's gradients, that it moves at its end.
				s.carriedAt = time.Now()
				s.log.Debug("a gradient allreduce carried a newer epoch", "epoch", s.epoch.Number, "newest", newest, "known", s.src.Latest(), "took", s.carriedAt.Sub(began))
			}
			s.newest, s.tagged = max(s.newest, newest), true
		}
		return nil
	}
	return s.failed(ctx, s.comm, err)
}

// reduceGradients is the one place every gradient allreduce goes through, the
// synchronous one and AllreduceAsync's. Besides the gradients it carries the
// highest world epoch any member knows of (newest, in the frames' tags) and,
// when noise is measured, the gradient noise side-car (gns.go): each
// worker's squared norm before the reduction and rank 0's batch decision,
// in one of the gradients' own buckets — no extra collective.
func reduceGradients(ctx context.Context, f *fusion.Fuser, comm *collective.Communicator, tensors []collective.Buffer, how Reduction, newest *uint64, noise *gradNoise) error {
	opts := [3]collective.Option{collective.MaxTag(newest)} // on the stack: this runs every step
	n := 1
	if how.Prescale != 1 {
		opts[n], n = collective.Prescale(how.Prescale), n+1
	}
	if how.Postscale != 1 {
		opts[n], n = collective.Postscale(how.Postscale), n+1
	}
	if noise == nil {
		return f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...)
	}
	var x [numExtras]float64
	if !noise.before(tensors, how, comm.Rank(), comm.Size(), &x) {
		noise.uncarried(tensors)
		return f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...)
	}
	if comm.Size() == 1 {
		// Alone, the side-car would come back as it went (only scaled,
		// which after undoes): it stays here, and the gradients are reduced
		// in place instead of being packed into a bucket with it.
		if err := f.Allreduce(ctx, comm, tensors, how.Op, opts[:n]...); err != nil {
			return err
		}
		noise.afterAlone(tensors, &x)
		return nil
	}
	carried, err := f.AllreduceExtra(ctx, comm, tensors, x[:], how.Op, opts[:n]...)
	switch {
	case err != nil:
		return err
	case carried:
		noise.after(tensors, how, comm.Size(), &x)
	default:
		noise.uncarried(tensors)
	}
	return nil
}

// failed handles an error of a gradient allreduce on comm. An error that left
// the communicator working (the context ended before anything was sent, a
// device refused a copy before the collective) is returned as it is: the
// world is intact. Workers that called different collectives (a
// MismatchError) get that error: rebuilding the world cannot repair it, and
// the others see this worker leave. Any other failure broke the world: it is
// rebuilt and ErrWorldChanged returned.
func (s *Session) failed(ctx context.Context, comm *collective.Communicator, err error) error {
	if comm.Err() == nil {
		return err
	}
	s.tagged, s.carriedAt = false, time.Time{}
	var mismatch *collective.MismatchError
	if errors.As(err, &mismatch) {
		return fmt.Errorf("sync: the workers' tensors differ: %w", err)
	}
	if ctx.Err() != nil {
		return err
	}
	if rerr := s.recover(ctx, err); rerr != nil {
		return rerr
	}
	return worldChanged(err)
}

// Barrier returns once every member of the world has called it. A world
// that breaks meanwhile is rebuilt as for Allreduce: ErrWorldChanged, or an
// error wrapping ErrExcluded when the new world leaves this worker out.
func (s *Session) Barrier(ctx context.Context) error {
	if err := s.comm.Barrier(ctx); err != nil {
		return s.failed(ctx, s.comm, err)
	}
	return nil
}

// Handle is a gradient allreduce started with AllreduceAsync.
type Handle struct {
	done chan struct{}
	err  error
}

// AllreduceAsync starts reducing tensors in place and returns at once, so a
// trainer can hand over each layer's gradients as the backward pass produces
// them and overlap their communication with the rest of the computation.
// Allreduces run one at a time in the order they were started, on every rank
// in the same order. WaitAll collects them before the step is applied; until
// then the tensors' memory must not be touched. Malformed tensors and invalid
// reductions fail the handle before anything is sent; later handles still run.
func (s *Session) AllreduceAsync(ctx context.Context, how Reduction, tensors ...collective.Buffer) *Handle {
	p := &Handle{done: make(chan struct{})}
	how, err := how.check()
	if err != nil {
		p.err = err
		close(p.done)
		return p
	}
	prev := s.lastAsync
	s.lastAsync = p
	comm := s.comm
	bytes := s.obs.gradients(tensors)
	s.clock.AddBytes(bytes) // a failure restarts the step's account
	tl, queued := s.obs.tl, time.Time{}
	if tl != nil {
		queued = time.Now()
	}
	go func() {
		defer close(p.done)
		if prev != nil {
			<-prev.done
			if prev.err != nil && comm.Err() != nil {
				p.err = prev.err // a spent world: the later ones cannot run either
				return
			}
		}
		newest := s.tagEpoch()
		var began time.Time
		if tl != nil {
			began = time.Now()
			tl.Complete(timeline.TrackTraining, "queued", "gradients", queued, began, timeline.Int("tensors", int64(len(tensors))))
		}
		p.err = reduceGradients(ctx, s.asyncFuser, comm, tensors, how, &newest, s.noise)
		if tl != nil {
			s.obs.reduced("allreduce gradients (async)", began, time.Now(), len(tensors), bytes, p.err)
		}
		if p.err == nil && len(tensors) > 0 {
			s.mu.Lock()
			s.asyncNewest = max(s.asyncNewest, newest)
			s.asyncTagged = true
			s.mu.Unlock()
		}
	}()
	return p
}

// WaitAll waits for allreduces started with AllreduceAsync. If any failed
// because the world broke, the session rebuilds the world as Allreduce does
// and returns ErrWorldChanged: recompute the step. A handle refused for bad
// input returns that error, the world untouched.
func (s *Session) WaitAll(ctx context.Context, pending ...*Handle) error {
	defer s.clock.Wait(time.Now())
	var failed error
	for _, p := range pending {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.err != nil && failed == nil {
			failed = p.err
		}
	}
	if s.lastAsync != nil && pendingIn(s.lastAsync, pending) {
		s.lastAsync = nil
	}
	if failed == nil {
		s.mu.Lock()
		if s.asyncTagged {
			s.newest, s.tagged = max(s.newest, s.asyncNewest), true
		}
		s.asyncNewest, s.asyncTagged = 0, false
		s.mu.Unlock()
		return nil
	}
	return s.failed(ctx, s.comm, failed)
}

func pendingIn(p *Handle, list []*Handle) bool {
	for _, q := range list {
		if q == p {
			return true
		}
	}
	return false
}
