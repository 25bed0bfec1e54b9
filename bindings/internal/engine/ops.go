package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// The collectives. Each checks its arguments, queues the call and returns
// its handle; buffers must stay valid and untouched until the handle
// completes. Every rank must submit the same calls with the same dtypes and
// sizes, in the same order where they have no name (Name: see
// negotiate.go). The ...On forms take CallOptions.

// Allreduce reduces each recv[i] in place across the world, after copying
// send[i] into it when they are different memory (send may be nil: in
// place). Several tensors are fused into few collectives (one per dtype) and
// carry the world's newest epoch, as a gradient allreduce does.
func (e *Engine) Allreduce(send, recv []collective.Buffer, how gsync.Reduction) (Handle, error) {
	return e.AllreduceOn(0, send, recv, how)
}

// AllreduceOn is Allreduce among the members of process set set (0: the
// world); Average divides by the set's size.
func (e *Engine) AllreduceOn(set int32, send, recv []collective.Buffer, how gsync.Reduction) (Handle, error) {
	return e.AllreduceShapedOn(set, send, recv, nil, how)
}

// AllreduceShapedOn is AllreduceOn of tensors whose shapes every rank
// compares too (shapes[i] is recv[i]'s; nil: each one dimension of its
// element count): ranks whose tensors hold as many elements in other shapes
// all fail the call with a *collective.MismatchError, as Horovod refuses
// them, and the world stays usable.
func (e *Engine) AllreduceShapedOn(set int32, send, recv []collective.Buffer, shapes [][]int64, how gsync.Reduction, opts ...CallOption) (Handle, error) {
	c, _, err := e.allreduceCall(set, send, recv, shapes, how)
	if err != nil {
		return 0, err
	}
	return e.submit(c.with(opts))
}

// AllreduceNow is Allreduce for a caller that waits for it at once: a small
// allreduce submitted while nothing else is queued or running runs on the
// caller's goroutine before AllreduceNow returns, which then returns handle
// 0 and the allreduce's result; otherwise it returns as Allreduce does (see
// Engine.now); caller says how it may run there.
func (e *Engine) AllreduceNow(send, recv []collective.Buffer, how gsync.Reduction, caller Caller) (Handle, error) {
	return e.AllreduceNowOn(0, send, recv, how, caller)
}

// AllreduceNowOn is AllreduceNow on process set set.
func (e *Engine) AllreduceNowOn(set int32, send, recv []collective.Buffer, how gsync.Reduction, caller Caller) (Handle, error) {
	return e.AllreduceShapedNowOn(set, send, recv, nil, how, caller)
}

// AllreduceShapedNowOn is AllreduceNowOn of shaped tensors, as
// AllreduceShapedOn.
func (e *Engine) AllreduceShapedNowOn(set int32, send, recv []collective.Buffer, shapes [][]int64, how gsync.Reduction, caller Caller, opts ...CallOption) (Handle, error) {
	c, bytes, err := e.allreduceCall(set, send, recv, shapes, how)
	if err != nil {
		return 0, err
	}
	return e.now(c.with(opts), bytes, caller)
}

