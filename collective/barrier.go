package collective

import "context"

// Barrier returns once every rank has entered it. It uses the dissemination
// algorithm: in round k every rank signals the rank 2^k ahead and waits for the
// one 2^k behind, so ceil(log2 p) rounds suffice for any p.
func (c *Communicator) Barrier(ctx context.Context) error {
	return c.run(ctx, opDesc{coll: collBarrier}, algoDissemination, func(ctx *opContext, o *opRun) error {
		p, r := c.Size(), c.Rank()
		x := &c.steps.barrier
		for k, dist := 0, 1; dist < p; k, dist = k+1, dist*2 {
			x.to, x.from, x.round = (r+dist)%p, (r-dist+p)%p, k
			if err := o.exchange(ctx, 0, x); err != nil {
				return err
			}
		}
		return nil
	})
}

// barrierRun is one round of a barrier (stepper): an empty frame to one
// rank, one from another.
type barrierRun struct {
	o               *opRun
	to, from, round int
}

func (x *barrierRun) sendStep(ctx *opContext, _ int) error { return x.o.send(ctx, x.to, x.round, nil) }
func (x *barrierRun) recvStep(ctx *opContext, _ int) error {
	return x.o.recv(ctx, x.from, x.round, nil)
}
