package sync

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/logging"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/epoch"
)

// What a session shows of itself: its timeline (Config.Timeline) and its
// stall inspector (Config.StallCheck). Both are cheap enough to leave on;
// a nil timeline costs a pointer check per call.

// DefaultStallCheck is how long a collective may wait for ranks that have
// not entered it before the stall inspector warns: Horovod's 60 s.
const DefaultStallCheck = 60 * time.Second

// observer is a session's timeline and stall inspector.
type observer struct {
	tl   *timeline.Timeline
	insp *stall.Inspector // nil when the stall check is off
	stop context.CancelFunc
	done chan struct{}

	// Only the training goroutine touches these.
	shapes    []tensorShape // of the last gradient allreduce, named in names
	names     []string
	stepStart time.Time
}

// tensorShape is what names a gradient tensor for the stall inspector: the
// trainer passes no names, so a tensor is its place in the list, its dtype
// and its count.
type tensorShape struct {
	dtype collective.DType
	count int
}

// startObserver starts the stall inspector's polling (and heartbeat: every
// half threshold the snapshot goes to onSnapshot, so that the driver knows
// where the ranks that are not stuck stand) for a session of self.
func startObserver(cfg Config, self string) *observer {
	o := &observer{tl: cfg.Timeline, done: make(chan struct{})}
	if cfg.StallCheck < 0 {
		close(o.done)
		return o
	}
	send := cfg.OnStallSnapshot
	o.insp = stall.New(stall.Config{Threshold: cfg.StallCheck, Worker: self, Logger: cfg.Logger, Timeline: cfg.Timeline,
		OnStall: func(s stall.Snapshot) {
			if send != nil && s.Epoch > 0 {
				send(s)
			}
		}})
	ctx, stop := context.WithCancel(context.Background())
	o.stop = stop
	interval := min(max(cfg.StallCheck/10, 10*time.Millisecond), 5*time.Second)
	go o.poll(ctx, interval, cfg.StallCheck/2, send)
	return o
}

func (o *observer) poll(ctx context.Context, interval, heartbeat time.Duration, send func(stall.Snapshot)) {
	defer close(o.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var sent time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			o.insp.Poll(now)
			if send != nil && now.Sub(sent) >= heartbeat {
				if s := o.insp.Snapshot(); s.Epoch > 0 {
					send(s)
					sent = now
				}
			}
		}
	}
}

// close stops the inspector.
func (o *observer) close() {
	if o.stop != nil {
		o.stop()
	}
	<-o.done
	if o.insp != nil {
		o.insp.Watch(nil)
	}
}

// entered marks the move to world ep, in which this worker has rank, which
// took took (connecting its ring and receiving the state).
func (o *observer) entered(ep epoch.World, rank int, comm *collective.Communicator, start, end time.Time) {
	if o.insp != nil {
		o.insp.Watch(comm)
	}
	o.stepStart = end
	if o.tl == nil {
		return
	}
	o.tl.Complete(timeline.TrackElastic, "enter world", "elastic", start, end,
		timeline.Int("epoch", int64(ep.Number)), timeline.Int("rank", int64(rank)), timeline.Int("size", int64(len(ep.Members))))
	o.tl.Instant(timeline.TrackElastic, "world", "elastic", end,
		timeline.Int("epoch", int64(ep.Number)), timeline.Int("rank", int64(rank)), timeline.Int("size", int64(len(ep.Members))))
	o.tl.Counter("world size", end, float64(len(ep.Members)))
	o.tl.SetProcessLabel(fmt.Sprintf("rank %d of %d, world %d", rank, len(ep.Members), ep.Number))
}

// broadcast records the state broadcast of entering world number.
func (o *observer) broadcast(number uint64, start, end time.Time, err error) {
	if o.tl == nil {
		return
	}
	ok := int64(1)
	if err != nil {
		ok = 0
	}
	o.tl.Complete(timeline.TrackElastic, "state broadcast", "elastic", start, end, timeline.Int("epoch", int64(number)), timeline.Int("ok", ok))
}

// recovered records a recovery from a failed collective of world number.
func (o *observer) recovered(number uint64, blamed string, cause error, start, end time.Time) {
	if o.tl == nil {
		return
	}
	o.tl.Complete(timeline.TrackElastic, "recovery", "elastic", start, end,
		timeline.Int("failed_epoch", int64(number)), timeline.Str("blamed", blamed), timeline.Str("cause", cause.Error()))
}

// gradients names the tensors of the gradient allreduce about to run for the
// stall inspector (reusing the names while the list keeps its shape: this
// runs every step) and returns their bytes.
func (o *observer) gradients(tensors []collective.Buffer) int64 {
	var bytes int64
	same := len(tensors) == len(o.shapes)
	for i, t := range tensors {
		bytes += int64(t.Count) * int64(t.DType.Size())
		if same && (o.shapes[i] != tensorShape{t.DType, t.Count}) {
			same = false
		}
	}
	if o.insp == nil || same {
		return bytes
	}
	o.shapes = o.shapes[:0]
	names := make([]string, len(tensors))
	for i, t := range tensors {
		o.shapes = append(o.shapes, tensorShape{t.DType, t.Count})
		names[i] = fmt.Sprintf("gradient %d (%s×%d)", i, t.DType, t.Count)
	}
	o.names = names
	o.insp.SetTensors(names)
	return bytes
}

