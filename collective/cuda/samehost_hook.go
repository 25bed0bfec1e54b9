package cuda

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gorovod/gorovod/collective"
)

// SameHostAllreducer returns a collective.Config.NewDeviceAllreducer that
// runs a communicator's allreduces of CUDA device memory through a
// SameHostGroup: directly between the GPUs' memories through CUDA IPC when
// every rank of the world is on this host and can map the others' buffers,
// and on the communicator's staged path otherwise (the group decides, on
// every rank alike). The group is made at the communicator's first device
// allreduce, on the device of its send buffer, and closed with the
// communicator; log (nil: none) is told at level Info which way it went.
func SameHostAllreducer(cfg SameHostConfig, log *slog.Logger) func() collective.DeviceAllreducer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func() collective.DeviceAllreducer { return &sameHostAllreducer{cfg: cfg, log: log} }
}

// sameHostAllreducer is one communicator's SameHostGroup, made on first use.
type sameHostAllreducer struct {
	cfg    SameHostConfig
	log    *slog.Logger
	mu     sync.Mutex
	group  *SameHostGroup
	closed bool
}

func (a *sameHostAllreducer) AllreduceDevice(ctx context.Context, c *collective.Communicator, send, recv collective.Buffer, op collective.ReduceOp, prescale, postscale float64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrGroupClosed
	}
	if a.group == nil {
		m, ok := send.Device.(*Memory)
		if !ok {
			// Not this backend's memory: every rank of a job runs one build,
			// so every rank takes this branch for this call.
			return c.Allreduce(ctx, send, recv, op, collective.Prescale(prescale), collective.Postscale(postscale), collective.Staged())
		}
		g, err := NewSameHostGroup(ctx, c, m.Device(), a.cfg)
		if err != nil {
			return fmt.Errorf("cuda: setting up the same-host allreduce: %w", err)
		}
		a.group = g
		if g.IPC() {
			a.log.Info("device allreduces go GPU to GPU through CUDA IPC", "ranks", c.Size(), "rank", c.Rank(),
				"board", g.HostSync(), "board_reason", g.SyncReason())
		} else {
			a.log.Info("device allreduces take the host-staged path", "ranks", c.Size(), "rank", c.Rank(), "reason", g.Reason())
		}
	}
	return a.group.AllreduceScaled(ctx, send, recv, op, prescale, postscale)
}

func (a *sameHostAllreducer) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.group == nil {
		return nil
	}
	return a.group.Close()
}
