//go:build unix

package sync

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU is the CPU time this process has used so far, user and
// system, all threads (0 when the system will not say). The difference
// over a world's entry is the CPU the entry cost this worker: on a machine
// whose cores are shared by more processes than it has, a far steadier
// figure than the wall time, which mostly waits for a core.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
