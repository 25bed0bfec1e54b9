package collective

import "context"

// The typed API: the same collectives on Go slices, for Go trainers. Passing the
// same slice as send and recv runs in place.

// Allreduce reduces send across all ranks into recv on every rank.
func Allreduce[T Element](ctx context.Context, c *Communicator, send, recv []T, op ReduceOp, opts ...Option) error {
	return c.Allreduce(ctx, SliceBuffer(send), SliceBuffer(recv), op, opts...)
}

// Broadcast copies root's buf to every rank.
func Broadcast[T Element](ctx context.Context, c *Communicator, buf []T, root int) error {
	return c.Broadcast(ctx, SliceBuffer(buf), root)
}

// Allgather concatenates every rank's send into recv, in rank order.
func Allgather[T Element](ctx context.Context, c *Communicator, send, recv []T) error {
	return c.Allgather(ctx, SliceBuffer(send), SliceBuffer(recv))
}

// AllgatherV concatenates every rank's send, counts[i] elements from rank i.
func AllgatherV[T Element](ctx context.Context, c *Communicator, send, recv []T, counts []int) error {
	return c.AllgatherV(ctx, SliceBuffer(send), SliceBuffer(recv), counts)
}

// ReduceScatter reduces send across all ranks and leaves this rank's segment in recv.
func ReduceScatter[T Element](ctx context.Context, c *Communicator, send, recv []T, op ReduceOp, opts ...Option) error {
	return c.ReduceScatter(ctx, SliceBuffer(send), SliceBuffer(recv), op, opts...)
}

// Alltoall exchanges equal blocks between every pair of ranks.
func Alltoall[T Element](ctx context.Context, c *Communicator, send, recv []T) error {
	return c.Alltoall(ctx, SliceBuffer(send), SliceBuffer(recv))
}

// AlltoallV exchanges blocks of per-pair sizes between every pair of ranks.
func AlltoallV[T Element](ctx context.Context, c *Communicator, send []T, sendCounts []int, recv []T, recvCounts []int) error {
	return c.AlltoallV(ctx, SliceBuffer(send), sendCounts, SliceBuffer(recv), recvCounts)
}
