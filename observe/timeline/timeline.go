package timeline

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective"
)

// Track is a thread of the trace: one row per activity of a process.
type Track uint8

// The tracks of a worker process.
const (
	// TrackCollectives holds every collective and, nested, its phases.
	TrackCollectives Track = iota + 1
	// TrackElastic holds world switches, state broadcasts and recoveries.
	TrackElastic
	// TrackTraining holds the trainer's steps, fusion and queueing.
	TrackTraining
	// TrackStalls holds the stall inspector's warnings.
	TrackStalls
)

var trackNames = [...]string{TrackCollectives: "collectives", TrackElastic: "elastic", TrackTraining: "training", TrackStalls: "stalls"}

func (t Track) String() string {
	if int(t) < len(trackNames) && trackNames[t] != "" {
		return trackNames[t]
	}
	return fmt.Sprintf("track %d", uint8(t))
}

// Config configures a Timeline.
type Config struct {
	// ProcessName labels this process's rows in the viewer, e.g. "worker 3
	// (host-a, pid 1234)". Default "pid N".
	ProcessName string
	// SortIndex orders processes in the viewer (the launch index).
	SortIndex int
	// PID identifies the process in the trace; default os.Getpid(). Merged
	// traces need it unique per process.
	PID int
	// Capacity is how many events wait for the writer at most (two buffers
	// of this many are allocated up front, about 400 bytes an event).
	// Default 4096.
	Capacity int
	// FlushInterval is how often the writer writes what was recorded; it
	// also writes as soon as a buffer is half full. Default 100 ms.
	FlushInterval time.Duration
}

// DefaultConfig returns a 4096-event buffer written every 100 ms: a job
// running a thousand collectives a second loses nothing.
func DefaultConfig() Config {
	return Config{Capacity: 4096, FlushInterval: 100 * time.Millisecond}
}

// maxArgs is how many Args an event carries; more are dropped.
const maxArgs = 4

type argKind uint8

const (
	argInt argKind = iota + 1
	argStr
	argFloat
)

// Arg is one argument of an event, shown when the event is selected.
type Arg struct {
	key  string
	str  string
	num  uint64
	kind argKind
}

// Int is an integer argument.
func Int(key string, v int64) Arg { return Arg{key: key, num: uint64(v), kind: argInt} }

// Str is a string argument.
func Str(key, v string) Arg { return Arg{key: key, str: v, kind: argStr} }

// Float is a floating-point argument (written as null when not finite).
func Float(key string, v float64) Arg { return Arg{key: key, num: math.Float64bits(v), kind: argFloat} }

type eventKind uint8

const (
	evGeneric eventKind = iota
	evCollective
	evPhase
)

// event is one recorded event: a fixed-size value copied into the buffer.
type event struct {
	ph    byte // 'X' complete, 'i' instant, 'C' counter, 'M' metadata
	kind  eventKind
	track Track
	nargs uint8
	name  string
	cat   string
	ts    int64 // Unix nanoseconds
	dur   int64 // nanoseconds
	args  [maxArgs]Arg
	// Collectives and phases keep their description unformatted.
	op     collective.OpInfo
	phase  collective.PhaseInfo
	err    error
	scope  byte // instants: 't' thread, 'p' process, 'g' global
	metaID Track
}

// Timeline records one process's events and writes them to a file (or any
// writer) as a Chrome trace. All methods are safe for concurrent use, and
// are no-ops on a nil *Timeline, so code can trace unconditionally.
type Timeline struct {
	cfg Config
	pid int

	mu      sync.Mutex
	buf     []event
	dropped uint64
	closed  bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	// The writer goroutine's own.
	spare   []event
	out     *bufio.Writer
	closer  io.Closer
	scratch []byte
	first   bool
	werr    error

	closeOnce sync.Once
	closeErr  error
}

// Create writes a timeline to the file at path (created or truncated).
func Create(path string, cfg Config) (*Timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	return New(f, cfg), nil
}

// New writes a timeline to w; Close closes w when it is an io.Closer.
func New(w io.Writer, cfg Config) *Timeline {
	d := DefaultConfig()
	if cfg.Capacity <= 0 {
		cfg.Capacity = d.Capacity
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = d.FlushInterval
	}
	if cfg.PID == 0 {
		cfg.PID = os.Getpid()
	}
	if cfg.ProcessName == "" {
		cfg.ProcessName = fmt.Sprintf("pid %d", cfg.PID)
	}
	t := &Timeline{
		cfg:   cfg,
		pid:   cfg.PID,
		buf:   make([]event, 0, cfg.Capacity),
		spare: make([]event, 0, cfg.Capacity),
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		out:   bufio.NewWriterSize(w, 64<<10),
		first: true,
	}
	if c, ok := w.(io.Closer); ok {
		t.closer = c
	}
	t.writeHeader()
	go t.writer()
	return t
}

