package e2e

import (
	"os"
	"strings"
)

// LoadAverage is /proc/loadavg's first three fields, for the logs of
// timings taken on a shared machine.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
