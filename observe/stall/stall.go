package stall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/observe/timeline"
)

// Source is what the inspector watches: a *collective.Communicator.
type Source interface {
	Progress() collective.Progress
}

// Aborter is a Source the inspector can stop (a *collective.Communicator):
// with Config.AbortAfter, a collective stuck that long is aborted, and the
// elastic layer moves to a world without the missing ranks.
type Aborter interface {
	Abort(cause error)
}

// Config configures an Inspector.
type Config struct {
	// Threshold is how long a collective may stay in flight before it is
	// reported; warnings repeat every Threshold while it stays. Default 60 s
	// (Horovod's HOROVOD_STALL_CHECK_TIME_SECONDS).
	Threshold time.Duration
	// Interval is how often Progress is polled. Default Threshold/10,
	// between 10 ms and 5 s.
	Interval time.Duration
	// AbortAfter, when positive, aborts a collective in flight this long
	// (Horovod's HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); 0 never does.
	AbortAfter time.Duration
	// Worker names this process in reports (its member name).
	Worker string
	// Logger receives the warnings; nil discards.
	Logger *slog.Logger
	// Timeline, when set, gets an instant on its stalls track per warning.
	Timeline *timeline.Timeline
	// OnStall, when set, is called with the snapshot at every warning (to
	// send it to the driver at once rather than with the next heartbeat).
	OnStall func(Snapshot)
}

// DefaultConfig returns Horovod's 60 s threshold, polled every 6 s, and no
// abort.
func DefaultConfig() Config {
	return Config{Threshold: 60 * time.Second}
}

// ErrStalled is the cause an inspector aborts a communicator with.
var ErrStalled = errors.New("stall: collective stalled")

// Snapshot is one rank's account of its collectives, for the driver.
type Snapshot struct {
	Worker string `json:"worker,omitempty"`
	Epoch  uint64 `json:"epoch"`
	Rank   int    `json:"rank"`
	Size   int    `json:"size"`
	// Started is how many collectives the rank has begun in this world.
	Started uint64 `json:"started"`
	// InFlight: collective #Started is running; For is how long so far, as
	// of Taken.
	InFlight   bool          `json:"in_flight"`
	Collective string        `json:"collective,omitempty"`
	Algorithm  string        `json:"algorithm,omitempty"`
	Bytes      int64         `json:"bytes,omitempty"`
	For        time.Duration `json:"for_ns,omitempty"`
	// WaitingOn is the rank whose data the collective waits for (-1: none).
	WaitingOn int `json:"waiting_on"`
	// Tensors are the names of the tensors of the collective in flight (or
	// of the next one), as the caller said with SetTensors.
	Tensors []string  `json:"tensors,omitempty"`
	Taken   time.Time `json:"taken"`
}

// Inspector watches one process's communicator (the current world's).
type Inspector struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	src     Source
	key     opKey     // the collective in flight when last polled
	since   time.Time // when it was first seen in flight
	warned  time.Time // the last warning about it
	aborted bool
	snap    Snapshot

	tensors atomic.Pointer[[]string]
}

type opKey struct {
	src   Source
	epoch uint64
	seq   uint64
}

// New returns an inspector; Run makes it poll.
func New(cfg Config) *Inspector {
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultConfig().Threshold
	}
	if cfg.Interval <= 0 {
		cfg.Interval = min(max(cfg.Threshold/10, 10*time.Millisecond), 5*time.Second)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Inspector{cfg: cfg, log: log}
}

// Watch makes src the communicator watched (the elastic layer calls it for
// each new world); nil stops watching.
func (in *Inspector) Watch(src Source) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.src, in.key = src, opKey{}
}

// SetTensors names the tensors of the collective the caller is about to run
// (or is running); Snapshot reports them. The slice must not change after.
func (in *Inspector) SetTensors(names []string) { in.tensors.Store(&names) }

// Snapshot is the latest state polled.
func (in *Inspector) Snapshot() Snapshot {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.snap
}

// Run polls until ctx ends.
func (in *Inspector) Run(ctx context.Context) {
	t := time.NewTicker(in.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			in.Poll(now)
		}
	}
}

