package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DumpOnCancel makes cmd, when its context ends (a test's time limit),
// leave goroutine dumps before it is killed: SIGQUIT goes to its
// descendants first (the job's workers, whose stderr the launcher passes
// on), then, once they are gone (those still there after a few seconds are
// killed), to cmd itself; Go
// programs print every goroutine's stack on SIGQUIT and exit. Whatever is
// still running waitDelay later is killed. A hang in CI then says where it
// hung instead of only that it did.
func DumpOnCancel(cmd *exec.Cmd) {
	const waitDelay = 15 * time.Second
	cmd.WaitDelay = waitDelay
	cmd.Cancel = func() error {
		root := cmd.Process.Pid
		kids := descendants(root)
		for _, pid := range kids {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
		WaitGone(kids, 5*time.Second)
		for _, pid := range kids { // this test's processes, killed by pid
			if !ProcessGone(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = syscall.Kill(root, syscall.SIGQUIT)
		return nil
	}
}

// WaitGone waits until the processes pids have exited, at most limit.
func WaitGone(pids []int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		// Readable once the process has exited. The poll is asked again when
		// a signal interrupts it (the Go runtime's preemption signal does):
		// returning then would call a live process slow to exit.
		for {
			ms := time.Until(deadline).Milliseconds()
			if ms <= 0 {
				break
			}
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, int(ms)); err != unix.EINTR || n > 0 {
				break
			}
		}
		_ = unix.Close(fd)
	}
}

// descendants lists the processes below pid, deepest first.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// "pid (comm) S ppid ...": fields after the command's closing paren.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			walk(c)
			out = append(out, c)
		}
	}
	walk(pid)
	return out
}
