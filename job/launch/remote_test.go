package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
	"github.com/gorovod/gorovod/job/rendezvous"
	"golang.org/x/sys/unix"
)

// The remote tests run workers on hosts of a testhosts.Net over its sshd, on
// a port other than 22 (so -p is exercised). The launcher runs in this test
// process, its ssh client on the first host (the "head").

const testSSHPort = 2222

func remoteHosts(t *testing.T, k int) (*testhosts.Net, []*testhosts.Host, SSH) {
	t.Helper()
	n, hs := testhosts.NewHosts(t, testhosts.Config{SSHPort: testSSHPort}, k)
	return n, hs, sshVia(t, n, hs[0])
}

// sshVia is the SSH configuration a user of the hosts would give, with the
// client run on host from.
func sshVia(t *testing.T, n *testhosts.Net, from *testhosts.Host) SSH {
	t.Helper()
	prefix, err := from.Exec()
	if err != nil {
		t.Fatal(err)
	}
	return SSH{
		Command: append(prefix, "ssh", "-F", "none"), Port: n.SSHPort(), IdentityFile: n.ClientKey(), User: "root",
		KnownHostsFile: n.KnownHostsFile(), StrictHostKeyChecking: "yes", Options: []string{"GlobalKnownHostsFile=/dev/null"},
		ConnectTimeout: 5 * time.Second, StartTimeout: 20 * time.Second,
	}
}

func childEnv(mode string) func(int) []string {
	return func(int) []string { return []string{envChild + "=" + mode} }
}

// waitLines waits until every worker in idx printed want on stdout.
func waitLines(t *testing.T, j *Job, l *lines, want string, idx ...int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l.mu.Lock()
		ok := true
		for _, i := range idx {
			ok = ok && slices.Contains(l.by[fmt.Sprintf("%d/stdout", i)], want)
		}
		l.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("workers %v never printed %q; output %v; errors %v", idx, want, l.by, j.Errors())
		}
		select {
		case <-j.Done():
			t.Fatalf("workers ended before printing %q: %v; output %v", want, j.Wait(), l.by)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitGone waits until the process pid (of this kernel: the hosts share it)
// has exited.
func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(within)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Fatalf("process %d (%q) still runs after %v", pid, cmd, within)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) { // the runtime's signals interrupt poll
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
}

// TestRemoteWorkers: workers on two other hosts find each other through a
// rendezvous on the head, get their environment (the job secret included)
// through ssh's stdin, run on the host they were placed on with GOMAXPROCS
// sized for its slots, and their output comes back per worker and stream.
func TestRemoteWorkers(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 3)
	ln, err := hs[0].Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	rdv, err := rendezvous.Serve(ln, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	secret := NewSecret()
	place := []string{hs[1].Name, hs[1].Name, hs[2].Name}
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{
		Argv: []string{os.Args[0]}, NP: 3, Output: l.out, StopGrace: time.Second, SSH: ssh,
		Host:      func(i int) string { return place[i] },
		HostSlots: func(h string) int { return map[string]int{hs[1].Name: 2, hs[2].Name: 1}[h] },
		Env: func(i int) []string {
			w := envconfig.Worker{JobID: "remote-test", Rank: i, Size: 3, Secret: secret, Rendezvous: rdv.Addr()}
			return append(w.Environ(), envChild+"=hello")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err != nil {
		t.Fatalf("%v; output %v", err, l.by)
	}
	for r := range 3 {
		gmp := max(1, runtime.NumCPU()/map[int]int{0: 2, 1: 2, 2: 1}[r])
		want := fmt.Sprintf("rank %d of 3 sees addr-0,addr-1,addr-2 GOMAXPROCS=%d OMP_NUM_THREADS=%d", r, gmp, gmp)
		if out := l.by[fmt.Sprintf("%d/stdout", r)]; len(out) != 1 || out[0] != want {
			t.Errorf("worker %d stdout %q, want %q", r, out, want)
		}
		// The remote login shell's start-up files may write to stderr
		// before the worker runs (this machine's ~/.bashrc runs `pyenv
		// rehash`, which complains when three shells start at once); the
		// worker's own line comes last, once.
		if out := l.by[fmt.Sprintf("%d/stderr", r)]; len(out) == 0 || out[len(out)-1] != "no newline at the end" || slices.Index(out, "no newline at the end") != len(out)-1 {
			t.Errorf("worker %d stderr %q, want it to end with the worker's line", r, out)
		}
		if j.Host(r) != place[r] {
			t.Errorf("worker %d on %q, want %q", r, j.Host(r), place[r])
		}
	}

	// Where they ran, and in which directory.
	l = &lines{by: map[string][]string{}}
	ssh.Dir = "/tmp"
	j, err = Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 2, Output: l.out, SSH: ssh,
		Host: func(i int) string { return place[i+1] }, Env: childEnv("whoami")})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, pid := range j.PIDs() {
		out := l.by[fmt.Sprintf("%d/stdout", i)]
		want := fmt.Sprintf("host %s gomaxprocs %d dir /tmp pid %d", place[i+1], runtime.NumCPU(), pid)
		if len(out) != 1 || out[0] != want {
			t.Errorf("worker %d printed %q, want %q", i, out, want)
		}
	}
}