// reduced records a gradient allreduce that ran from start to end.
func (o *observer) reduced(name string, start, end time.Time, tensors int, bytes int64, err error) {
	if o.tl == nil {
		return
	}
	ok := int64(1)
	if err != nil {
		ok = 0
	}
	o.tl.Complete(timeline.TrackTraining, name, "gradients", start, end,
		timeline.Int("tensors", int64(tensors)), timeline.Int("bytes", bytes), timeline.Int("ok", ok))
}

// committed records step number of world, which ended at end.
func (o *observer) committed(number int64, world uint64, end time.Time) {
	if o.tl != nil {
		o.tl.Complete(timeline.TrackTraining, "step", "training", o.stepStart, end,
			timeline.Int("step", number), timeline.Int("epoch", int64(world)))
	}
	o.stepStart = end
}

// observeFromEnv applies what the environment says about the worker's
// timeline, stall inspector and logging (envconfig.Observability) to the
// fields of cfg that are not set.
func observeFromEnv(cfg *WorkerConfig, getenv func(string) string) error {
	o, err := envconfig.LoadObservability(getenv)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if o.Timeline != "" && cfg.Timeline == "" {
		part := "worker" + cfg.Launch
		if cfg.Launch == "" {
			host, _ := os.Hostname()
			part = fmt.Sprintf("%s-%d", host, os.Getpid())
		}
		cfg.Timeline = envconfig.TimelinePart(o.Timeline, cfg.JobID, part)
	}
	if cfg.Session.StallCheck == 0 {
		cfg.Session.StallCheck = o.StallCheck
	}
	if cfg.Logger == nil {
		if cfg.Logger, err = envLogger(o); err != nil {
			return err
		}
	}
	return nil
}

// envLogger is the library's logger in a worker whose trainer sets none:
// on stderr, as the environment's level and format say (`gorovod run`
// passes its own); nil when the environment says nothing.
func envLogger(o envconfig.Observability) (*slog.Logger, error) {
	if o.LogLevel == "" && o.LogFormat == "" {
		return nil, nil
	}
	log, err := logging.Options{Level: o.LogLevel, Format: o.LogFormat}.Logger(os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s/%s: %w", ErrInvalidConfig, envconfig.EnvLogLevel, envconfig.EnvLogFormat, err)
	}
	return log, nil
}

// workerProcessName names a worker's process in a timeline: by its launch
// index (the [i] of `gorovod run`) when launched, and its member name.
func workerProcessName(name, launch string) string {
	host, _ := os.Hostname()
	if launch != "" {
		return fmt.Sprintf("worker %s (%s, pid %d, %s)", launch, host, os.Getpid(), name)
	}
	return fmt.Sprintf("worker %s (%s, pid %d)", name, host, os.Getpid())
}

// openTimeline creates a worker's timeline file; launch orders it among the
// job's processes in the viewer (workers started by hand come last).
func openTimeline(path, processName, launch string) (*timeline.Timeline, error) {
	sort := 1 << 20
	if i, err := strconv.Atoi(launch); err == nil {
		sort = i + 1 // the driver is 0
	}
	tl, err := timeline.Create(path, timeline.Config{ProcessName: processName, SortIndex: sort})
	if err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	return tl, nil
}

// timelineCloseTimeout bounds the last write of a timeline at exit.
const timelineCloseTimeout = 5 * time.Second

// closeTimeline writes the rest of a timeline and closes it (nil: nothing).
func closeTimeline(tl *timeline.Timeline, log *slog.Logger) {
	if tl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timelineCloseTimeout)
	defer cancel()
	if err := tl.Close(ctx); err != nil {
		log.Warn("the timeline could not be completed", "err", err)
	}
	if n := tl.Dropped(); n > 0 {
		log.Warn("timeline events were dropped: the writer fell behind", "dropped", n)
	}
}

// observeLikeEnv fills cfg's timeline and stall check from env, the
// configuration the environment gives a launched worker, where cfg leaves
// them unset.
func observeLikeEnv(cfg *WorkerConfig, env WorkerConfig) {
	if cfg.Timeline == "" {
		cfg.Timeline = env.Timeline
	}
	if cfg.Session.StallCheck == 0 {
		cfg.Session.StallCheck = env.Session.StallCheck
	}
}

// aloneFromEnv applies the environment to a worker training alone: its
// timeline is GOROVOD_TIMELINE itself (there is nothing to merge).
func aloneFromEnv(cfg *WorkerConfig, getenv func(string) string) error {
	o, err := envconfig.LoadObservability(getenv)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Timeline == "" {
		cfg.Timeline = o.Timeline
	}
	if cfg.Session.StallCheck == 0 {
		cfg.Session.StallCheck = o.StallCheck
	}
	return nil
}
