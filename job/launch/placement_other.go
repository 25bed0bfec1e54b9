//go:build !linux

package launch

import (
	"errors"
	"os/exec"
)

func allowedCPUs() ([]int, error) {
	return nil, errors.New("launch: CPU placement is implemented on Linux only")
}

func startOn(cmd *exec.Cmd, cpus []int) error { return cmd.Start() }
