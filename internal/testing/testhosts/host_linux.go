package testhosts

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Host is one machine of a Net.
type Host struct {
	// Name is the host's hostname, and its name in every host's /etc/hosts.
	Name string
	// Addr is its only address (on eth0, in 198.18.0.0/24).
	Addr netip.Addr

	net    *Net
	index  int
	ns     string // network namespace name
	nsPath string
	dir    string

	mu       sync.Mutex
	sshd     *exec.Cmd // the host's first process; its mount and UTS namespaces are the host's
	sshdDone chan struct{}
	delay    *delayer
	link     Link // as Shape set it
	removed  bool
}

// NetNS is the path of the host's network namespace (for `nsenter --net=`).
func (h *Host) NetNS() string { return h.nsPath }

// Net is the Net the host belongs to.
func (h *Host) Net() *Net { return h.net }

func (h *Host) String() string { return h.Name }

// sshdLog is where the host's sshd writes (every connection, every refusal).
func (h *Host) sshdLog() string { return filepath.Join(h.net.dir, h.Name+"-sshd.log") }

func (h *Host) writeSSHDConfig() error {
	n := h.net
	cfg := fmt.Sprintf(`# testhosts: %s
ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
StrictModes no
PidFile none
PrintMotd no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
# Jobs open one connection per worker, many at once.
MaxStartups 512
LogLevel INFO
`, h.ns, net.JoinHostPort(h.Addr.String(), strconv.Itoa(n.cfg.SSHPort)),
		filepath.Join(h.dir, "ssh_host_ed25519_key"), filepath.Join(n.dir, "authorized_keys"))
	return os.WriteFile(filepath.Join(h.dir, "sshd_config"), []byte(cfg), 0o600)
}

// hostInit runs as the host's first process: in new mount and UTS namespaces
// (entered by unshare, inside the host's network namespace) it gives the host
// its own /dev/shm, /etc/hosts and hostname, then becomes its sshd.
const hostInit = `set -e
mount -t tmpfs -o "size=$1,mode=1777" testhosts-shm /dev/shm
mount --bind "$2" /etc/hosts
hostname "$3"
exec ` + sshdPath + ` -D -e -f "$4"`

// Start brings up the host's sshd in fresh mount and UTS namespaces: after
// KillAll, this is the host booting again (its /dev/shm is empty). It returns
// once sshd accepts connections.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.removed {
		return fmt.Errorf("testhosts: %s was removed", h.Name)
	}
	if h.sshd != nil {
		select {
		case <-h.sshdDone:
		default:
			return fmt.Errorf("testhosts: %s is already running", h.Name)
		}
	}
	logf, err := os.OpenFile(h.sshdLog(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net="+h.nsPath, "--", "unshare", "--mount", "--uts", "--",
		"sh", "-c", hostInit, "testhosts-init", strconv.FormatInt(h.net.cfg.ShmBytes, 10), h.net.hostsFile,
		h.Name, filepath.Join(h.dir, "sshd_config"))
	// If this process dies without cleaning up, the host's sshd dies with it.
	// (The kernel sends it when the thread that started the child ends; Go
	// ends a thread only when a goroutine locked to it exits, which Do does
	// only if it cannot leave a namespace.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if !seen && strings.Contains(sc.Text(), "Server listening on") {
				seen = true
				close(ready)
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-ready:
		h.sshd, h.sshdDone = cmd, done
		return nil
	case <-done:
		return fmt.Errorf("sshd on %s exited at start (%v); its log: %s", h.Name, cmd.ProcessState, tail(h.sshdLog()))
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("sshd on %s did not start: %w; its log: %s", h.Name, ctx.Err(), tail(h.sshdLog()))
	}
}

// Running reports whether the host's sshd (its first process) is alive.
func (h *Host) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sshd == nil {
		return false
	}
	select {
	case <-h.sshdDone:
		return false
	default:
		return true
	}
}

// Exec returns the argv prefix that runs a program on this host (in its
// network, mount and UTS namespaces), in this process's working directory:
// append the program and its arguments. It fails while the host is down
// (after KillAll, before Start).
func (h *Host) Exec() ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sshd == nil || h.removed {
		return nil, fmt.Errorf("testhosts: %s is not running", h.Name)
	}
	select {
	case <-h.sshdDone:
		return nil, fmt.Errorf("testhosts: %s is not running (its processes were killed; Start it again)", h.Name)
	default:
	}
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	pid := strconv.Itoa(h.sshd.Process.Pid)
	return []string{"nsenter", "--net=" + h.nsPath, "--mount=/proc/" + pid + "/ns/mnt",
		"--uts=/proc/" + pid + "/ns/uts", "--wd=" + wd, "--"}, nil
}

// Command returns a command that runs name on this host. Its process is the
// program itself (nsenter executes it in place), so its pid, signals and exit
// status are the program's. While the host is down, Start returns the reason.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	prefix, err := h.Exec()
	if err != nil {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Err = err
		return cmd
	}
	argv := append(prefix, name)
	return exec.CommandContext(ctx, argv[0], append(argv[1:], args...)...)
}

// Run runs name on this host and returns its combined output; a failure's
// error includes the output.
func (h *Host) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := h.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %s %s: %w: %s", h.Name, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// SSH runs command on to over ssh from this host, as a user of the hosts
// would, and returns its combined output.
func (h *Host) SSH(ctx context.Context, to *Host, command string) ([]byte, error) {
	args := append(h.net.SSHArgs(), to.Name, command)
	return h.Run(ctx, "ssh", args...)
}

