package heuristics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
)

const (
	// maxPluginOutput bounds what is read of a plugin's standard output: a
	// decision is a few hundred bytes, so more is a bug, and reading it all
	// would let a runaway plugin fill the driver's memory.
	maxPluginOutput = 1 << 20
	// pluginStderrTail is how much of the end of a plugin's standard error an
	// error carries: where a traceback ends is where the cause is.
	pluginStderrTail = 2 << 10
	// pluginWaitDelay is how long the output of a plugin that has exited (or
	// been killed) may stay open: a process it left behind holding its
	// standard output must not hang the engine.
	pluginWaitDelay = time.Second
	// badOutputQuote is how much of an unparsable output an error quotes.
	badOutputQuote = 200
)

// ErrPluginTimeout is wrapped by the error of a plugin that ran past the exec
// heuristic's timeout (and was killed).
var ErrPluginTimeout = errors.New("timed out")

// PluginError is the error of an exec heuristic evaluation that failed: the
// program could not start, failed, timed out, or printed no valid decision.
type PluginError struct {
	Program string // the command's first word, as configured
	// Err is what went wrong: it wraps ErrPluginTimeout, an *exec.ExitError
	// or the decoding error.
	Err error
	// Stderr is the end of what the plugin printed on its standard error.
	Stderr string
}

func (e *PluginError) Error() string {
	s := "heuristics: exec plugin " + e.Program + ": " + e.Err.Error()
	if e.Stderr != "" {
		s += "; stderr: " + strconv.Quote(e.Stderr)
	}
	return s
}

func (e *PluginError) Unwrap() error { return e.Err }

// execParams are the parameters of the exec heuristic.
type execParams struct {
	Command commandLine `json:"command"`
	Timeout Duration    `json:"timeout"`
	// EvalEvery is how many committed steps must pass between two runs of
	// the program: starting a process, and a Python interpreter, is not
	// free, and a world needs steps before there is anything new to see.
	EvalEvery    int64             `json:"eval_every"`
	IncludeSteps bool              `json:"include_steps"`
	Env          map[string]string `json:"env"`
	Dir          string            `json:"dir"`
	// ForwardStderr copies the plugin's standard error, line by line, to
	// the driver's, so a plugin's own log can be followed while it works.
	ForwardStderr bool `json:"forward_stderr"`
}

// commandLine is an argv given as a JSON list or, so that `--heuristic-opt
// command=./plugin --flag` works without quoting, as one string split at
// white space.
type commandLine []string

func (c *commandLine) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = strings.Fields(s)
		return nil
	}
	var argv []string
	if err := json.Unmarshal(b, &argv); err != nil {
		return errors.New("command must be a list of strings (the argv) or one string")
	}
	*c = argv
	return nil
}

// execHeuristic runs an external program per evaluation (the protocol is in
// docs/heuristic-plugins.md and protocol.go).
type execHeuristic struct {
	argv         []string
	path         string // argv[0] resolved at construction, absolute
	timeout      time.Duration
	every        int64
	includeSteps bool
	env          []string // added to the driver's environment
	dir          string
	stderr       io.Writer // where ForwardStderr copies to; nil: nowhere

	ran     bool
	last    int64 // History.Step at the last run
	settled bool  // the last run's decision was a settled hold
	// pending is the run in flight or not yet collected: the program runs
	// beside the engine, which keeps measuring, detecting stragglers and
	// following world changes meanwhile.
	pending *pluginRun
	ready   func() // the engine's wake-up (OnReady), or nil
}

// pluginRun is one run of the program on the history of one step.
type pluginRun struct {
	done  chan struct{} // closed when d and err are set
	epoch uint64        // the world the history ended in
	step  int64
	d     Decision
	err   error
}

