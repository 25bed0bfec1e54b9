package cuda

import (
	"context"
	"fmt"
)

// WaitEvent returns once the GPU has passed event, a CUDA event (CUevent,
// the same handle as the runtime's cudaEvent_t) that someone else recorded
// on a stream of this device's primary context, or when ctx ends (its
// error). It is how a caller hands over memory that work queued on its own
// stream is still producing: it records an event on that stream behind the
// work, and the collective waits for it before reading the memory, without
// the caller blocking its stream or the host. event 0 is none: WaitEvent
// returns at once. The event must stay alive (not destroyed) until WaitEvent
// returns; re-recording it meanwhile makes WaitEvent wait for the newer
// work.
//
// With a context that can end the event is polled (cuEventQuery), as the
// device's own waits do: spinning for up to spinWait, then sleeping up to
// 100 µs between queries. With one that cannot, the driver blocks the thread
// (cuEventSynchronize).
func (d *Device) WaitEvent(ctx context.Context, event uintptr) error {
	if event == 0 {
		return ctx.Err()
	}
	return d.withContext(ctx, func() error {
		if ctx.Done() == nil {
			if err := d.drv.eventSynchronize(event); err != nil {
				return d.eventErr("cuEventSynchronize", event, err)
			}
			return nil
		}
		return pollEvent(ctx, func() (bool, error) {
			err := d.drv.eventQuery(event)
			switch {
			case err == nil:
				return true, nil
			case isResult(err, resultNotReady):
				return false, nil
			default:
				return false, d.eventErr("cuEventQuery", event, err)
			}
		})
	})
}

func (d *Device) eventErr(op string, event uintptr, err error) error {
	return &DriverError{Device: d.ordinal, Op: fmt.Sprintf("%s(0x%x)", op, event), Err: err,
		Hint: "the event must be a live CUDA event of this device's primary context (torch.cuda.Event.cuda_event after record)"}
}