// Do runs fn on an OS thread inside the host's network namespace. Sockets
// fn creates stay in that namespace when used from anywhere later (a
// listener, a dialled connection); anything fn starts that creates sockets
// later (a goroutine, a library's background dialler) does not.
func (h *Host) Do(fn func() error) error {
	target, err := os.Open(h.nsPath)
	if err != nil {
		return err
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("testhosts: entering %s: %w", h.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and ends with this goroutine, so no other
			// goroutine runs in the wrong namespace.
			errc <- errors.Join(ferr, fmt.Errorf("testhosts: leaving %s: %w", h.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen listens on this host (address "" or ":0" means its address, any port).
func (h *Host) Listen(network, address string) (net.Listener, error) {
	address = h.localAddr(address)
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// ListenPacket opens a datagram socket on this host (address as for Listen).
func (h *Host) ListenPacket(network, address string) (net.PacketConn, error) {
	address = h.localAddr(address)
	var pc net.PacketConn
	err := h.Do(func() error {
		var err error
		pc, err = net.ListenPacket(network, address)
		return err
	})
	return pc, err
}

// localAddr turns "" or ":port" into this host's address and that port.
func (h *Host) localAddr(address string) string {
	if address == "" || strings.HasPrefix(address, ":") {
		port := strings.TrimPrefix(address, ":")
		if port == "" {
			port = "0"
		}
		address = net.JoinHostPort(h.Addr.String(), port)
	}
	return address
}

// Dial connects from this host.
func (h *Host) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Processes returns the pids of every process of this host: every process in
// its network namespace (sshd, what it started, what Command started).
func (h *Host) Processes() ([]int, error) {
	var st unix.Stat_t
	if err := unix.Stat(h.nsPath, &st); err != nil {
		return nil, err
	}
	return processesIn(st)
}

// KillAll kills every process of the host with SIGKILL and returns once they
// have all exited: the host is down (its sshd too) until Start. Its network
// namespace, link and impairments stay.
func (h *Host) KillAll(ctx context.Context) error {
	if err := killNetNS(ctx, h.nsPath); err != nil {
		return fmt.Errorf("testhosts: killing %s: %w", h.Name, err)
	}
	h.mu.Lock()
	done := h.sshdDone
	h.mu.Unlock()
	if done != nil {
		select {
		case <-done: // reaped, and its log closed
		case <-ctx.Done():
			return fmt.Errorf("testhosts: killing %s: sshd not reaped: %w", h.Name, ctx.Err())
		}
	}
	return nil
}

// SetLink plugs or unplugs the host's cable: the switch's end of its link goes
// down or up. Packets to and from the host are then dropped silently, as on a
// real partition; the host itself sees no error (its own end stays up).
func (h *Host) SetLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return run(ctx, "ip", "-n", h.net.sw, "link", "set", "v"+strconv.Itoa(h.index), state)
}

// processesIn lists the pids whose network namespace is ns.
func processesIn(ns unix.Stat_t) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if inNetNS(pid, ns) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// processesInRetry is processesIn, read again while ctx lasts when reading
// /proc fails: on a loaded CI machine getdents on /proc once failed with
// "not a directory" in a test's cleanup, which then failed the test.
func processesInRetry(ctx context.Context, ns unix.Stat_t) ([]int, error) {
	retry := time.NewTicker(20 * time.Millisecond)
	defer retry.Stop()
	for {
		pids, err := processesIn(ns)
		if err == nil {
			return pids, nil
		}
		select {
		case <-retry.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("listing the processes in the namespace: %w (%v)", err, ctx.Err())
		}
	}
}

func inNetNS(pid int, ns unix.Stat_t) bool {
	var st unix.Stat_t
	// Fails for exited processes (a zombie has no namespaces) and vanished ones.
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st); err != nil {
		return false
	}
	return st.Dev == ns.Dev && st.Ino == ns.Ino
}

// killNetNS sends SIGKILL to every process in the namespace at nsPath, through
// pidfds (so a recycled pid is never hit), and waits until they have exited;
// it scans again until none is left, for processes forked meanwhile.
func killNetNS(ctx context.Context, nsPath string) error {
	var ns unix.Stat_t
	if err := unix.Stat(nsPath, &ns); err != nil {
		return err
	}
	for {
		pids, err := processesInRetry(ctx, ns)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		var fds []unix.PollFd
		for _, pid := range pids {
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone already
			}
			if !inNetNS(pid, ns) { // the pid was recycled between the scan and the open
				unix.Close(fd)
				continue
			}
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				unix.Close(fd)
				return fmt.Errorf("kill -9 %d: %w", pid, err)
			}
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		err = waitExited(ctx, fds)
		for _, f := range fds {
			unix.Close(int(f.Fd))
		}
		if err != nil {
			return err
		}
	}
}

// waitExited waits until every pidfd is readable (its process has exited).
func waitExited(ctx context.Context, fds []unix.PollFd) error {
	for len(fds) > 0 {
		timeout := 100 // ms: poll returns then to look at ctx
		if _, err := unix.Poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		rest := fds[:0]
		for _, f := range fds {
			if f.Revents == 0 { // still running
				rest = append(rest, f)
			}
		}
		fds = rest
		if len(fds) > 0 && ctx.Err() != nil {
			return fmt.Errorf("%d processes still running: %w", len(fds), ctx.Err())
		}
	}
	return nil
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, " | ")
}