func newExec(_ *Registry, s Spec) (Heuristic, error) {
	p := execParams{Timeout: Duration(10 * time.Second), EvalEvery: 10}
	if err := DecodeParams(s.Params, &p); err != nil {
		return nil, err
	}
	if len(p.Command) == 0 || p.Command[0] == "" {
		return nil, errors.New(`needs a "command": the plugin program and its arguments`)
	}
	if p.Timeout <= 0 {
		return nil, fmt.Errorf("timeout must be positive, got %v", time.Duration(p.Timeout))
	}
	if p.EvalEvery < 0 {
		return nil, fmt.Errorf("eval_every must not be negative, got %d", p.EvalEvery)
	}
	if p.Dir != "" {
		fi, err := os.Stat(p.Dir)
		if err != nil {
			return nil, fmt.Errorf("dir: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("dir: %s is not a directory", p.Dir)
		}
	}
	// Resolved once and made absolute so that neither dir nor a later
	// change of PATH or of the working directory changes which program runs.
	path, err := exec.LookPath(p.Command[0])
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	e := &execHeuristic{
		argv:         slices.Clone([]string(p.Command)),
		path:         path,
		timeout:      time.Duration(p.Timeout),
		every:        p.EvalEvery,
		includeSteps: p.IncludeSteps,
		dir:          p.Dir,
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("env: bad variable name %q", k)
		}
		e.env = append(e.env, k+"="+p.Env[k])
	}
	if p.ForwardStderr {
		e.stderr = os.Stderr
	}
	return e, nil
}

func (e *execHeuristic) Name() string { return "exec(" + filepath.Base(e.argv[0]) + ")" }

// Decide starts the program when eval_every steps have passed since its last
// run and holds otherwise; the run's decision is returned by the first call
// after the program has answered. A failed run counts as a run: a plugin that
// times out must not be started again at every call. An answer about a world
// that has since changed is dropped, and the program asked again at once.
func (e *execHeuristic) Decide(ctx context.Context, h *History) (Decision, error) {
	cur := h.Current()
	if cur == nil {
		return HoldBecause("no world yet"), nil
	}
	if r := e.pending; r != nil {
		select {
		case <-r.done:
		default:
			d := HoldBecause("plugin evaluating the history of step %d", r.step)
			d.Settled = e.settled
			return d, nil
		}
		e.pending = nil
		if r.epoch == cur.Epoch {
			e.settled = r.err == nil && r.d.Settled && r.d.Action == Hold
			return r.d, r.err
		}
		e.ran = false
	}
	// A step count below the last run's means the count restarted: run.
	if e.ran && h.Step >= e.last && h.Step < e.last+e.every {
		d := HoldBecause("next plugin evaluation at step %d", e.last+e.every)
		d.Settled = e.settled
		return d, nil
	}
	e.ran, e.last = true, h.Step
	// The history is encoded here, on the caller's goroutine, because the
	// engine goes on changing it while the program runs.
	input, err := json.Marshal(newPluginHistory(h, e.includeSteps))
	if err != nil {
		return Decision{}, &PluginError{Program: e.argv[0], Err: fmt.Errorf("encoding the history: %w", err)}
	}
	r := &pluginRun{done: make(chan struct{}), epoch: cur.Epoch, step: h.Step}
	members := slices.Clone(cur.Members)
	go func() {
		r.d, r.err = e.run(ctx, input, members)
		close(r.done)
		if e.ready != nil {
			e.ready()
		}
	}()
	e.pending = r
	d := HoldBecause("plugin started on the history of step %d", h.Step)
	d.Settled = e.settled
	return d, nil
}

// OnReady makes the engine evaluate as soon as the program has answered.
func (e *execHeuristic) OnReady(ready func()) { e.ready = ready }

