package spin

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// HostCPUs is how many CPUs the ranks of this host share: the CPUs online. Not
// this process's: a launcher may have pinned it to its own share of them
// (launch.PlaceBalanced), which says nothing about how many ranks share the
// rest. In a container limited to a cpuset this counts the host's CPUs.
func HostCPUs() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		if n := countCPUList(strings.TrimSpace(string(b))); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a kernel CPU list ("0-3,8,10-11"); 0 when
// it cannot be read.
func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