// Poll checks the watched communicator once, as of now (Run calls it every
// Interval).
func (in *Inspector) Poll(now time.Time) {
	in.mu.Lock()
	src := in.src
	if src == nil {
		in.mu.Unlock()
		return
	}
	p := src.Progress()
	snap := Snapshot{Worker: in.cfg.Worker, Epoch: p.Epoch, Rank: p.Rank, Size: p.Size, Started: p.Started,
		InFlight: p.InFlight, WaitingOn: p.WaitingOn, Taken: now}
	if ts := in.tensors.Load(); ts != nil {
		snap.Tensors = *ts
	}
	var warn, abort, recovered bool
	var stuck time.Duration
	var old opKey
	if p.InFlight && p.Failed == nil {
		snap.Collective, snap.Algorithm, snap.Bytes = p.Op.Collective, p.Op.Algorithm, p.Op.Bytes
		key := opKey{src: src, epoch: p.Epoch, seq: p.Op.Seq}
		if key != in.key {
			old, recovered = in.key, !in.warned.IsZero()
			in.key, in.since, in.warned, in.aborted = key, now, time.Time{}, false
		}
		stuck = now.Sub(in.since)
		snap.For = stuck
		if stuck >= in.cfg.Threshold && now.Sub(in.warned) >= in.cfg.Threshold {
			in.warned, warn = now, true
		}
		if in.cfg.AbortAfter > 0 && stuck >= in.cfg.AbortAfter && !in.aborted {
			in.aborted, abort = true, true
		}
	} else if in.key != (opKey{}) {
		old, recovered = in.key, !in.warned.IsZero()
		stuck = now.Sub(in.since)
		in.key, in.warned = opKey{}, time.Time{}
	}
	in.snap = snap
	in.mu.Unlock()

	if recovered {
		in.log.Info("stall: collective completed after a stall", "epoch", old.epoch, "seq", old.seq, "after", stuck.Round(time.Millisecond))
	}
	if warn {
		msg := localMessage(snap)
		in.log.Warn(msg, "worker", snap.Worker, "rank", snap.Rank, "epoch", snap.Epoch, "seq", snap.Started,
			"collective", snap.Collective, "waiting_on", snap.WaitingOn, "for", snap.For.Round(time.Second))
		in.cfg.Timeline.Instant(timeline.TrackStalls, "stall", "stall", now,
			timeline.Str("collective", snap.Collective), timeline.Int("seq", int64(snap.Started)),
			timeline.Int("waiting_on", int64(snap.WaitingOn)), timeline.Float("for_s", snap.For.Seconds()))
		if in.cfg.OnStall != nil {
			in.cfg.OnStall(snap)
		}
	}
	if abort {
		if a, ok := src.(Aborter); ok {
			in.log.Warn("stall: aborting the collective", "seq", snap.Started, "after", stuck.Round(time.Second))
			a.Abort(fmt.Errorf("%w: %s #%d in flight for %v", ErrStalled, snap.Collective, snap.Started, stuck.Round(time.Second)))
		}
	}
}

// localMessage is what one rank can say about its own stall.
func localMessage(s Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "stall: rank %d of world %d has waited %v in %s #%d (%s, %s)",
		s.Rank, s.Epoch, s.For.Round(time.Second), s.Collective, s.Started, formatBytes(s.Bytes), s.Algorithm)
	if s.WaitingOn >= 0 {
		fmt.Fprintf(&b, " for data from rank %d", s.WaitingOn)
	}
	if len(s.Tensors) > 0 {
		fmt.Fprintf(&b, "; tensors %s", strings.Join(s.Tensors, ", "))
	}
	b.WriteString("; a rank that has not entered this collective holds the others up")
	return b.String()
}

// Stall is what the driver finds from every rank's snapshot.
type Stall struct {
	Epoch      uint64
	Seq        uint64 // the collective some ranks are stuck in
	Collective string
	For        time.Duration // the longest any rank has waited in it
	// Waiting are the ranks in collective Seq; Missing those of the world
	// that have not entered it, with how many collectives each has started.
	Waiting []int
	Missing map[int]uint64
	// Tensors are the names of the tensors of collective Seq (from the
	// waiting ranks): every missing rank lacks them all.
	Tensors []string
	// Unreported are ranks of the world that sent no snapshot (dead, or
	// partitioned from the driver).
	Unreported []int
}

// Find looks at one world's snapshots (one per rank, the newest; ranks of
// other epochs are ignored) and returns the stall: the collective some ranks
// have been in for at least threshold, and the ranks that have not entered
// it. ok is false when no rank has waited that long, or when every rank is
// in the collective (then the wait is in the network or a peer's process,
// which the ranks' own warnings and the transport's timeouts report).
func Find(epoch uint64, snaps []Snapshot, threshold time.Duration) (Stall, bool) {
	st := Stall{Epoch: epoch, Missing: map[int]uint64{}}
	size := 0
	seen := map[int]Snapshot{}
	for _, s := range snaps {
		if s.Epoch != epoch {
			continue
		}
		size = max(size, s.Size)
		if prev, ok := seen[s.Rank]; !ok || s.Taken.After(prev.Taken) {
			seen[s.Rank] = s
		}
	}
	for _, s := range seen {
		if s.InFlight && s.For >= threshold && s.Started > st.Seq {
			st.Seq, st.Collective = s.Started, s.Collective
		}
	}
	if st.Seq == 0 {
		return st, false
	}
	for r := range size {
		s, ok := seen[r]
		switch {
		case !ok:
			st.Unreported = append(st.Unreported, r)
		case s.InFlight && s.Started == st.Seq:
			st.Waiting = append(st.Waiting, r)
			st.For = max(st.For, s.For)
			if len(st.Tensors) == 0 {
				st.Tensors = s.Tensors
			}
		case s.Started < st.Seq:
			st.Missing[r] = s.Started
		}
	}
	if len(st.Missing) == 0 {
		return st, false
	}
	return st, true
}

// String says it as the driver logs it.
func (st Stall) String() string {
	missing := make([]int, 0, len(st.Missing))
	for r := range st.Missing {
		missing = append(missing, r)
	}
	slices.Sort(missing)
	var b strings.Builder
	fmt.Fprintf(&b, "stall in world %d: ranks %v have waited %v in %s #%d; missing ranks: ",
		st.Epoch, st.Waiting, st.For.Round(time.Second), st.Collective, st.Seq)
	for i, r := range missing {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d (at collective #%d", r, st.Missing[r])
		if len(st.Tensors) > 0 {
			fmt.Fprintf(&b, ", lacks %s", strings.Join(st.Tensors, ", "))
		}
		b.WriteString(")")
	}
	if len(st.Unreported) > 0 {
		fmt.Fprintf(&b, "; no report from ranks %v", st.Unreported)
	}
	return b.String()
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
