//go:build !linux

package spin

import "runtime"

// HostCPUs is how many CPUs the ranks of this host share.
func HostCPUs() int { return runtime.NumCPU() }