// TestRemoteExitStatus: a remote worker's exit status, and the signal that
// killed one, come back as they would for a local worker.
func TestRemoteExitStatus(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 2, Output: l.out, SSH: ssh,
		Host: func(int) string { return hs[1].Name },
		Env: func(i int) []string {
			w := envconfig.Worker{JobID: "x", Rank: i, Size: 2, Secret: NewSecret(), Rendezvous: "127.0.0.1:1"}
			return append(w.Environ(), envChild+"=fail-odd")
		}})
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Wait()
	errs := j.Errors()
	var re *RemoteExit
	if errs[0] != nil || !errors.As(errs[1], &re) || re.Code != 7 || re.Host != hs[1].Name {
		t.Fatalf("errors %v, want worker 1 to exit 7 on %s", errs, hs[1])
	}
	if !strings.Contains(errs[1].Error(), "exit status 7 on "+hs[1].Name) {
		t.Errorf("error reads %q", errs[1])
	}
	if got := l.by["1/stderr"]; !slices.Contains(got, "odd rank failing") {
		t.Errorf("worker 1 stderr %q", got)
	}

	j, err = Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out, SSH: ssh,
		Host: func(int) string { return hs[1].Name }, Env: childEnv("hang")})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, j, l, "ready", 0)
	if err := j.SignalWorker(0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = j.Wait()
	var ee *WorkerError
	if !errors.As(err, &ee) {
		t.Fatalf("killed worker: %v", err)
	}
	if sig, ok := ee.Signal(); !ok || sig != syscall.SIGKILL {
		t.Errorf("killed worker: %v, Signal() = %v, %v", err, sig, ok)
	}
}

