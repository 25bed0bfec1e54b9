package testdaemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a daemon started by Start.
type Proc struct {
	Name string
	Log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// Start runs argv with env (nil: this process's environment) and its output
// in logPath. The daemon gets SIGKILL if this process dies first.
func Start(name string, argv []string, env []string, logPath string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: a test binary killed by its timeout must not leave daemons
	// behind on a shared machine.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the daemon's process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the daemon has exited.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// Err is how the daemon exited (call after Exited is closed).
func (p *Proc) Err() error { return p.err }

// Stop sends SIGTERM, waits up to grace, then SIGKILL, and waits for the exit.
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for %v and was killed", p.Name, p.PID(), grace)
}

// Tail returns the last n bytes of the daemon's log, for error messages.
func (p *Proc) Tail(n int) string { return TailFile(p.Log, n) }

// TailFile returns the last n bytes of a file.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// WaitFor calls check every interval until it returns nil, ctx ends, or one
// of the daemons exits; the error names what was last wrong.
func WaitFor(ctx context.Context, interval time.Duration, check func() error, daemons ...*Proc) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		for _, d := range daemons {
			select {
			case <-d.done:
				return fmt.Errorf("%s exited (%v) while waiting: %w; its log ends:\n%s", d.Name, d.err, err, d.Tail(2000))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// ErrPortTaken marks a start that failed because a port picked free was
// bound by another process before the daemon bound it.
var ErrPortTaken = errors.New("a daemon's port was taken")

// RetryPortTaken calls start up to attempts times while it fails with
// ErrPortTaken (and ctx lasts).
func RetryPortTaken[T any](ctx context.Context, attempts int, start func() (T, error)) (T, error) {
	var v T
	var err error
	for range attempts {
		if v, err = start(); err == nil || !errors.Is(err, ErrPortTaken) || ctx.Err() != nil {
			return v, err
		}
	}
	return v, err
}

// FreePorts returns n TCP ports that were free on every address a moment
// ago. A daemon that loses the race fails to bind; harnesses retry.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	for range n {
		l, err := listenTCP()
		if err != nil {
			return nil, err
		}
		closers = append(closers, l.Close)
		ports = append(ports, l.Port)
	}
	return ports, nil
}

// Marker is what only one harness's processes carry: an environment entry
// ("NAME=value"), an open unix socket bound under a directory, or a string in
// their command line. Harnesses use their own temporary directory in each.
type Marker struct {
	Env       string
	SocketDir string
	Cmdline   string
}

// Marked returns the pids of the processes, other than this one, that carry
// the marker.
func Marked(m Marker) []int {
	var sockInodes map[string]bool
	if m.SocketDir != "" {
		sockInodes = unixSocketInodes(m.SocketDir)
	}
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if m.Env != "" && hasEnv(pid, m.Env) || len(sockInodes) > 0 && holdsSocket(pid, sockInodes) ||
			m.Cmdline != "" && strings.Contains(cmdline(pid), m.Cmdline) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func hasEnv(pid int, entry string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if string(kv) == entry {
			return true
		}
	}
	return false
}

// unixSocketInodes lists the inodes of the unix sockets bound to paths under
// dir, from /proc/net/unix.
func unixSocketInodes(dir string) map[string]bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil
	}
	prefix := filepath.Clean(dir) + "/"
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// Num RefCount Protocol Flags Type St Inode Path
		if len(f) >= 8 && strings.HasPrefix(f[7], prefix) {
			inodes[f[6]] = true
		}
	}
	return inodes
}

func holdsSocket(pid int, inodes map[string]bool) bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
			return true
		}
	}
	return false
}

// KillMarked SIGKILLs the processes Marked finds and returns an error naming
// them (nil when there were none): a harness calls it last, and whatever it
// finds is something its Stop failed to end properly.
func KillMarked(m Marker) error {
	pids := Marked(m)
	if len(pids) == 0 {
		return nil
	}
	var names []string
	for _, pid := range pids {
		names = append(names, fmt.Sprintf("%d (%s)", pid, cmdline(pid)))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return errors.New("processes left behind, killed: " + strings.Join(names, ", "))
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

type portListener struct {
	Port  int
	Close func() error
}

// listenTCP takes a port on every address (as daemons bind it: 0.0.0.0).
func listenTCP() (portListener, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return portListener{}, err
	}
	return portListener{Port: l.Addr().(*net.TCPAddr).Port, Close: l.Close}, nil
}
