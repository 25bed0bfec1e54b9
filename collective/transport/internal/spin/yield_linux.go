package spin

import "golang.org/x/sys/unix"

// yieldCPU lets other processes waiting for this CPU run (sched_yield(2));
// without one it returns at once.
func yieldCPU() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
