package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// The collectives. Each checks its arguments, queues the call and returns
// its handle; buffers must stay valid and untouched until the handle
// completes. Every rank must submit the same calls with the same dtypes and
// sizes in the same order.

// Allreduce reduces each recv[i] in place across the world, after copying
// send[i] into it when they are different memory (send may be nil: in
// place). Several tensors are fused into few collectives (one per dtype) and
// carry the world's newest epoch, as a gradient allreduce does.
func (e *Engine) Allreduce(send, recv []collective.Buffer, how gsync.Reduction) (Handle, error) {
	c, _, err := allreduceCall(send, recv, how)
	if err != nil {
		return 0, err
	}
	return e.submit(c)
}

// AllreduceNow is Allreduce for a caller that waits for it at once: a small
// allreduce submitted while nothing else is queued or running runs on the
// caller's goroutine before AllreduceNow returns, which then returns handle
// 0 and the allreduce's result; otherwise it returns as Allreduce does (see
// Engine.now); caller says how it may run there.
func (e *Engine) AllreduceNow(send, recv []collective.Buffer, how gsync.Reduction, caller Caller) (Handle, error) {
	c, bytes, err := allreduceCall(send, recv, how)
	if err != nil {
		return 0, err
	}
	return e.now(c, bytes, caller)
}

// allreduceCall checks an allreduce and returns the call and its bytes.
func allreduceCall(send, recv []collective.Buffer, how gsync.Reduction) (*call, int, error) {
	how, err := checkReduce(how)
	if err != nil {
		return nil, 0, err
	}
	if err := checkBuffers("allreduce", recv...); err != nil {
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
		}
	}
	return &call{what: "allreduce", desc: describe(kindAllreduce, recv, nil, &how, 0), layout: layoutOf(recv), run: func(ctx context.Context, s *gsync.Session) error {
		for i := range send {
			if len(send[i].Host) > 0 && &send[i].Host[0] != &recv[i].Host[0] {
				copy(recv[i].Host, send[i].Host)
			}
		}
		err := s.Allreduce(ctx, how, recv...)
		if errors.Is(err, collective.ErrNotPowerOfTwo) {
			// Refused before anything was sent, on every rank alike.
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return err
	}}, bufferBytes(recv), nil
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
	c, _, err := e.broadcastCall(bufs, root)
	if err != nil {
		return 0, err
	}
	return e.submit(c)
}

// BroadcastNow is Broadcast for a caller that waits for it at once, as
// AllreduceNow is Allreduce's.
func (e *Engine) BroadcastNow(bufs []collective.Buffer, root int, caller Caller) (Handle, error) {
	c, bytes, err := e.broadcastCall(bufs, root)
	if err != nil {
		return 0, err
	}
	return e.now(c, bytes, caller)
}

func (e *Engine) broadcastCall(bufs []collective.Buffer, root int) (*call, int, error) {
	if err := checkBuffers("broadcast", bufs...); err != nil {
		return nil, 0, err
	}
	if err := e.checkRoot(root); err != nil {
		return nil, 0, err
	}
	return &call{what: "broadcast", desc: describe(kindBroadcast, bufs, nil, nil, root), run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			for _, b := range bufs {
				if err := c.Broadcast(ctx, b, root); err != nil {
					return err
				}
			}
			return nil
		})
	}}, bufferBytes(bufs), nil
}

func (e *Engine) checkRoot(root int) error {
	if size := e.Topology().Size; root < 0 || root >= size {
		return fmt.Errorf("%w: root rank %d outside the world of %d", ErrInvalid, root, size)
	}
	return nil
}

// Allgather concatenates every rank's send, in rank order, into recv:
// counts[r] elements from rank r (every rank passes the same counts).
func (e *Engine) Allgather(send, recv collective.Buffer, counts []int) (Handle, error) {
	if err := checkBuffers("allgather", send, recv); err != nil {
		return 0, err
	}
	total, err := e.checkCounts("allgather", counts)
	if err != nil {
		return 0, err
	}
	rank := e.Topology().Rank
	switch {
	case send.DType != recv.DType:
		return 0, fmt.Errorf("%w: allgather of %v into %v", ErrInvalid, send.DType, recv.DType)
	case counts[rank] != send.Count:
		return 0, fmt.Errorf("%w: allgather: counts[%d] is %d but this rank sends %d elements", ErrInvalid, rank, counts[rank], send.Count)
	case recv.Count != total:
		return 0, fmt.Errorf("%w: allgather of %d elements in all into %d", ErrInvalid, total, recv.Count)
	}
	counts = slices.Clone(counts)
	return e.submit(&call{what: "allgather", desc: describe(kindAllgather, []collective.Buffer{recv}, counts, nil, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			return c.AllgatherV(ctx, send, recv, counts)
		})
	}})
}

// Alltoall sends sendCounts[r] elements of send, in rank order, to each
// rank r, and receives recvCounts[r] elements from each into recv.
func (e *Engine) Alltoall(send collective.Buffer, sendCounts []int, recv collective.Buffer, recvCounts []int) (Handle, error) {
	if err := checkBuffers("alltoall", send, recv); err != nil {
		return 0, err
	}
	st, err := e.checkCounts("alltoall send", sendCounts)
	if err != nil {
		return 0, err
	}
	rt, err := e.checkCounts("alltoall receive", recvCounts)
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
	return e.submit(&call{what: "alltoall", desc: desc, run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			return c.AlltoallV(ctx, send, sendCounts, recv, recvCounts)
		})
	}})
}

// ReduceScatter reduces send across the world and leaves counts[r]
// elements of the result, in rank order, in rank r's recv.
func (e *Engine) ReduceScatter(send, recv collective.Buffer, counts []int, how gsync.Reduction) (Handle, error) {
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
	total, err := e.checkCounts("reducescatter", counts)
	if err != nil {
		return 0, err
	}
	rank := e.Topology().Rank
	switch {
	case send.DType != recv.DType:
		return 0, fmt.Errorf("%w: reducescatter of %v into %v", ErrInvalid, send.DType, recv.DType)
	case total != send.Count || counts[rank] != recv.Count:
		return 0, fmt.Errorf("%w: reducescatter: counts add up to %d (tensor %d), this rank's is %d (receive tensor %d)", ErrInvalid, total, send.Count, counts[rank], recv.Count)
	}
	counts = slices.Clone(counts)
	opts := []collective.Option{collective.Prescale(how.Prescale), collective.Postscale(how.Postscale)}
	return e.submit(&call{what: "reducescatter", desc: describe(kindReduceScatter, []collective.Buffer{send}, counts, &how, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			return c.ReduceScatterV(ctx, send, recv, counts, how.Op, opts...)
		})
	}})
}

// Barrier returns on every rank once every rank has entered it.
func (e *Engine) Barrier() (Handle, error) { return e.submit(barrierCall()) }

// BarrierNow is Barrier for a caller that waits for it at once, as
// AllreduceNow is Allreduce's.
func (e *Engine) BarrierNow(caller Caller) (Handle, error) {
	return e.now(barrierCall(), 0, caller)
}

func barrierCall() *call {
	return &call{what: "barrier", desc: describe(kindBarrier, nil, nil, nil, 0), run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			return c.Barrier(ctx)
		})
	}}
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