// TestRemoteSignals: signals reach the remote worker itself, including
// SIGSTOP and SIGCONT, and SIGINT is not ignored there.
func TestRemoteSignals(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out, SSH: ssh,
		Host: func(int) string { return hs[1].Name }, Env: childEnv("signals")})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, j, l, "ready", 0)
	pid := j.PIDs()[0]
	state := func() string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		return f[0]
	}
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGINT} {
		if err := j.SignalWorker(0, sig); err != nil {
			t.Fatal(err)
		}
		waitLines(t, j, l, "got "+sig.String(), 0)
	}
	if err := j.SignalWorker(0, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); state() != "T"; {
		if time.Now().After(deadline) {
			t.Fatalf("worker state %s after SIGSTOP", state())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := j.SignalWorker(0, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := j.SignalWorker(0, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err != nil {
		t.Fatalf("worker left with %v; output %v", err, l.by)
	}
}

// TestRemoteStop: cancelling the launch stops remote workers with the stop
// signal, and SIGKILL after the grace for one that ignores it; nothing is left
// on the host.
func TestRemoteStop(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	before, _ := hs[1].Processes()
	l := &lines{by: map[string][]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	modes := []string{"hang", "ignore-term"}
	j, err := Start(ctx, Spec{Argv: []string{os.Args[0]}, NP: 2, Output: l.out, SSH: ssh, StopGrace: time.Second,
		Host: func(int) string { return hs[1].Name }, Env: func(i int) []string { return []string{envChild + "=" + modes[i]} }})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, j, l, "ready", 0, 1)
	pids := j.PIDs()
	t0 := time.Now()
	cancel()
	select {
	case <-j.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("cancel did not stop the remote workers")
	}
	t.Logf("stopped in %v", time.Since(t0).Round(time.Millisecond))
	for i, want := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		var ee *WorkerError
		err := j.Errors()[i]
		if !errors.As(err, &ee) {
			t.Errorf("worker %d: %v", i, err)
			continue
		}
		if sig, ok := ee.Signal(); !ok || sig != want {
			t.Errorf("worker %d (%s) ended with %v, want %v", i, modes[i], err, want)
		}
	}
	for _, pid := range pids {
		waitGone(t, pid, 5*time.Second)
	}
	// The shim's helpers end too (the watcher, once the worker's group is
	// empty or killed).
	for deadline := time.Now().Add(10 * time.Second); ; {
		after, _ := hs[1].Processes()
		if len(after) == len(before) {
			break
		}
		if time.Now().After(deadline) {
			var left []string
			for _, p := range after {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				left = append(left, fmt.Sprintf("%d %.80q", p, cmd))
			}
			t.Fatalf("processes on %s: %v before the job, %v after", hs[1], before, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRemoteLauncherKilled: kill -9 of the launcher closes ssh's stdin
// without a "stop": a worker that writes to the connection is stopped (the
// shim kills its group), one with output files on its host runs on and
// goes on writing them.
func TestRemoteLauncherKilled(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	for _, tc := range []struct {
		name  string
		files bool
	}{
		{"output to the connection", false},
		{"output files on the host", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := ""
			if tc.files {
				out = filepath.Join(t.TempDir(), "jobdir", "worker-0")
			}
			launcher, pid := remoteLauncher(t, ssh, hs[1].Name, out)
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("remote worker %d not running: %v", pid, err)
			}
			t0 := time.Now()
			if err := launcher.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			if !tc.files {
				waitGone(t, pid, 10*time.Second)
				t.Logf("remote worker gone %v after the launcher was killed", time.Since(t0).Round(time.Millisecond))
				return
			}
			_ = launcher.Wait()
			killed := ticks(t, out+".stdout")
			// Alive and writing: 25 more ticks (20 ms apart) after its launcher died.
			for deadline := time.Now().Add(30 * time.Second); ticks(t, out+".stdout") < killed+25; {
				if time.Now().After(deadline) {
					b, _ := os.ReadFile(out + ".stderr")
					t.Fatalf("the worker stopped writing its output file after its launcher died (%d ticks); stderr: %s", ticks(t, out+".stdout"), b)
				}
				time.Sleep(20 * time.Millisecond) // a file another process writes: nothing to wait on
			}
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("remote worker %d gone after its launcher died: %v", pid, err)
			}
			for _, f := range []string{out + ".stdout", out + ".stderr", filepath.Dir(out)} {
				fi, err := os.Stat(f)
				want := os.FileMode(0o600)
				if f == filepath.Dir(out) {
					want = 0o700
				}
				if err != nil || fi.Mode().Perm() != want {
					t.Errorf("%s: %v (%v), want mode %v", f, fi.Mode().Perm(), err, want)
				}
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitGone(t, pid, 10*time.Second)
		})
	}
}

// remoteLauncher starts a launcher process (this test binary) that runs a
// remote "tick" worker on host, with output files at the prefix out unless
// it is "", and returns it and the worker's pid once the worker runs. The
// test's end kills both.
func remoteLauncher(t *testing.T, ssh SSH, host, out string) (*exec.Cmd, int) {
	t.Helper()
	cfg, _ := json.Marshal(remoteLauncherConfig{SSH: ssh, Host: host, OutputFiles: out})
	launcher := exec.Command(os.Args[0])
	launcher.Env = append(os.Environ(), envChild+"=launcher", "LAUNCH_TEST_REMOTE="+string(cfg))
	launcher.Stderr = os.Stderr
	stdout, err := launcher.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = launcher.Process.Kill(); _ = launcher.Wait() })
	sc := bufio.NewScanner(stdout)
	var pid int
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "remote pid "); ok {
			pid, _ = strconv.Atoi(p)
			break
		}
	}
	if pid == 0 {
		t.Fatal("the launcher did not report its worker")
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // started (through ssh) by this test
	return launcher, pid
}

// orphanWorker starts a remote "tick" worker with output files under a
// launcher process, kills the launcher (kill -9), and returns the worker's
// pid and output files' prefix: a worker whose launcher died.
func orphanWorker(t *testing.T, ssh SSH, host string) (int, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "jobdir", "worker-0")
	launcher, pid := remoteLauncher(t, ssh, host, out)
	_ = launcher.Process.Kill()
	_ = launcher.Wait()
	return pid, out
}

