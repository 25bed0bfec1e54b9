package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
)

// Discovery finds the hosts available now.
type Discovery interface {
	Discover(ctx context.Context) ([]Host, error)
}

// Static is a fixed host list (-H, --hostfile).
type Static []Host

// Discover returns the list.
func (s Static) Discover(context.Context) ([]Host, error) { return slices.Clone(s), nil }

// Script runs a host discovery script (`--host-discovery-script`): a
// program, run through `sh -c`, that prints the available hosts, one
// "host:slots" (or "host", DefaultSlots) per line, and exits 0.
type Script struct {
	Command string
	// DefaultSlots is the slot count of a host printed without one.
	// Default 1.
	DefaultSlots int
	// Timeout bounds one run; the script and everything it started are then
	// killed and the run fails. Default 10 s.
	Timeout time.Duration
}

const (
	defaultScriptTimeout = 10 * time.Second
	maxScriptOutput      = 1 << 20
)

// Discover runs the script once.
func (s Script) Discover(ctx context.Context) ([]Host, error) {
	if strings.TrimSpace(s.Command) == "" {
		return nil, errors.New("host discovery script: no command")
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = defaultScriptTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", s.Command)
	// Not the job secret, should this process hold it: the script is not a
	// member of the job.
	cmd.Env = envconfig.WithoutSecrets(os.Environ())
	// Its own process group, so that a timeout kills what it started too
	// (a script running `ssh` or `kubectl`, say).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A grandchild holding the output open must not hold up Discover.
	cmd.WaitDelay = time.Second
	var stdout, stderr limitedBuffer
	stdout.limit, stderr.limit = maxScriptOutput, 4096
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("host discovery script %q did not finish within %v", s.Command, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("host discovery script %q: %v%s", s.Command, err, tailOf(stderr.Bytes()))
	}
	if stdout.over {
		return nil, fmt.Errorf("host discovery script %q printed more than %d bytes", s.Command, maxScriptOutput)
	}
	hs, err := ParseDiscovered(stdout.Bytes(), s.DefaultSlots)
	if err != nil {
		return nil, fmt.Errorf("host discovery script %q: %w", s.Command, err)
	}
	return hs, nil
}

func tailOf(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	return ": " + strings.Join(lines[max(0, len(lines)-3):], " | ")
}

// limitedBuffer keeps the first limit bytes written to it. (It does not
// embed bytes.Buffer: io.Copy would use the embedded ReadFrom and bypass
// the limit.)
type limitedBuffer struct {
	buf   bytes.Buffer
	limit int
	over  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); room < len(p) {
		b.over = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte { return b.buf.Bytes() }

// WatchConfig configures Watch.
type WatchConfig struct {
	// Interval between discoveries. Default 1 s, as Horovod.
	Interval time.Duration
	// Cooldown of a blacklisted host; zero: blacklisted for good.
	Cooldown Cooldown
}

// Watcher runs a Discovery every Interval and reports the changes.
type Watcher struct {
	d       Discovery
	cfg     WatchConfig
	changes chan Change
	done    chan struct{}

	mu  sync.Mutex
	set *Set
}

// Watch runs d once and returns the hosts it found; a failure then is an
// error (a misconfigured discovery fails the job at once, as in Horovod).
// Afterwards d runs every Interval until ctx ends, and each change — and
// each failed run, whose hosts stay as they were — arrives on Changes.
func Watch(ctx context.Context, d Discovery, cfg WatchConfig) (*Watcher, []Host, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	set, err := NewSet(cfg.Cooldown)
	if err != nil {
		return nil, nil, err
	}
	found, err := d.Discover(ctx)
	if err != nil {
		return nil, nil, err
	}
	set.Update(found, time.Now())
	w := &Watcher{d: d, cfg: cfg, set: set, changes: make(chan Change), done: make(chan struct{})}
	go w.run(ctx)
	return w, set.Hosts(), nil
}

// Changes delivers each change; it is closed when the watch ends. The
// watcher waits for each change to be taken before discovering again.
func (w *Watcher) Changes() <-chan Change { return w.changes }

// Done is closed when the watch has ended (its context ended).
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Hosts returns the usable hosts now, in assignment order.
func (w *Watcher) Hosts() []Host {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.set.Hosts()
}

// Blacklist takes a failing host out of use, for the cooldown or for good,
// and returns the change (also when nothing changed: it was blacklisted
// already) and until when (zero: for good). The change is not sent on
// Changes: the caller has it.
func (w *Watcher) Blacklist(name string) (Change, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.set.Blacklist(name, time.Now())
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer close(w.changes)
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		found, err := w.d.Discover(ctx)
		if ctx.Err() != nil {
			return
		}
		var c Change
		w.mu.Lock()
		if err != nil {
			c = Change{Hosts: w.set.Hosts(), Err: err}
		} else {
			c = w.set.Update(found, time.Now())
		}
		w.mu.Unlock()
		if c.Empty() {
			continue
		}
		select {
		case w.changes <- c:
		case <-ctx.Done():
			return
		}
	}
}
