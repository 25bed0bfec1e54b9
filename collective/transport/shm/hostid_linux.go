package shm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HostID names the shared-memory domain of this process: two processes with the
// same HostID for the same dir can map each other's files in dir and wake each
// other through it. It hashes the kernel's boot id (the same in every container
// of a machine, different on every machine and after every reboot) with the
// device and inode of dir (the same exactly when both see the same memory file
// system, which containers with private /dev/shm mounts do not).
//
// When the boot id cannot be read, /etc/machine-id and the host name stand in
// for it; the setup still verifies that the peer can open the region, so a
// wrong guess costs a fallback, never a wrong link.
func HostID(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("shm: host identity: %w", err)
	}
	h := sha256.New()
	h.Write([]byte("gorovod-shm-host-v1\x00"))
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		h.Write([]byte(strings.TrimSpace(string(b))))
	} else {
		mid, _ := os.ReadFile("/etc/machine-id")
		name, _ := os.Hostname()
		if len(mid) == 0 && name == "" {
			return "", fmt.Errorf("shm: host identity: neither the boot id nor the machine id is readable")
		}
		fmt.Fprintf(h, "machine=%s host=%s", strings.TrimSpace(string(mid)), name)
	}
	fmt.Fprintf(h, "\x00dev=%d ino=%d", uint64(st.Dev), uint64(st.Ino))
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// hostCPUs is how many CPUs the ranks of this host share: the CPUs online. Not
// this process's: a launcher may have pinned it to its own share of them
// (launch.PlaceBalanced), which says nothing about how many ranks share the
// rest. In a container limited to a cpuset this counts the host's CPUs.
func hostCPUs() int {
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
