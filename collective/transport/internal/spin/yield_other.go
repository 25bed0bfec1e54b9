//go:build !linux

package spin

func yieldCPU() {}