// allreduceCall checks an allreduce and returns the call and its bytes.
func (e *Engine) allreduceCall(set int32, send, recv []collective.Buffer, shapes [][]int64, how gsync.Reduction) (*call, int, error) {
	how, err := checkReduce(how)
	if err != nil {
		return nil, 0, err
	}
	if err := checkBuffers("allreduce", recv...); err != nil {
		return nil, 0, err
	}
	if err := checkShapes("allreduce", recv, shapes); err != nil {
		return nil, 0, err
	}
	if how.Op == collective.Adasum {
		for i, b := range recv {
			if !b.DType.IsFloat() {
				return nil, 0, fmt.Errorf("%w: allreduce tensor %d: Adasum combines floating-point tensors, not %v", ErrInvalid, i, b.DType)
			}
		}
	}
	if send != nil {
		if len(send) != len(recv) {
			return nil, 0, fmt.Errorf("%w: allreduce of %d tensors into %d", ErrInvalid, len(send), len(recv))
		}
		if err := checkBuffers("allreduce", send...); err != nil {
			return nil, 0, err
		}
		for i := range send {
			if send[i].DType != recv[i].DType || send[i].Count != recv[i].Count {
				return nil, 0, fmt.Errorf("%w: allreduce tensor %d: %d %v elements into %d %v", ErrInvalid, i, send[i].Count, send[i].DType, recv[i].Count, recv[i].DType)
			}
			if (send[i].Device == nil) != (recv[i].Device == nil) {
				return nil, 0, fmt.Errorf("%w: allreduce tensor %d: one of send and receive is device memory, the other host memory", ErrInvalid, i)
			}
		}
	}
	if set != 0 {
		if _, _, err := e.member("allreduce", set); err != nil {
			return nil, 0, err
		}
	}
	// copyIn copies the send buffers into the receive buffers; a device
	// that fails the copy breaks the world, since the other ranks are about
	// to run the allreduce with this one.
	copyIn := func(ctx context.Context, s *gsync.Session) error {
		for i := range send {
			switch {
			case send[i].Device != nil:
				if send[i].Device != recv[i].Device && send[i].Count > 0 {
					if err := recv[i].Device.CopyFrom(ctx, 0, send[i].Device, 0, send[i].Bytes()); err != nil {
						err = fmt.Errorf("gorovod: allreduce tensor %d: copying the input on the device: %w", i, err)
						if comm := s.Communicator(); comm != nil && ctx.Err() == nil {
							comm.Abort(err)
						}
						return err
					}
				}
			case len(send[i].Host) > 0 && &send[i].Host[0] != &recv[i].Host[0]:
				copy(recv[i].Host, send[i].Host)
			}
		}
		return nil
	}
	run := func(ctx context.Context, s *gsync.Session) error {
		if err := copyIn(ctx, s); err != nil {
			return err
		}
		err := s.Allreduce(ctx, how, recv...)
		if errors.Is(err, collective.ErrNotPowerOfTwo) {
			// Refused before anything was sent, on every rank alike.
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return err
	}
	if set != 0 {
		// A set's allreduce is no gradient allreduce of the world: it
		// carries no epoch news and goes through a fuser of the engine's.
		opts := []collective.Option{collective.Prescale(how.Prescale), collective.Postscale(how.Postscale)}
		run = func(ctx context.Context, s *gsync.Session) error {
			if err := copyIn(ctx, s); err != nil {
				return err
			}
			err := e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
				return e.setFuser.Allreduce(ctx, c, recv, how.Op, opts...)
			})
			if errors.Is(err, collective.ErrNotPowerOfTwo) {
				err = fmt.Errorf("%w: %w", ErrInvalid, err)
			}
			return err
		}
	}
	return &call{what: "allreduce", set: set, desc: describeShaped(kindAllreduce, recv, shapes, nil, &how, 0), layout: layoutOf(recv), run: run}, bufferBytes(recv), nil
}

// checkShapes refuses shapes (when not nil) that are not one per buffer,
// each of non-negative dimensions whose product is its buffer's count.
func checkShapes(what string, bufs []collective.Buffer, shapes [][]int64) error {
	if shapes == nil {
		return nil
	}
	if len(shapes) != len(bufs) {
		return fmt.Errorf("%w: %s of %d tensors with %d shapes", ErrInvalid, what, len(bufs), len(shapes))
	}
	for i, shape := range shapes {
		n := int64(1)
		for _, d := range shape {
			if d < 0 || (d > 0 && n > math.MaxInt64/d) {
				return fmt.Errorf("%w: %s tensor %d: shape %v has a negative dimension or overflows", ErrInvalid, what, i, shape)
			}
			n *= d
		}
		if n != int64(bufs[i].Count) {
			return fmt.Errorf("%w: %s tensor %d: shape %v holds %d elements, not %d", ErrInvalid, what, i, shape, n, bufs[i].Count)
		}
	}
	return nil
}

func bufferBytes(bufs []collective.Buffer) int {
	n := 0
	for _, b := range bufs {
		n += b.Bytes()
	}
	return n
}

// Broadcast copies root's bufs into every other rank's, in place.
func (e *Engine) Broadcast(bufs []collective.Buffer, root int) (Handle, error) {
	return e.BroadcastOn(0, bufs, root)
}

// BroadcastOn is Broadcast among the members of process set set (0: the
// world); root is a world rank, a member of the set.
func (e *Engine) BroadcastOn(set int32, bufs []collective.Buffer, root int, opts ...CallOption) (Handle, error) {
	c, _, err := e.broadcastCall(set, bufs, root)
	if err != nil {
		return 0, err
	}
	return e.submit(c.with(opts))
}

// BroadcastNow is Broadcast for a caller that waits for it at once, as
// AllreduceNow is Allreduce's.
func (e *Engine) BroadcastNow(bufs []collective.Buffer, root int, caller Caller) (Handle, error) {
	return e.BroadcastNowOn(0, bufs, root, caller)
}

// BroadcastNowOn is BroadcastNow on process set set.
func (e *Engine) BroadcastNowOn(set int32, bufs []collective.Buffer, root int, caller Caller, opts ...CallOption) (Handle, error) {
	c, bytes, err := e.broadcastCall(set, bufs, root)
	if err != nil {
		return 0, err
	}
	return e.now(c.with(opts), bytes, caller)
}

