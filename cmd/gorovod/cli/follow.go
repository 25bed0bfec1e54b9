package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/job"
)

const followUsageText = `Usage: gorovod follow [-n N] JOBDIR

Shows a job from its directory (the one 'gorovod run' printed, or its
--output-dir), also once 'gorovod run' has died and its workers train on: the
last N lines of every worker's output, then each new line as 'run' prints it
([i] line), until the job is over. The job is over when 'run' recorded its end
(the verdict is printed; exit status 1 when the job failed), or, when 'run' is
gone, when every worker on this host has exited: then each worker's end is
printed as 'run' recorded it, or as not known (a process's exit status goes to
its parent only, and the parent, 'run', was gone). Interrupting follow leaves
the job alone; a job without its 'run' is stopped with kill -INT of the
worker pids follow prints (kill -TERM: each leaves at a committed step).`

// followEvery is how often follow looks at the job's directory.
const followEvery = 100 * time.Millisecond

// followCommand is `gorovod follow`.
func followCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod follow", flag.ContinueOnError)
	last := fs.Int("n", 10, "lines of each worker's output to show from before follow started")
	if err := parseFlags(fs, args, followUsageText, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 || *last < 0 {
		fmt.Fprintf(stderr, "gorovod follow: want one job directory (and -n not negative)\nRun 'gorovod follow --help' for the usage.\n")
		return ErrUsage
	}
	dir := fs.Arg(0)
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
			// The usual way here: following a job that ended normally.
			err = fmt.Errorf("%s: no such job directory (the one 'gorovod run' makes under $TMPDIR is removed when the job ends; --output-dir DIR keeps it)", dir)
		}
		return &commandError{command: "follow", err: err}
	}
	f := &follower{dir: dir, stdout: stdout, stderr: stderr, workers: map[int]*followedWorker{}}
	runnerGone := !processAlive(rec.RunnerPID)
	fmt.Fprintf(stderr, "gorovod follow: job %s, run by pid %d (%s)\n", rec.JobID, rec.RunnerPID, map[bool]string{true: "gone", false: "running"}[runnerGone])
	f.update(rec, *last)
	if runnerGone && !rec.Ended {
		var pids []string
		for _, w := range rec.Workers {
			if !w.Exited && w.Host == "" && processAlive(w.PID) {
				pids = append(pids, strconv.Itoa(w.PID))
			}
		}
		if len(pids) > 0 {
			fmt.Fprintf(stderr, "gorovod follow: workers still running: pid %s (stop them with kill -INT, or kill -TERM to have each leave at a committed step; 'gorovod run --attach %s' takes the job back)\n", strings.Join(pids, ", "), dir)
		}
	}
	tick := time.NewTicker(followEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if rec, err = job.ReadJobRecord(dir); err != nil {
			return &commandError{command: "follow", err: err}
		}
		f.update(rec, -1)
		if rec.Ended {
			f.update(rec, -1)
			fmt.Fprintf(stderr, "gorovod follow: the job ended: %s\n", rec.Verdict)
			if rec.Verdict != "ok" {
				return &commandError{command: "follow", err: errors.New(rec.Verdict)}
			}
			return nil
		}
		if processAlive(rec.RunnerPID) || f.anyRunning(rec) {
			continue
		}
		f.update(rec, -1)
		for _, w := range rec.Workers {
			switch {
			case w.Host != "":
				fmt.Fprintf(stderr, "gorovod follow: worker %d on %s: not followed here (its output went to its launcher)\n", w.Index, w.Host)
			case w.Exited && w.Why != "":
				fmt.Fprintf(stderr, "gorovod follow: worker %d (pid %d): %s: %s\n", w.Index, w.PID, w.State, w.Why)
			case w.Exited:
				fmt.Fprintf(stderr, "gorovod follow: worker %d (pid %d): %s\n", w.Index, w.PID, w.State)
			default:
				fmt.Fprintf(stderr, "gorovod follow: worker %d (pid %d): exited after 'gorovod run' died (exit status not known); its last lines are above, all of them in %s.stdout and .stderr\n", w.Index, w.PID, job.OutputFiles(dir, w.Index))
			}
		}
		fmt.Fprintf(stderr, "gorovod follow: the job is over: every worker has exited\n")
		return nil
	}
}

// follower prints the new lines of a job's output files.
type follower struct {
	dir            string
	stdout, stderr io.Writer
	workers        map[int]*followedWorker
}

type followedWorker struct {
	stdout, stderr followedFile
}

type followedFile struct {
	offset int64
	part   []byte // a line not ended yet
}

// update prints what every worker wrote since the last call; a worker seen
// for the first time starts with its last n lines (n < 0: all of them).
func (f *follower) update(rec job.JobRecord, n int) {
	for _, w := range rec.Workers {
		if w.Host != "" {
			continue
		}
		fw, ok := f.workers[w.Index]
		if !ok {
			fw = &followedWorker{}
			f.workers[w.Index] = fw
		}
		prefix := job.OutputFiles(f.dir, w.Index)
		fw.stdout.read(prefix+".stdout", w.Index, f.stdout, !ok, n)
		fw.stderr.read(prefix+".stderr", w.Index, f.stderr, !ok, n)
	}
}

// tailWindow is how far back from a file's end its last lines are looked for.
const tailWindow = 1 << 20

func (ff *followedFile) read(path string, index int, out io.Writer, first bool, n int) {
	file, err := os.Open(path)
	if err != nil {
		return // not written yet
	}
	defer file.Close()
	if first && n >= 0 {
		if fi, err := file.Stat(); err == nil {
			ff.offset = max(0, fi.Size()-tailWindow)
		}
	}
	if _, err := file.Seek(ff.offset, io.SeekStart); err != nil {
		return
	}
	b, err := io.ReadAll(io.LimitReader(file, 64<<20))
	if err != nil {
		return
	}
	ff.offset += int64(len(b))
	b = append(ff.part, b...)
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		ff.part = b
		return
	}
	lines := bytes.Split(b[:end], []byte{'\n'})
	ff.part = append([]byte(nil), b[end+1:]...)
	if first && n >= 0 {
		lines = lines[max(0, len(lines)-n):]
	}
	for _, l := range lines {
		fmt.Fprintf(out, "[%d] %s\n", index, l)
	}
}

// anyRunning says whether a worker of this host the record does not show
// exited is still running.
func (f *follower) anyRunning(rec job.JobRecord) bool {
	for _, w := range rec.Workers {
		if !w.Exited && w.Host == "" && processAlive(w.PID) {
			return true
		}
	}
	return false
}

// processAlive says whether pid is a running process of this host (a zombie,
// exited and not yet reaped, is not).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc: kill's answer
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}
