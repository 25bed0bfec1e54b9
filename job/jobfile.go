package job

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// The job file is named after the launcher's pid and pid namespace, so that
// a later launcher can tell the file of one that died without removing it
// (kill -9, a crash) from the file of one still running, and leaves alone
// the files of launchers whose pids it cannot see (another container
// sharing the directory).
const jobFilePrefix = "gorovod-job-pid"

var jobFileName = regexp.MustCompile(`^` + jobFilePrefix + `(\d+)-ns(\d+)-[0-9]+\.env$`)

// pidNamespace is the inode number of this process's pid namespace ("0"
// where /proc does not say).
func pidNamespace() string {
	link, err := os.Readlink("/proc/self/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return "0"
	}
	digits := strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
	if _, err := strconv.ParseUint(digits, 10, 64); err != nil {
		return "0"
	}
	return digits
}

// maxJobFile bounds what ReadJobFile reads: a job file holds a handful of
// variables.
const maxJobFile = 64 << 10

// writeJobFile records what a hand-started worker needs to join in dir,
// readable by this user only (it holds the job secret).
func writeJobFile(dir string, env []string) (string, error) {
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s%d-ns%s-*.env", jobFilePrefix, os.Getpid(), pidNamespace()))
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	for _, kv := range env {
		if _, err := f.WriteString(kv + "\n"); err != nil {
			os.Remove(f.Name())
			return "", err
		}
	}
	return f.Name(), nil
}

// sweepJobFiles removes from dir the job files of launchers that are gone:
// files of this user, from this pid namespace, whose pid is no process. A
// pid in use again by another process keeps its file (it is swept once that
// process is gone too).
func sweepJobFiles(dir string, log *slog.Logger) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	ns := pidNamespace()
	for _, e := range entries {
		m := jobFileName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() || m[2] != ns || ns == "0" {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid <= 0 || pid == os.Getpid() || processExists(pid) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(path)
		if err != nil || !ownedByMe(fi) {
			continue
		}
		if err := os.Remove(path); err == nil {
			log.Info("removed the job file of a launcher that is gone", "file", path, "pid", pid)
		}
	}
}

// processExists says whether pid is a process; one of another user
// (EPERM) exists too.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func ownedByMe(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// ReadJobFile reads the environment a job file gives a worker started by
// hand (NAME=value lines). It refuses a file that is not a regular file of
// this user readable by nobody else (mode 0600), since it would hand the
// job secret to whoever could write or read it, and a malformed one.
func ReadJobFile(path string) ([]string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("job file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("job file: %w", err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("job file %s is not a regular file", path)
	case !ownedByMe(fi):
		return nil, fmt.Errorf("job file %s is not owned by this user (uid %d)", path, os.Getuid())
	case fi.Mode().Perm() != 0o600:
		return nil, fmt.Errorf("job file %s has mode %04o, want 0600 (it holds the job secret)", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxJobFile+1))
	if err != nil {
		return nil, fmt.Errorf("job file: %w", err)
	}
	if len(b) > maxJobFile {
		return nil, fmt.Errorf("job file %s is over %d bytes", path, maxJobFile)
	}
	return parseJobFile(path, b)
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func parseJobFile(path string, b []byte) ([]string, error) {
	var env []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, maxJobFile)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		name, _, ok := strings.Cut(line, "=")
		if !ok || !envName.MatchString(name) {
			return nil, fmt.Errorf("job file %s, line %d: not NAME=value", path, n)
		}
		env = append(env, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("job file %s: %w", path, err)
	}
	if len(env) == 0 {
		return nil, fmt.Errorf("job file %s is empty", path)
	}
	return env, nil
}