// TestFollowRemote adopts a remote worker whose launcher died
// (FollowRemote): its new lines come back, ending the context stops it
// (stop signal to its group), the connection's stdin closing without "stop"
// (the new launcher died too) leaves it running, and a worker that exits by
// itself ends the process with its status unknown; a pid that is not the
// job's worker of that index is refused.
func TestFollowRemote(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	for _, tc := range []struct {
		name  string
		index int
		how   string // "stop": the context ends; "kill": the worker dies by itself; "hangup": stdin closes, then "kill"
	}{
		{"stopped by its new launcher", 0, "stop"},
		{"exits by itself", 0, "kill"},
		{"runs on when stdin closes without stop", 0, "hangup"},
		{"another worker's index", 5, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid, out := orphanWorker(t, ssh, hs[1].Name)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var o remoteOutput
			p, err := FollowRemote(ctx, FollowSpec{Host: hs[1].Name, PID: pid, JobID: "follow-test", Index: tc.index, OutputFiles: out,
				SSH: ssh, StopGrace: time.Second, Output: o.add})
			if err != nil {
				t.Fatal(err)
			}
			if tc.how == "" {
				select {
				case <-p.Done():
				case <-time.After(30 * time.Second):
					t.Fatal("following the wrong worker did not fail")
				}
				var he *HostError
				if err := p.Err(); !errors.As(err, &he) || !strings.Contains(err.Error(), "not worker 5 of job follow-test") {
					t.Errorf("following pid %d as worker 5: %v, want a HostError saying it is not", pid, err)
				}
				if err := syscall.Kill(pid, 0); err != nil {
					t.Errorf("the worker is gone after a refused adoption: %v", err)
				}
				return
			}
			o.wait(t, 5, p)
			if p.PID() != pid {
				t.Errorf("PID %d, want %d", p.PID(), pid)
			}
			if tc.how == "hangup" {
				p.r.wmu.Lock()
				err := p.r.stdin.Close()
				p.r.wmu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				hungUp := ticks(t, out+".stdout")
				// Alive and writing: 25 more ticks (20 ms apart) after its stdin closed.
				for deadline := time.Now().Add(30 * time.Second); ticks(t, out+".stdout") < hungUp+25; {
					if time.Now().After(deadline) {
						t.Fatalf("the adopted worker stopped writing once the follower's stdin closed (%d ticks, %d before): %v",
							ticks(t, out+".stdout"), hungUp, p.Err())
					}
					time.Sleep(20 * time.Millisecond) // a file another process writes: nothing to wait on
				}
			}
			if tc.how == "stop" {
				cancel()
			} else if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(15 * time.Second):
				t.Fatal("the adopted worker's end not seen")
			}
			t.Logf("end: %v; stderr %q", p.Err(), p.r.stderr)
			waitGone(t, pid, 5*time.Second)
			if err := p.Err(); !errors.Is(err, ErrExitUnknown) {
				t.Errorf("end of an adopted worker: %v, want ErrExitUnknown", err)
			}
			got := o.lines()
			if !strings.HasPrefix(got[0], "stdout:tick ") {
				t.Errorf("first line %q, want a tick written after the adoption", got[0])
			}
		})
	}
}

// remoteOutput gathers a remote worker's lines, as "stream:line", from its
// Output function (add).
type remoteOutput struct {
	mu  sync.Mutex
	got []string
}

func (o *remoteOutput) add(stream string, line []byte) {
	o.mu.Lock()
	o.got = append(o.got, stream+":"+string(line))
	o.mu.Unlock()
}

func (o *remoteOutput) lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

// wait waits until n lines have come from p's worker.
func (o *remoteOutput) wait(t *testing.T, n int, p *RemoteProcess) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(o.lines()) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines from the worker on %s, want %d: %v", len(o.lines()), p.Host(), n, p.Err())
		}
		time.Sleep(10 * time.Millisecond) // lines arrive on the process's own goroutines: polled with a deadline
	}
}

