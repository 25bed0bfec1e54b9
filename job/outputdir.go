package job

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// The job's directory (Config.OutputDir) holds each local worker's output,
// written by the worker itself, and the runner's record of the job: what a
// person, or `gorovod follow`, needs to see a job whose runner died and how
// it ends.

// recordFile is the runner's record in the job's directory: one line per
// fact, its fields separated by tabs:
//
//	job      <job id> <runner pid>
//	started  <index> <pid> <host>
//	exited   <index> <state> <why> [<stop reason>]
//	running  <index> <pid>             a remote worker's pid on its host, once it runs
//	gossip   <index> <host:port>       the worker's gossip address, once the driver sees it (again when it changes)
//	adopted  <runner pid>              a runner took the job back (Config.Adopt)
//	ended    <verdict: "ok" or the job's error>
//
// An exited line's state is a WorkerState's name, why the worker's error
// ("" when it finished), and the stop reason, a StopReason's name, is there
// only for a worker the runner stopped (state "stopped"): a runner that
// takes the job back reports it as this one would. ReadJobRecord reads an
// exited line without it as stopped for a reason the record does not give
// (NoStopReason), and refuses one whose reason it does not know.
const recordFile = "record.tsv"

// OutputFiles is the path prefix of worker index's output files in the job's
// directory dir: the worker writes OutputFiles(dir, index)+".stdout" and
// +".stderr".
func OutputFiles(dir string, index int) string {
	return filepath.Join(dir, "worker-"+strconv.Itoa(index))
}

// jobRecord appends to the record; a nil *jobRecord records nothing.
type jobRecord struct {
	mu sync.Mutex
	f  *os.File
}

// openJobRecord opens the record in dir: a new job's (a job line), or with
// adopted, the record of the job the runner takes back (an adopted line).
func openJobRecord(dir, jobID string, adopted bool) (*jobRecord, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("job: the job's directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, recordFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("job: the job's record: %w", err)
	}
	r := &jobRecord{f: f}
	if adopted {
		r.line("adopted", strconv.Itoa(os.Getpid()))
	} else {
		r.line("job", jobID, strconv.Itoa(os.Getpid()))
	}
	return r, nil
}

func (r *jobRecord) line(fields ...string) {
	if r == nil {
		return
	}
	for i, f := range fields {
		fields[i] = strings.Map(func(c rune) rune {
			if c == '\t' || c == '\n' || c == '\r' {
				return ' '
			}
			return c
		}, f)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		_, _ = r.f.WriteString(strings.Join(fields, "\t") + "\n") // a record that cannot be written loses only itself
	}
}

func (r *jobRecord) started(w WorkerRef) {
	r.line("started", strconv.Itoa(w.Index), strconv.Itoa(w.PID), w.Host)
}

func (r *jobRecord) running(index, pid int) {
	r.line("running", strconv.Itoa(index), strconv.Itoa(pid))
}

func (r *jobRecord) gossip(index int, addr string) {
	r.line("gossip", strconv.Itoa(index), addr)
}

func (r *jobRecord) exited(e WorkerExited) {
	why := ""
	if e.Err != nil {
		why = e.Err.Error()
	}
	fields := []string{"exited", strconv.Itoa(e.Worker.Index), e.State.String(), why}
	if e.State == Stopped && e.StopReason != NoStopReason {
		fields = append(fields, e.StopReason.String())
	}
	r.line(fields...)
}

func (r *jobRecord) ended(o Outcome) {
	verdict := "ok"
	if err := o.Err(); err != nil {
		verdict = err.Error()
	}
	r.line("ended", verdict)
}

func (r *jobRecord) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}

// JobRecord is what a job's directory says about the job (ReadJobRecord).
type JobRecord struct {
	JobID     string
	RunnerPID int // the process that ran the job (`gorovod run`), or the last that adopted it
	Workers   []RecordedWorker
	Adopted   int    // how many times a runner took the job back
	Ended     bool   // the runner saw the job end
	Verdict   string // then: "ok", or why the job failed
}

