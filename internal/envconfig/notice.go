package envconfig

import (
	"fmt"
	"time"
)

// EnvLeaveNotice is how long a worker has, from its leave signal (SIGTERM),
// until it must be gone, as a Go duration ("25s"): the launcher sets it from
// what the cluster gives (Slurm's KillWait, a pod's termination grace
// period) so that the trainer leaves before the SIGKILL that follows.
const EnvLeaveNotice = "GOROVOD_LEAVE_NOTICE"

// MaxLeaveNotice bounds EnvLeaveNotice: a notice of hours is a typo.
const MaxLeaveNotice = time.Hour

// LeaveNotice reads EnvLeaveNotice; ok is false when it is unset.
func LeaveNotice(getenv func(string) string) (d time.Duration, ok bool, err error) {
	v := getenv(EnvLeaveNotice)
	if v == "" {
		return 0, false, nil
	}
	d, err = time.ParseDuration(v)
	if err != nil || d <= 0 || d > MaxLeaveNotice {
		return 0, false, fmt.Errorf("envconfig: %s=%q: want a duration between 0 and %v, such as 25s", EnvLeaveNotice, v, MaxLeaveNotice)
	}
	return d, true, nil
}

// DriverInterfaces reads EnvNetworkInterface for a driver (gorovod run):
// the interfaces whose address it binds its gossip to when its workers run
// on other hosts ("" when unset).
func DriverInterfaces(getenv func(string) string) string { return getenv(EnvNetworkInterface) }