// ticks counts the "tick" lines in file.
func ticks(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "tick ")
}

// TestRemoteStopWithOutputFiles: a worker with output files on its host
// still stops when its launcher stops it (the "stop" line), and its lines
// come back over the connection as without them.
func TestRemoteStopWithOutputFiles(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	out := filepath.Join(t.TempDir(), "worker-0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var o remoteOutput
	p, err := StartRemote(ctx, RemoteSpec{Host: hs[1].Name, Argv: []string{os.Args[0]}, Env: []string{envChild + "=tick"},
		SSH: ssh, StopGrace: time.Second, OutputFiles: out, Output: o.add})
	if err != nil {
		t.Fatal(err)
	}
	o.wait(t, 5, p)
	pid := p.PID()
	cancel()
	select {
	case <-p.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("cancel did not stop the remote worker")
	}
	waitGone(t, pid, 5*time.Second)
	var re *RemoteExit
	if err := p.Err(); !errors.As(err, &re) {
		t.Fatalf("stopped worker: %v, want its exit status", err)
	}
	if sig, ok := re.Signal(); !ok || sig != syscall.SIGTERM {
		t.Errorf("stopped worker ended with %v, want SIGTERM", p.Err())
	}
	got := o.lines()
	if got[0] != "stdout:ready" || !strings.HasPrefix(got[1], "stdout:tick ") {
		t.Errorf("lines %q, want ready then ticks", got[:2])
	}
	for _, l := range got {
		if strings.Contains(l, "gorovod-shim") {
			t.Errorf("a shim line reached the output: %q", l)
		}
	}
	b, err := os.ReadFile(out + ".stdout")
	if err != nil || !strings.HasPrefix(string(b), "ready\ntick 0\n") {
		t.Errorf("output file: %q (%v)", b, err)
	}
}

type remoteLauncherConfig struct {
	SSH         SSH
	Host        string
	OutputFiles string
}

// remoteLauncherChild launches one remote worker ("tick" with output files,
// else "hang"), prints its pid on its host, and waits to be killed.
func remoteLauncherChild() int {
	var cfg remoteLauncherConfig
	if err := json.Unmarshal([]byte(os.Getenv("LAUNCH_TEST_REMOTE")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	mode := "hang"
	if cfg.OutputFiles != "" {
		mode = "tick"
	}
	started := make(chan struct{}, 1)
	p, err := StartRemote(context.Background(), RemoteSpec{Host: cfg.Host, Argv: []string{os.Args[0]},
		Env: []string{envChild + "=" + mode, envconfig.EnvJobID + "=follow-test", envconfig.EnvLaunchIndex + "=0"},
		SSH: cfg.SSH, OutputFiles: cfg.OutputFiles,
		Output: func(stream string, line []byte) {
			if string(line) == "ready" {
				started <- struct{}{}
			}
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	select {
	case <-started:
	case <-p.Done():
		fmt.Fprintln(os.Stderr, p.Err())
		return 5
	}
	fmt.Printf("remote pid %d\n", p.PID())
	<-p.Done()
	return 0
}

// TestRemoteLauncherHostDies: when every process of the launcher's host is
// killed (its ssh clients too), the connections drop and the remote workers
// stop; the launcher reports the lost connection as a HostError.
func TestRemoteLauncherHostDies(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out, SSH: ssh,
		Host: func(int) string { return hs[1].Name }, Env: childEnv("hang")})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, j, l, "ready", 0)
	pid := j.PIDs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs[0].KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, 10*time.Second)
	var he *HostError
	if err := j.Wait(); !errors.As(err, &he) || he.Host != hs[1].Name || !strings.Contains(err.Error(), "lost the connection") {
		t.Errorf("worker whose connection dropped: %v", err)
	}
}

// TestRemoteHostFailures: a host that cannot be reached, refuses, or is not
// who it claims gives a HostError naming it, within a bounded time.
func TestRemoteHostFailures(t *testing.T) {
	n, hs, ssh := remoteHosts(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hs[1].KillAll(ctx); err != nil { // no sshd: connection refused
		t.Fatal(err)
	}
	if err := hs[2].SetLink(false); err != nil { // unplugged: silence
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, host string
		ssh        func(SSH) SSH
		want       string
	}{
		{"refused", hs[1].Name, func(s SSH) SSH { return s }, "Connection refused"},
		{"unreachable", hs[2].Name, func(s SSH) SSH { s.ConnectTimeout = time.Second; return s }, "timed out"},
		{"unknown host key", hs[3].Name, func(s SSH) SSH { s.KnownHostsFile = empty; return s }, "Host key verification failed"},
		{"no such host", "nosuchhost", func(s SSH) SSH { return s }, "nosuchhost"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := &lines{by: map[string][]string{}}
			s := c.ssh(ssh)
			t0 := time.Now()
			j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out, SSH: s,
				Host: func(int) string { return c.host }, Env: childEnv("hang")})
			if err != nil {
				t.Fatal(err)
			}
			err = j.Wait()
			took := time.Since(t0)
			var he *HostError
			if !errors.As(err, &he) || he.Host != c.host || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want a HostError for %s mentioning %q", err, c.host, c.want)
			}
			if limit := s.ConnectTimeout + 5*time.Second; took > limit {
				t.Errorf("took %v, more than %v", took, limit)
			}
			t.Logf("%v after %v", err, took.Round(time.Millisecond))
		})
	}
	_ = n
}

