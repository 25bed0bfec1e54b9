package e2e

import (
	"fmt"
	"os"
	"strings"
)

// ProcessGone says whether pid has exited (a zombie has).
func ProcessGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// "pid (comm) S ...": the state follows the command's closing paren.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 < len(s) && s[i+2] == 'Z'
}
