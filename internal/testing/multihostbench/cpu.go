package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go runs on here.
const clockTicks = 100

// cpuWatch measures the CPU a run's ranks use: the CPU time of the worker
// hosts' processes from its start to its stop, and the whole machine's
// busy share over the same time (which includes every other process on
// the machine, other agents' too).
//
// A process's CPU time goes, once it exits and is waited for, into its
// parent's (cutime, cstime), and the hosts' sshd daemons, which start
// every rank's session, outlive the run: so the sum over the processes
// alive at the end of utime+stime+cutime+cstime, less that sum at the
// start, counts every process of the run once. Kernel work done in
// interrupt context (the network stack, the shaping) is not charged to
// any process; the machine's share shows it.
type cpuWatch struct {
	hosts   []*testhosts.Host
	t0      time.Time
	ticks0  uint64
	busy0   uint64
	total0  uint64
	invalid error
}

func startCPUWatch(hosts []*testhosts.Host) *cpuWatch {
	w := &cpuWatch{hosts: hosts, t0: time.Now()}
	w.ticks0, w.invalid = hostTicks(hosts)
	if w.invalid == nil {
		w.busy0, w.total0, w.invalid = machineTicks()
	}
	return w
}

// stop returns the cores the hosts' processes used on average since
// start, and the machine's busy share (0-1); zeros when they could not be
// read.
func (w *cpuWatch) stop() (rankCores, machineBusy float64) {
	if w.invalid != nil {
		fmt.Fprintf(os.Stderr, "multihost: CPU use not measured: %v\n", w.invalid)
		return 0, 0
	}
	wall := time.Since(w.t0).Seconds()
	ticks, err := hostTicks(w.hosts)
	if err != nil {
		return 0, 0
	}
	busy, total, err := machineTicks()
	if err != nil || total == w.total0 || ticks < w.ticks0 {
		return 0, 0
	}
	return float64(ticks-w.ticks0) / clockTicks / wall, float64(busy-w.busy0) / float64(total-w.total0)
}

// hostTicks sums utime, stime, cutime and cstime over the hosts' processes.
func hostTicks(hosts []*testhosts.Host) (uint64, error) {
	var sum uint64
	for _, h := range hosts {
		pids, err := h.Processes()
		if err != nil {
			return 0, err
		}
		for _, pid := range pids {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil {
				continue // exited meanwhile: its parent has its time
			}
			t, err := procTicks(string(b))
			if err != nil {
				return 0, fmt.Errorf("pid %d: %w", pid, err)
			}
			sum += t
		}
	}
	return sum, nil
}

// procTicks reads utime+stime+cutime+cstime from a /proc/PID/stat line.
func procTicks(stat string) (uint64, error) {
	// The command name (field 2) may hold spaces; the rest follows its ")".
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("unreadable stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime..cstime are fields 14-17.
	if len(f) < 15 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	var sum uint64
	for _, s := range f[11:15] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		if v > 0 {
			sum += uint64(v)
		}
	}
	return sum, nil
}

// machineTicks reads the machine's busy and total CPU time from /proc/stat.
func machineTicks() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("unreadable /proc/stat: %q", line)
	}
	// user nice system idle iowait irq softirq steal
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total, nil
}