// TestRemoteStartTimeout: a host too slow to start the worker (every packet
// it sends takes 3 s) is given up after StartTimeout, and the connection with
// it, so nothing starts there later.
func TestRemoteStartTimeout(t *testing.T) {
	if err := testhosts.CanImpair(); err != nil {
		t.Skip(err)
	}
	_, hs, ssh := remoteHosts(t, 2)
	if err := hs[1].Impair(testhosts.Impairment{Delay: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ssh.StartTimeout = time.Second
	l := &lines{by: map[string][]string{}}
	t0 := time.Now()
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out, SSH: ssh,
		Host: func(int) string { return hs[1].Name }, Env: childEnv("hang")})
	if err != nil {
		t.Fatal(err)
	}
	err = j.Wait()
	took := time.Since(t0)
	var he *HostError
	if !errors.As(err, &he) || he.Host != hs[1].Name || !strings.Contains(err.Error(), "did not start within 1s") {
		t.Errorf("got %v, want a HostError: did not start within 1s", err)
	}
	if took > 5*time.Second {
		t.Errorf("gave up after %v", took)
	}
	if err := hs[1].Impair(testhosts.Impairment{}); err != nil {
		t.Fatal(err)
	}
	// Nothing of the job runs on the host: what it started, if anything, went
	// with the dropped connection.
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, _ := hs[1].Processes()
		var stray []string
		for _, p := range pids {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if strings.Contains(string(cmd), "gorovod-shim") || strings.Contains(string(cmd), filepath.Base(os.Args[0])) {
				stray = append(stray, fmt.Sprintf("%d %q", p, cmd))
			}
		}
		if len(stray) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left on %s: %v", hs[1], stray)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSecretNeverOnACommandLine: while remote workers run, no process on any
// host, nor here, has the job secret in its command line.
func TestSecretNeverOnACommandLine(t *testing.T) {
	_, hs, ssh := remoteHosts(t, 2)
	secret := NewSecret()
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 2, Output: l.out, SSH: ssh, StopGrace: time.Second,
		Host: func(int) string { return hs[1].Name },
		Env: func(i int) []string {
			w := envconfig.Worker{JobID: "x", Rank: i, Size: 2, Secret: secret, Rendezvous: "127.0.0.1:1"}
			return append(w.Environ(), envChild+"=hang")
		}})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, j, l, "ready", 0, 1)
	hexSecret := fmt.Sprintf("%x", secret)
	entries, _ := os.ReadDir("/proc")
	checked := 0
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		checked++
		if strings.Contains(string(cmdline), hexSecret) {
			t.Errorf("process %s has the secret on its command line: %q", e.Name(), cmdline)
		}
	}
	// The workers did get it.
	for _, pid := range j.PIDs() {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if !strings.Contains(string(env), envconfig.EnvSecret+"="+hexSecret) {
			t.Errorf("worker %d has no secret in its environment", pid)
		}
	}
	t.Logf("checked %d command lines", checked)
	j.Signal(syscall.SIGKILL)
	_ = j.Wait()
}
