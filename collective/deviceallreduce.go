package collective

import "context"

// DeviceAllreducer reduces device buffers by other means than the
// communicator's own algorithms, which move every chunk through host memory:
// CUDA IPC between the processes of one host, say (collective/cuda's
// SameHostAllreducer). A Communicator whose Config.NewDeviceAllreducer is
// set makes one when it is created and hands it every Allreduce whose send
// and receive buffers are both device memory (except Adasum calls), on every
// rank alike, and closes it with the communicator. A MaxTag given to such a
// call is agreed on by an allreduce of nothing after it.
type DeviceAllreducer interface {
	// AllreduceDevice does what Communicator.Allreduce does for the
	// device buffers send and recv, prescale and postscale included. It is
	// a collective call like any: every rank makes it for the same
	// allreduce. It may run the communicator's own collectives, and fall
	// back to the staged path by passing Staged() to c.Allreduce.
	AllreduceDevice(ctx context.Context, c *Communicator, send, recv Buffer, op ReduceOp, prescale, postscale float64) error
	// Close releases what the allreducer holds (mappings of other ranks'
	// memory); nothing calls it afterwards.
	Close() error
}

// Staged makes an allreduce run on the communicator's own algorithms even
// where Config.NewDeviceAllreducer would take it: what a DeviceAllreducer's
// own fallback passes.
func Staged() Option { return Option{kind: optStaged} }
