package collective

import "context"

// Barrier returns once every rank has entered it. It uses the dissemination
// algorithm: in round k every rank signals the rank 2^k ahead and waits for the
// one 2^k behind, so ceil(log2 p) rounds suffice for any p.
func (c *Communicator) Barrier(ctx context.Context) error {
	return c.run(ctx, opDesc{coll: collBarrier}, algoDissemination, func(ctx context.Context, o *opRun) error {
		p, r := c.Size(), c.Rank()
		for k, dist := 0, 1; dist < p; k, dist = k+1, dist*2 {
			to, from := (r+dist)%p, (r-dist+p)%p
			err := o.exchange(ctx, 0,
				func(ctx context.Context) error { return o.send(ctx, to, k, nil) },
				func(ctx context.Context) error { return o.recv(ctx, from, k, nil) })
			if err != nil {
				return err
			}
		}
		return nil
	})
}