func (e *Engine) broadcastCall(set int32, bufs []collective.Buffer, root int) (*call, int, error) {
	if err := checkBuffers("broadcast", bufs...); err != nil {
		return nil, 0, err
	}
	ranks, _, err := e.member("broadcast", set)
	if err != nil {
		return nil, 0, err
	}
	at, err := setRoot(set, ranks, root)
	if err != nil {
		return nil, 0, err
	}
	return &call{what: "broadcast", set: set, desc: describe(kindBroadcast, bufs, nil, nil, root), run: func(ctx context.Context, s *gsync.Session) error {
		return e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
			for _, b := range bufs {
				if err := c.Broadcast(ctx, b, at); err != nil {
					return err
				}
			}
			return nil
		})
	}}, bufferBytes(bufs), nil
}

// Allgather concatenates every rank's send, in rank order, into recv:
// counts[r] elements from rank r (every rank passes the same counts).
func (e *Engine) Allgather(send, recv collective.Buffer, counts []int) (Handle, error) {
	return e.AllgatherOn(0, send, recv, counts)
}

// AllgatherOn is Allgather among the members of process set set (0: the
// world): counts has an entry per member, in rank order.
func (e *Engine) AllgatherOn(set int32, send, recv collective.Buffer, counts []int, opts ...CallOption) (Handle, error) {
	if err := checkBuffers("allgather", send, recv); err != nil {
		return 0, err
	}
	ranks, rank, err := e.member("allgather", set)
	if err != nil {
		return 0, err
	}
	total, err := countsIn("allgather", set, len(ranks), counts)
	if err != nil {
		return 0, err
	}
	switch {
	case send.DType != recv.DType:
		return 0, fmt.Errorf("%w: allgather of %v into %v", ErrInvalid, send.DType, recv.DType)
	case counts[rank] != send.Count:
		return 0, fmt.Errorf("%w: allgather: counts[%d] is %d but this rank sends %d elements", ErrInvalid, rank, counts[rank], send.Count)
	case recv.Count != total:
		return 0, fmt.Errorf("%w: allgather of %d elements in all into %d", ErrInvalid, total, recv.Count)
	}
	counts = slices.Clone(counts)
	return e.submit((&call{what: "allgather", set: set, desc: describe(kindAllgather, []collective.Buffer{recv}, counts, nil, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
			return c.AllgatherV(ctx, send, recv, counts)
		})
	}}).with(opts))
}

// Alltoall sends sendCounts[r] elements of send, in rank order, to each
// rank r, and receives recvCounts[r] elements from each into recv.
func (e *Engine) Alltoall(send collective.Buffer, sendCounts []int, recv collective.Buffer, recvCounts []int) (Handle, error) {
	return e.AlltoallOn(0, send, sendCounts, recv, recvCounts)
}

// AlltoallOn is Alltoall among the members of process set set (0: the
// world): the counts have an entry per member, in rank order.
func (e *Engine) AlltoallOn(set int32, send collective.Buffer, sendCounts []int, recv collective.Buffer, recvCounts []int, opts ...CallOption) (Handle, error) {
	if err := checkBuffers("alltoall", send, recv); err != nil {
		return 0, err
	}
	ranks, _, err := e.member("alltoall", set)
	if err != nil {
		return 0, err
	}
	st, err := countsIn("alltoall send", set, len(ranks), sendCounts)
	if err != nil {
		return 0, err
	}
	rt, err := countsIn("alltoall receive", set, len(ranks), recvCounts)
	if err != nil {
		return 0, err
	}
	switch {
	case send.DType != recv.DType:
		return 0, fmt.Errorf("%w: alltoall of %v into %v", ErrInvalid, send.DType, recv.DType)
	case st != send.Count || rt != recv.Count:
		return 0, fmt.Errorf("%w: alltoall: send counts add up to %d (tensor %d), receive counts to %d (tensor %d)", ErrInvalid, st, send.Count, rt, recv.Count)
	}
	sendCounts, recvCounts = slices.Clone(sendCounts), slices.Clone(recvCounts)
	// The ranks' counts differ: only the dtype must agree.
	desc := describe(kindAlltoall, nil, nil, nil, 0)
	desc[fieldDType] = int64(send.DType)
	return e.submit((&call{what: "alltoall", set: set, desc: desc, run: func(ctx context.Context, s *gsync.Session) error {
		return e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
			return c.AlltoallV(ctx, send, sendCounts, recv, recvCounts)
		})
	}}).with(opts))
}