// RecordedWorker is one worker process in a job's record.
type RecordedWorker struct {
	Index  int
	PID    int    // on Host
	Host   string // "" for the runner's host
	Exited bool   // the runner saw it exit
	State  string // then: how it ended (a WorkerState's name)
	Why    string // and why, when not finished
	// StopReason is why the runner stopped it, when State is "stopped"
	// (NoStopReason when the record does not say).
	StopReason StopReason
	// Gossip is its gossip address as the driver last saw it ("" when not
	// recorded): where a runner that takes the job back contacts it.
	Gossip string
}

// maxRecord bounds what ReadJobRecord reads: a few lines per worker, and a
// job under churn starts many.
const maxRecord = 64 << 20

// ReadJobRecord reads the record in the job's directory dir: of the last job
// run there.
func ReadJobRecord(dir string) (JobRecord, error) {
	f, err := os.Open(filepath.Join(dir, recordFile))
	if err != nil {
		return JobRecord{}, fmt.Errorf("job record: %w", err)
	}
	defer f.Close()
	var rec JobRecord
	byIndex := map[int]int{}
	sc := bufio.NewScanner(io.LimitReader(f, maxRecord))
	for n := 1; sc.Scan(); n++ {
		fields := strings.Split(sc.Text(), "\t")
		bad := func() (JobRecord, error) {
			return JobRecord{}, fmt.Errorf("job record %s, line %d: malformed", f.Name(), n)
		}
		switch {
		case fields[0] == "job" && len(fields) == 3:
			// A directory used again (--output-dir) holds the record of
			// each job in turn: the last one is the job's.
			rec, byIndex = JobRecord{JobID: fields[1]}, map[int]int{}
			if rec.RunnerPID, err = strconv.Atoi(fields[2]); err != nil {
				return bad()
			}
		case fields[0] == "started" && len(fields) == 4:
			i, err1 := strconv.Atoi(fields[1])
			pid, err2 := strconv.Atoi(fields[2])
			if err1 != nil || err2 != nil {
				return bad()
			}
			byIndex[i] = len(rec.Workers)
			rec.Workers = append(rec.Workers, RecordedWorker{Index: i, PID: pid, Host: fields[3]})
		case fields[0] == "running" && len(fields) == 3:
			i, err1 := strconv.Atoi(fields[1])
			pid, err2 := strconv.Atoi(fields[2])
			k, ok := byIndex[i]
			if err1 != nil || err2 != nil || !ok {
				return bad()
			}
			rec.Workers[k].PID = pid
		case fields[0] == "gossip" && len(fields) == 3:
			i, err := strconv.Atoi(fields[1])
			k, ok := byIndex[i]
			if err != nil || !ok {
				return bad()
			}
			rec.Workers[k].Gossip = fields[2]
		case fields[0] == "exited" && (len(fields) == 4 || len(fields) == 5):
			i, err := strconv.Atoi(fields[1])
			k, ok := byIndex[i]
			if err != nil || !ok {
				return bad()
			}
			w := &rec.Workers[k]
			w.Exited, w.State, w.Why, w.StopReason = true, fields[2], fields[3], NoStopReason
			if len(fields) == 5 {
				// A reason the runner did not write is refused like any
				// other line it did not write, not taken for none.
				why, known := parseStopReason(fields[4])
				switch {
				case !known:
					return JobRecord{}, fmt.Errorf("job record %s, line %d: unknown stop reason %q", f.Name(), n, fields[4])
				case fields[2] != Stopped.String():
					return JobRecord{}, fmt.Errorf("job record %s, line %d: a stop reason (%s) for a worker that ended %q, not stopped", f.Name(), n, fields[4], fields[2])
				}
				w.StopReason = why
			}
		case fields[0] == "adopted" && len(fields) == 2 && rec.JobID != "":
			if rec.RunnerPID, err = strconv.Atoi(fields[1]); err != nil {
				return bad()
			}
			rec.Adopted++
		case fields[0] == "ended" && len(fields) == 2:
			rec.Ended, rec.Verdict = true, fields[1]
		default:
			return bad()
		}
	}
	if err := sc.Err(); err != nil {
		return JobRecord{}, fmt.Errorf("job record %s: %w", f.Name(), err)
	}
	if rec.JobID == "" {
		return JobRecord{}, fmt.Errorf("job record %s: no job line", f.Name())
	}
	return rec, nil
}
