package shm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
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