// ReduceScatter reduces send across the world and leaves counts[r]
// elements of the result, in rank order, in rank r's recv.
func (e *Engine) ReduceScatter(send, recv collective.Buffer, counts []int, how gsync.Reduction) (Handle, error) {
	return e.ReduceScatterOn(0, send, recv, counts, how)
}

// ReduceScatterOn is ReduceScatter among the members of process set set
// (0: the world): counts has an entry per member, in rank order.
func (e *Engine) ReduceScatterOn(set int32, send, recv collective.Buffer, counts []int, how gsync.Reduction, opts ...CallOption) (Handle, error) {
	how, err := checkReduce(how)
	if err != nil {
		return 0, err
	}
	if !how.Op.Elementwise() {
		return 0, fmt.Errorf("%w: reducescatter cannot use %v, which combines whole tensors (allreduce only)", ErrInvalid, how.Op)
	}
	if err := checkBuffers("reducescatter", send, recv); err != nil {
		return 0, err
	}
	ranks, rank, err := e.member("reducescatter", set)
	if err != nil {
		return 0, err
	}
	total, err := countsIn("reducescatter", set, len(ranks), counts)
	if err != nil {
		return 0, err
	}
	switch {
	case send.DType != recv.DType:
		return 0, fmt.Errorf("%w: reducescatter of %v into %v", ErrInvalid, send.DType, recv.DType)
	case total != send.Count || counts[rank] != recv.Count:
		return 0, fmt.Errorf("%w: reducescatter: counts add up to %d (tensor %d), this rank's is %d (receive tensor %d)", ErrInvalid, total, send.Count, counts[rank], recv.Count)
	}
	counts = slices.Clone(counts)
	scaling := []collective.Option{collective.Prescale(how.Prescale), collective.Postscale(how.Postscale)}
	return e.submit((&call{what: "reducescatter", set: set, desc: describe(kindReduceScatter, []collective.Buffer{send}, counts, &how, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
			return c.ReduceScatterV(ctx, send, recv, counts, how.Op, scaling...)
		})
	}}).with(opts))
}

// Barrier returns on every rank once every rank has entered it.
func (e *Engine) Barrier() (Handle, error) { return e.BarrierOn(0) }

// BarrierOn is Barrier among the members of process set set (0: the world).
func (e *Engine) BarrierOn(set int32) (Handle, error) {
	c, err := e.barrierCall(set)
	if err != nil {
		return 0, err
	}
	return e.submit(c)
}

// BarrierNow is Barrier for a caller that waits for it at once, as
// AllreduceNow is Allreduce's.
func (e *Engine) BarrierNow(caller Caller) (Handle, error) { return e.BarrierNowOn(0, caller) }

// BarrierNowOn is BarrierNow on process set set.
func (e *Engine) BarrierNowOn(set int32, caller Caller) (Handle, error) {
	c, err := e.barrierCall(set)
	if err != nil {
		return 0, err
	}
	return e.now(c, 0, caller)
}

func (e *Engine) barrierCall(set int32) (*call, error) {
	if set != 0 {
		if _, _, err := e.member("barrier", set); err != nil {
			return nil, err
		}
	}
	return &call{what: "barrier", set: set, desc: describe(kindBarrier, nil, nil, nil, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return e.collectiveOn(ctx, s, set, func(ctx context.Context, c *collective.Communicator) error {
			return c.Barrier(ctx)
		})
	}}, nil
}

// Join waits for every rank to join and writes the rank that joined last
// (by the wall clock of its call) into *last. Until every rank has joined,
// a rank that joined takes part in the others' allreduces with zeros, as
// Horovod's join does, and their other collectives fail on the ranks that
// call them. (With Config.SkipAgreement it serves nothing: every rank must
// have submitted the same collectives before it joins.)
func (e *Engine) Join(last *int32) (Handle, error) {
	if last == nil {
		return 0, fmt.Errorf("%w: join needs somewhere to write the last rank", ErrInvalid)
	}
	at := time.Now().UnixNano()
	if e.agreement {
		return e.submit(&call{what: "join", joins: true, run: func(ctx context.Context, s *gsync.Session) error {
			r, err := joinServe(ctx, s, at)
			if err == nil {
				*last = int32(r)
			}
			return err
		}})
	}
	return e.submit(&call{what: "join", run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			mine := []int64{at}
			all := make([]int64, c.Size())
			if err := collective.Allgather(ctx, c, mine, all); err != nil {
				return err
			}
			latest := 0
			for r, t := range all {
				if t > all[latest] {
					latest = r
				}
			}
			*last = int32(latest)
			return nil
		})
	}})
}