// run runs the program once on an encoded history.
func (e *execHeuristic) run(ctx context.Context, input []byte, members []string) (Decision, error) {
	// A line, so that line-oriented readers (a shell's read, tee into a
	// JSON-lines file) work too.
	input = append(input, '\n')
	runCtx, cancel := context.WithTimeoutCause(ctx, e.timeout, ErrPluginTimeout)
	defer cancel()

	cmd := exec.CommandContext(runCtx, e.path, e.argv[1:]...)
	cmd.Args[0] = e.argv[0]
	cmd.Dir = e.dir
	// Not the job secret, should this process hold it (a driver pod's
	// environment): a plugin is not a member of the job.
	cmd.Env = envconfig.WithoutSecrets(append(os.Environ(), e.env...))
	cmd.Stdin = bytes.NewReader(input)
	stdout := &cappedBuffer{max: maxPluginOutput}
	stderr := &tailBuffer{max: pluginStderrTail}
	cmd.Stdout = stdout
	var forward *prefixWriter
	if e.stderr != nil {
		forward = &prefixWriter{prefix: e.Name() + ": ", out: e.stderr}
		cmd.Stderr = io.MultiWriter(stderr, forward)
	} else {
		cmd.Stderr = stderr
	}
	// Its own process group, so that a timeout kills what the plugin
	// started too (a shell script's children would otherwise keep running
	// and keep its output open).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = pluginWaitDelay

	if err := cmd.Start(); err != nil {
		return Decision{}, &PluginError{Program: e.argv[0], Err: err}
	}
	waitErr := cmd.Wait()
	// The protocol is one request, one answer: whatever the plugin left
	// running is killed. Pids are handed out cyclically, so the group's id
	// has not gone to another process in the microseconds since the exit.
	_ = killGroup(cmd.Process.Pid)
	if forward != nil {
		forward.flush()
	}

	fail := func(err error) (Decision, error) {
		return Decision{}, &PluginError{Program: e.argv[0], Err: err, Stderr: stderr.String()}
	}
	switch {
	case stdout.over:
		return fail(fmt.Errorf("printed more than %d bytes on stdout", maxPluginOutput))
	case waitErr == nil:
	case errors.Is(waitErr, exec.ErrWaitDelay):
		return fail(fmt.Errorf("exited, but its stdout stayed open %v longer (a background process holding it?)", pluginWaitDelay))
	case context.Cause(runCtx) == ErrPluginTimeout:
		return fail(fmt.Errorf("%w after %v (killed)", ErrPluginTimeout, e.timeout))
	case ctx.Err() != nil:
		return fail(fmt.Errorf("stopped: %w", context.Cause(ctx)))
	default:
		return fail(waitErr) // an *exec.ExitError says "exit status 3"
	}
	d, err := parsePluginDecision(stdout.buf, members)
	if err != nil {
		return fail(fmt.Errorf("bad decision on stdout: %w: %s", err, quoteStart(stdout.buf, badOutputQuote)))
	}
	return d, nil
}

// killGroup kills process group pgid, reporting a group already gone as
// os.ErrProcessDone, as exec.Cmd.Cancel wants.
func killGroup(pgid int) error {
	err := syscall.Kill(-pgid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// quoteStart quotes the first n bytes of b, marking a cut.
func quoteStart(b []byte, n int) string {
	if len(b) <= n {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:n])) + "..."
}

var errOutputTooLarge = errors.New("output too large")

// cappedBuffer keeps up to max bytes and then fails the write, which makes
// exec close the pipe: the plugin gets EPIPE instead of being read forever.
type cappedBuffer struct {
	buf  []byte
	max  int
	over bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - len(b.buf); len(p) > room {
		b.buf = append(b.buf, p[:room]...)
		b.over = true
		return room, errOutputTooLarge
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf  []byte
	max  int
	lost bool
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	// Trimmed only when twice the size, so the copying stays linear.
	if len(b.buf) > 2*b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
		b.lost = true
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	s := b.buf
	lost := b.lost
	if len(s) > b.max {
		s, lost = s[len(s)-b.max:], true
	}
	out := strings.TrimSpace(string(s))
	if lost {
		out = "..." + out
	}
	return out
}

// prefixWriter writes whole lines to out, each after prefix.
type prefixWriter struct {
	prefix string
	out    io.Writer
	line   []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.line = append(w.line, p...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		// The driver's stderr failing is no reason to fail the plugin.
		_, _ = io.WriteString(w.out, w.prefix+string(w.line[:i+1]))
		w.line = w.line[i+1:]
	}
	// A plugin that never ends its line must not grow this without bound.
	if len(w.line) > pluginStderrTail {
		w.flush()
	}
	return len(p), nil
}

func (w *prefixWriter) flush() {
	if len(w.line) > 0 {
		_, _ = io.WriteString(w.out, w.prefix+string(w.line)+"\n")
		w.line = nil
	}
}
