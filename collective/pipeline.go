package collective

import (
	"sync"
	"sync/atomic"

	"github.com/gorovod/gorovod/collective/transport"
)

// stepper is the two halves of a step schedule that pipeline runs: send k and
// receive k. Algorithms implement it on state the communicator keeps from
// call to call, so that running one allocates nothing (a closure handed to
// another goroutine would be allocated per call).
type stepper interface {
	sendStep(ctx *opContext, k int) error
	recvStep(ctx *opContext, k int) error
}

// helper is the communicator's second goroutine, which runs the sending half
// of a pipelined collective while the caller's goroutine receives. It lives
// from the first such collective until Close, Abort or a failure (or until
// the communicator is garbage), so a collective starts no goroutine — starting
// one allocates. It holds no reference to the communicator between jobs.
type helper struct {
	jobs    chan helperJob
	quit    chan struct{}
	stopped sync.Once
	started bool // guarded by the communicator's opMu
}

func newHelper() *helper {
	return &helper{jobs: make(chan helperJob), quit: make(chan struct{})}
}

// helperJob is what a helper goroutine runs: the sending half of a pipeline
// (pipeRun) or the cross-host half of a pipelined hierarchical allreduce
// (hierPipe). Both are pointers kept by the communicator, so handing one
// over allocates nothing.
type helperJob interface{ runJob() }

func (h *helper) loop() {
	for {
		select {
		case <-h.quit:
			return
		case j := <-h.jobs:
			j.runJob()
		}
	}
}

// stop ends the goroutine once it has finished its job, if it runs one.
func (h *helper) stop() { h.stopped.Do(func() { close(h.quit) }) }

// pipeRun is the state of one pipeline, shared by its two halves; the
// communicator keeps one.
type pipeRun struct {
	ctx        *opContext
	st         stepper
	nSend, lag int
	// recvDone and sendDone count the items each half has finished; ready and
	// sent (one slot each) wake the other half after a count went up. A
	// waiter re-reads the count, so a stale wake-up costs one more look.
	recvDone, sendDone atomic.Int64
	ready, sent        chan struct{}
	result             chan error // the sending half's outcome
}

func newPipeRun() *pipeRun {
	return &pipeRun{ready: make(chan struct{}, 1), sent: make(chan struct{}, 1), result: make(chan error, 1)}
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// runJob sends items 0..nSend-1, item k once the receiving half has
// finished item k-lag (never waiting with lag < 0).
func (p *pipeRun) runJob() {
	err := p.sendHalf()
	if err != nil {
		p.ctx.cancel(err)
	}
	p.result <- err
}

func (p *pipeRun) sendHalf() error {
	for k := 0; k < p.nSend; k++ {
		for p.lag >= 0 && p.recvDone.Load() <= int64(k-p.lag) {
			select {
			case <-p.ready:
			case <-p.ctx.Done():
				return p.ctx.Cause()
			}
		}
		if err := p.st.sendStep(p.ctx, k); err != nil {
			return err
		}
		p.sendDone.Add(1)
		wake(p.sent)
	}
	return nil
}

// pipeline runs the two halves of a ring or chain step schedule: send(k) for
// k < nSend on the communicator's helper goroutine and recv(k) for k < nRecv
// on this one. Send k may only start once recv k-lag has finished (it
// forwards what that receive produced); with lag < 0 sends never wait. With
// guard > 0, recv k may only start once send k-guard has finished, because it
// overwrites what that send read. Either half failing stops the other.
func (o *opRun) pipeline(ctx *opContext, nSend, nRecv, lag, guard int, st stepper) error {
	return o.pipelineOn(ctx, &o.c.lane, nSend, nRecv, lag, guard, st)
}

// pipelineOn is pipeline on lane ln (its pipeline state and helper).
func (o *opRun) pipelineOn(ctx *opContext, ln *lane, nSend, nRecv, lag, guard int, st stepper) error {
	if nSend == 0 {
		for k := 0; k < nRecv; k++ {
			if err := st.recvStep(ctx, k); err != nil {
				return err
			}
		}
		return nil
	}
	p := ln.pipe
	p.ctx, p.st, p.nSend, p.lag = ctx, st, nSend, lag
	p.recvDone.Store(0)
	p.sendDone.Store(0)
	defer func() { p.ctx, p.st = nil, nil }()
	if err := o.c.startJob(ln.helper, p); err != nil {
		return err
	}
	var recvErr error
	for k := 0; k < nRecv && recvErr == nil; k++ {
		for recvErr == nil && guard > 0 && p.sendDone.Load() <= int64(k-guard) && p.sendDone.Load() < int64(nSend) {
			select {
			case <-p.sent:
			case <-ctx.Done():
				recvErr = ctx.Cause()
			}
		}
		if recvErr != nil {
			break
		}
		if recvErr = st.recvStep(ctx, k); recvErr != nil {
			break
		}
		p.recvDone.Add(1)
		wake(p.ready)
	}
	if recvErr != nil {
		ctx.cancel(recvErr)
		return firstCause(ctx, recvErr, <-p.result)
	}
	return <-p.result
}

// startJob hands job to the helper goroutine h, starting it the first time.
func (c *Communicator) startJob(h *helper, job helperJob) error {
	if !h.started {
		h.started = true
		go h.loop()
	}
	select {
	case h.jobs <- job:
		return nil
	case <-h.quit:
		if err := c.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
}

// exchange sends n bytes to one peer while receiving from another (possibly
// the same) — st's send and receive of item 0 — and returns when both are
// done. Small sends complete without the peer reading
// (transport.InlinePayload), so they go first from this goroutine.
func (o *opRun) exchange(ctx *opContext, n int, st stepper) error {
	return o.exchangeOn(ctx, &o.c.lane, n, st)
}

// exchangeOn is exchange on lane ln.
func (o *opRun) exchangeOn(ctx *opContext, ln *lane, n int, st stepper) error {
	if n <= transport.InlinePayload {
		if err := st.sendStep(ctx, 0); err != nil {
			return err
		}
		return st.recvStep(ctx, 0)
	}
	return o.pipelineOn(ctx, ln, 1, 1, -1, 0, st)
}

// firstCause picks, of the receiving and sending halves' errors, the one that
// stopped the collective: the other half only saw the cancellation it caused.
func firstCause(ctx *opContext, recvErr, sendErr error) error {
	if sendErr != nil && ctx.Cause() == sendErr {
		return sendErr
	}
	return recvErr
}

// algoSteps holds the steppers of the algorithms, one of each, kept by the
// communicator and filled in by the collective that runs one.
type algoSteps struct {
	ring     ringRun
	doubling doublingRun
	chain    chainRun
	gather   gatherRun
	barrier  barrierRun
	alltoall alltoallRun
	adasum   adasumRun
}

func (s *algoSteps) init(o *opRun) {
	s.ring.o, s.doubling.o, s.chain.o, s.gather.o, s.barrier.o, s.alltoall.o, s.adasum.o = o, o, o, o, o, o, o
	s.ring.consumeFn = s.ring.consume
}

// lane is what one goroutine needs to run algorithms' steps: the steppers,
// the pipeline it shares with its helper goroutine (which sends while this
// one receives), and staging. The communicator has two (Communicator.lane
// and crossLane), so that two groups of its ranks can run steps at once.
type lane struct {
	steps   algoSteps
	helper  *helper
	pipe    *pipeRun
	scratch []byte // receive staging
	staging []byte // send staging for device memory
}

func (ln *lane) init(o *opRun) {
	ln.steps.init(o)
	ln.helper, ln.pipe = newHelper(), newPipeRun()
}
