package launch

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// allowedCPUs lists the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("launch: reading this process's CPU affinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// startOn starts cmd with its CPU affinity set to cpus (all of them: nil).
// A child inherits the affinity of the thread that forks it, and os/exec
// forks on the calling thread: so the start runs on a thread of its own,
// narrowed to cpus, which ends with its goroutine (it is never unlocked), so
// no other goroutine ever runs on it.
func startOn(cmd *exec.Cmd, cpus []int) error {
	if cpus == nil {
		return cmd.Start()
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("setting CPU affinity %v: %w", cpus, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
