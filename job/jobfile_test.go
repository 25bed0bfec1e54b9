package job

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// deadPid is the pid of a process that has exited (and been reaped).
func deadPid(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

func TestReadJobFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	good := write("good.env", "GOROVOD_JOB_ID=j\nGOROVOD_SECRET=00ff\n", 0o600)
	env, err := ReadJobFile(good)
	if err != nil || !slices.Equal(env, []string{"GOROVOD_JOB_ID=j", "GOROVOD_SECRET=00ff"}) {
		t.Fatalf("ReadJobFile(good) = %q, %v", env, err)
	}
	link := filepath.Join(dir, "link.env")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	others := write("others.env", "A=1\n", 0o600)
	if os.Getuid() == 0 {
		if err := os.Chown(others, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	bad := []struct {
		path, want string
	}{
		{write("open.env", "A=1\n", 0o644), "mode 0644"},
		{write("group.env", "A=1\n", 0o640), "mode 0640"},
		{link, "symbolic link"},
		{dir, "not a regular file"},
		{write("malformed.env", "A=1\nnot a variable\n", 0o600), "line 2"},
		{write("badname.env", "A B=1\n", 0o600), "line 1"},
		{write("empty.env", "", 0o600), "empty"},
		{write("huge.env", "A="+strings.Repeat("x", maxJobFile), 0o600), "over"},
		{filepath.Join(dir, "missing.env"), "no such file"},
	}
	if os.Getuid() == 0 {
		bad = append(bad, struct{ path, want string }{others, "not owned by this user"})
	}
	for _, b := range bad {
		if _, err := ReadJobFile(b.path); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ReadJobFile(%s) = %v, want an error saying %q", filepath.Base(b.path), err, b.want)
		}
	}
}

// TestSweepJobFiles: only this user's job files of launchers that are gone
// are removed.
func TestSweepJobFiles(t *testing.T) {
	dir := t.TempDir()
	dead := deadPid(t)
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("A=1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ns := pidNamespace()
	if ns == "0" {
		t.Skip("no /proc/self/ns/pid: job files are not swept here")
	}
	gone := file(fmt.Sprintf("%s%d-ns%s-123.env", jobFilePrefix, dead, ns))
	mine, err := writeJobFile(dir, []string{"A=1"})
	if err != nil {
		t.Fatal(err)
	}
	keep := []string{
		mine,
		file(fmt.Sprintf("%s1-ns%s-5.env", jobFilePrefix, ns)),              // pid 1 is alive
		file(fmt.Sprintf("%s%d-ns1%s-5.env", jobFilePrefix, dead, ns)),      // another pid namespace's
		file(fmt.Sprintf("gorovod-job-%d.env", dead)),                       // not a name this launcher gives
		file(fmt.Sprintf("%s%d-ns%s-123.env.bak", jobFilePrefix, dead, ns)), // nor this
	}
	if os.Getuid() == 0 {
		other := file(fmt.Sprintf("%s%d-ns%s-456.env", jobFilePrefix, dead, ns))
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, other)
	}
	sweepJobFiles(dir, slog.New(slog.DiscardHandler))
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the job file of dead pid %d is still there (%v)", dead, err)
	}
	for _, k := range keep {
		if _, err := os.Stat(k); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(k), err)
		}
	}
}