// writeHeader writes the opening bracket and the metadata that names the
// process and its tracks; it runs before the writer goroutine starts.
func (t *Timeline) writeHeader() {
	t.write([]byte("[\n"))
	t.writeEvent(&event{ph: 'M', name: "process_name", args: [maxArgs]Arg{Str("name", t.cfg.ProcessName)}, nargs: 1})
	t.writeEvent(&event{ph: 'M', name: "process_sort_index", args: [maxArgs]Arg{Int("sort_index", int64(t.cfg.SortIndex))}, nargs: 1})
	for tr := TrackCollectives; tr <= TrackStalls; tr++ {
		t.writeEvent(&event{ph: 'M', name: "thread_name", metaID: tr, args: [maxArgs]Arg{Str("name", tr.String())}, nargs: 1})
		t.writeEvent(&event{ph: 'M', name: "thread_sort_index", metaID: tr, args: [maxArgs]Arg{Int("sort_index", int64(tr))}, nargs: 1})
	}
	_ = t.out.Flush()
}

// record copies ev into the buffer, or counts it as dropped when the buffer
// is full. It never blocks on the writer.
func (t *Timeline) record(ev *event) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	if len(t.buf) == cap(t.buf) {
		t.dropped++
		t.mu.Unlock()
		return
	}
	t.buf = append(t.buf, *ev)
	half := len(t.buf) == cap(t.buf)/2
	t.mu.Unlock()
	if half {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

func setArgs(ev *event, args []Arg) {
	ev.nargs = uint8(copy(ev.args[:], args))
}

// Complete records an activity of track that ran from start to end.
func (t *Timeline) Complete(track Track, name, cat string, start, end time.Time, args ...Arg) {
	if t == nil {
		return
	}
	ev := event{ph: 'X', track: track, name: name, cat: cat, ts: start.UnixNano(), dur: end.Sub(start).Nanoseconds()}
	setArgs(&ev, args)
	t.record(&ev)
}

// Instant records a moment on track (a world switch, a stall warning).
func (t *Timeline) Instant(track Track, name, cat string, at time.Time, args ...Arg) {
	if t == nil {
		return
	}
	ev := event{ph: 'i', scope: 't', track: track, name: name, cat: cat, ts: at.UnixNano()}
	setArgs(&ev, args)
	t.record(&ev)
}

// Counter records the value of a quantity over time (the world size), drawn
// as a chart above the process's tracks.
func (t *Timeline) Counter(name string, at time.Time, value float64) {
	if t == nil {
		return
	}
	ev := event{ph: 'C', name: name, ts: at.UnixNano(), nargs: 1}
	ev.args[0] = Float("value", value)
	t.record(&ev)
}

// SetProcessLabel labels the process in the viewer beside its name, e.g.
// with its current rank: "rank 2 of 4, world 5".
func (t *Timeline) SetProcessLabel(label string) {
	if t == nil {
		return
	}
	ev := event{ph: 'M', name: "process_labels", nargs: 1}
	ev.args[0] = Str("labels", label)
	t.record(&ev)
}

// Dropped is how many events were dropped so far because the writer fell
// behind (they are also reported in the trace).
func (t *Timeline) Dropped() uint64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// writer writes the recorded events until Close.
func (t *Timeline) writer() {
	defer close(t.done)
	tick := time.NewTicker(t.cfg.FlushInterval)
	defer tick.Stop()
	var reported uint64
	for {
		stopping := false
		select {
		case <-t.kick:
		case <-tick.C:
		case <-t.stop:
			stopping = true
		}
		t.mu.Lock()
		batch := t.buf
		t.buf, t.spare = t.spare[:0], nil
		dropped := t.dropped
		t.mu.Unlock()
		for i := range batch {
			t.writeEvent(&batch[i])
			batch[i] = event{} // let go of the strings and errors it holds
		}
		if dropped > reported {
			reported = dropped
			t.writeEvent(&event{ph: 'i', scope: 'p', track: TrackStalls, name: "timeline dropped events", cat: "timeline",
				ts: time.Now().UnixNano(), args: [maxArgs]Arg{Int("dropped_total", int64(dropped))}, nargs: 1})
		}
		t.mu.Lock()
		t.spare = batch[:0]
		t.mu.Unlock()
		if stopping {
			t.write([]byte("\n]\n"))
			if err := t.out.Flush(); err != nil && t.werr == nil {
				t.werr = err
			}
			if t.closer != nil {
				if err := t.closer.Close(); err != nil && t.werr == nil {
					t.werr = err
				}
			}
			return
		}
		if err := t.out.Flush(); err != nil && t.werr == nil {
			t.werr = err
		}
	}
}

// Close writes what is left, ends the trace and closes the file. Events
// recorded after Close are ignored. When ctx ends first (a slow disk) Close
// returns ctx's error and the writer finishes in the background. Close is
// idempotent.
func (t *Timeline) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		close(t.stop)
	})
	select {
	case <-t.done:
	case <-ctx.Done():
		return fmt.Errorf("timeline: closing: %w", ctx.Err())
	}
	if t.werr != nil {
		return fmt.Errorf("timeline: writing: %w", t.werr)
	}
	return nil
}

func (t *Timeline) write(b []byte) {
	if t.werr != nil {
		return
	}
	if _, err := t.out.Write(b); err != nil {
		t.werr = err
	}
}

// writeEvent encodes one event as a line of the JSON array.
func (t *Timeline) writeEvent(ev *event) {
	b := t.scratch[:0]
	if !t.first {
		b = append(b, ",\n"...)
	}
	t.first = false
	b = appendEvent(b, ev, t.pid)
	t.scratch = b
	t.write(b)
}
