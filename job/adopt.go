package job

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
)

// Adoption: a runner takes back a job whose runner died (Config.Adopt,
// `gorovod run --attach DIR`). Its directory holds what that takes: the
// record (record.tsv: the job, its processes, their gossip addresses and the
// ends the old runner saw) and the job's environment (job.env, mode 0600:
// its id, secret, seeds and minimum). The new runner's driver binds the dead
// driver's gossip address when it can, which is every worker's seed: the
// workers, which go back to their seeds every second while no driver is in
// view, come back to it by themselves. Where it cannot (another process
// took the port; on Kubernetes, a driver pod with another IP), or where the
// seed is not at the runner's own address (Adoption.OwnAddr), it listens
// where a new runner would, and contacts the workers at their recorded
// gossip addresses itself (driver.Config.Contact); either way the job's
// seeds become its address (job.env, the job file), for workers started
// later and the next runner. The processes still running on this host are
// verified (/proc/PID/environ names the job and the launch index, so a pid
// used again by another process is not taken for a worker) and followed by
// pid; their output files are read from where they are.

// envFile is the job's environment in its directory: the job file's
// contents (NAME=value lines), mode 0600.
const envFile = "job.env"

// Adoption is a running job that a runner takes back (Config.Adopt).
type Adoption struct {
	Dir    string    // the job's directory
	Record JobRecord // its record, as ReadJobRecord reads it
	Env    []string  // the job's environment (job.env): id, secret, seeds, minimum
	// Worker is every process the record lists, as found now.
	Workers []AdoptedWorker
	// Contact are the gossip addresses of the job's workers that may still
	// run (the record's, or on Kubernetes the job's status.adoption): the
	// adopting driver contacts them (driver.Config.Contact), so that they
	// come back to it wherever it listens, not only at their seed.
	Contact []string
	// OwnAddr: Config.Gossip.BindAddr is this runner's own address for
	// certain (on Kubernetes, its pod's IP), not a default. A seed at
	// another address is then not bound even where the host would let it
	// (several nodes' pods sharing one host's network, as a test cluster's
	// host-network pods do; a host with net.ipv4.ip_nonlocal_bind): the
	// job's seed would name an address that is not this runner's. The
	// driver listens at its own address and contacts the workers.
	OwnAddr bool
}

// AdoptedWorker is a process of the job's record, as an adopting runner
// finds it.
type AdoptedWorker struct {
	RecordedWorker
	// Running: the process runs on this host and is the job's worker of
	// that launch index.
	Running bool
	// Remote: it ran on another host and its end was not recorded: the
	// runner's Launcher may take it back (WorkerAdopter), which checks
	// there that it still runs.
	Remote bool
	// Why it is not adopted, when it is not Running and its end was not
	// recorded: gone while no runner watched it, on another host, or a pid
	// now used by another process.
	Why string
}

// ReadAdoption reads what adopting the job in directory dir takes, and
// looks for its processes. It refuses a job whose record says it ended, and
// one whose runner is still running.
func ReadAdoption(dir string) (*Adoption, error) {
	rec, err := ReadJobRecord(dir)
	if err != nil {
		return nil, err
	}
	if rec.Ended {
		return nil, fmt.Errorf("job %s in %s has ended (%s): nothing to adopt", rec.JobID, dir, rec.Verdict)
	}
	if rec.RunnerPID != os.Getpid() && isRunner(rec.RunnerPID) {
		return nil, fmt.Errorf("job %s in %s: its runner (pid %d) is still running", rec.JobID, dir, rec.RunnerPID)
	}
	env, err := ReadJobFile(filepath.Join(dir, envFile))
	if err != nil {
		return nil, fmt.Errorf("job %s in %s: %w", rec.JobID, dir, err)
	}
	w, err := envconfig.LoadElastic(func(name string) string { return lookupEnv(env, name) })
	if err != nil {
		return nil, fmt.Errorf("job %s in %s: %s: %w", rec.JobID, dir, envFile, err)
	}
	if w.JobID != rec.JobID {
		return nil, fmt.Errorf("job %s in %s: %s is of job %s", rec.JobID, dir, envFile, w.JobID)
	}
	a := &Adoption{Dir: dir, Record: rec, Env: env}
	for _, rw := range rec.Workers {
		aw := AdoptedWorker{RecordedWorker: rw}
		switch {
		case rw.Exited:
		case !launch.IsLocal(rw.Host):
			aw.Remote = true
		default:
			if err := sameJob(rw.PID, rec.JobID, rw.Index); err != nil {
				aw.Why = err.Error()
			} else {
				aw.Running = true
			}
		}
		if (aw.Running || aw.Remote) && rw.Gossip != "" {
			a.Contact = append(a.Contact, rw.Gossip)
		}
		a.Workers = append(a.Workers, aw)
	}
	return a, nil
}

// lookupEnv is NAME's value in env ("" when unset).
func lookupEnv(env []string, name string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// isRunner says whether pid is a running gorovod process (the job's
// runner, unless the pid was used again by another gorovod).
func isRunner(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !processExists(pid) {
		return false
	}
	argv0, _, _ := bytes.Cut(b, []byte{0})
	return strings.Contains(filepath.Base(string(argv0)), "gorovod")
}

// sameJob checks that pid is a running process of job jobID (its
// environment says so) and, for index ≥ 0, its worker of that launch index.
func sameJob(pid int, jobID string, index int) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: not a process", pid)
	}
	if _, err := procStartTime(pid); err != nil {
		return fmt.Errorf("pid %d: gone", pid)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return fmt.Errorf("pid %d: cannot read its environment to check that it is the job's worker: %w", pid, err)
	}
	has := func(kv string) bool {
		for _, e := range bytes.Split(b, []byte{0}) {
			if string(e) == kv {
				return true
			}
		}
		return false
	}
	if !has(envconfig.EnvJobID + "=" + jobID) {
		return fmt.Errorf("pid %d: another process (its environment names another job, or none)", pid)
	}
	if index >= 0 && !has(envconfig.EnvLaunchIndex+"="+strconv.Itoa(index)) {
		return fmt.Errorf("pid %d: another worker of the job than launch index %d", pid, index)
	}
	return nil
}

// procStartTime is when process pid started (field 22 of /proc/PID/stat, in
// clock ticks since boot): with the pid, it names the process, where a pid
// alone may be used again. A zombie counts as gone.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, os.ErrProcessDone
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// ErrExitUnknown is wrapped by the error of an adopted worker that exited:
// its exit status went to its parent, the runner that died (or init), not
// to the runner that adopted it.
var ErrExitUnknown = launch.ErrExitUnknown

// adoptedPoll is how often an adopted process is looked at: it is not this
// process's child, so nothing signals its exit.
const adoptedPoll = 100 * time.Millisecond

// adoptedProcess is a worker of an adopted job, followed by its pid.
type adoptedProcess struct {
	pid   int
	start uint64 // procStartTime at adoption
	done  chan struct{}
	mu    sync.Mutex
	gone  bool
}

// adoptProcess follows worker w (verified by ReadAdoption) until it exits:
// its output files, from their current end, go to output; when ctx ends it
// is stopped (StopSignal, SIGKILL after grace), as a Launcher stops its
// processes.
func adoptProcess(ctx context.Context, dir string, w RecordedWorker, grace time.Duration, output func(stream string, line []byte)) (*adoptedProcess, error) {
	start, err := procStartTime(w.PID)
	if err != nil {
		return nil, fmt.Errorf("worker %d (pid %d): gone", w.Index, w.PID)
	}
	p := &adoptedProcess{pid: w.PID, start: start, done: make(chan struct{})}
	tails := []*fileTail{openTail(OutputFiles(dir, w.Index)+".stdout", "stdout", output),
		openTail(OutputFiles(dir, w.Index)+".stderr", "stderr", output)}
	go p.follow(ctx, grace, tails)
	return p, nil
}

func (p *adoptedProcess) alive() bool {
	st, err := procStartTime(p.pid)
	return err == nil && st == p.start
}

func (p *adoptedProcess) follow(ctx context.Context, grace time.Duration, tails []*fileTail) {
	defer close(p.done)
	tick := time.NewTicker(adoptedPoll)
	defer tick.Stop()
	var kill <-chan time.Time
	stopping := ctx.Done()
	for {
		for _, t := range tails {
			t.read()
		}
		if !p.alive() {
			for _, t := range tails {
				t.read()
				t.close()
			}
			p.mu.Lock()
			p.gone = true
			p.mu.Unlock()
			return
		}
		select {
		case <-tick.C:
		case <-stopping:
			stopping = nil
			_ = launch.SignalAwake(p, StopSignal)
			kill = time.After(grace)
		case <-kill:
			kill = nil
			_ = p.Signal(syscall.SIGKILL)
		}
	}
}

func (p *adoptedProcess) PID() int              { return p.pid }
func (p *adoptedProcess) Done() <-chan struct{} { return p.done }

// Err is always ErrExitUnknown: the exit status went to the process's parent.
func (p *adoptedProcess) Err() error {
	return fmt.Errorf("pid %d: %w", p.pid, ErrExitUnknown)
}

// Signal signals the process while it is the one adopted (never a process
// that took its pid after it exited).
func (p *adoptedProcess) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone || !p.alive() {
		return os.ErrProcessDone
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a syscall.Signal", sig)
	}
	return syscall.Kill(p.pid, s)
}

// fileTail reads the lines appended to an output file from its end at
// opening.
type fileTail struct {
	f       *os.File
	stream  string
	output  func(stream string, line []byte)
	partial []byte
}

// maxTailLine bounds a line kept while it has no newline yet.
const maxTailLine = 1 << 20

func openTail(path, stream string, output func(string, []byte)) *fileTail {
	t := &fileTail{stream: stream, output: output}
	if f, err := os.Open(path); err == nil {
		if _, err := f.Seek(0, io.SeekEnd); err == nil {
			t.f = f
		} else {
			f.Close()
		}
	}
	return t
}

func (t *fileTail) read() {
	if t.f == nil {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := t.f.Read(buf)
		t.partial = append(t.partial, buf[:n]...)
		for {
			i := bytes.IndexByte(t.partial, '\n')
			if i < 0 {
				break
			}
			t.output(t.stream, bytes.Clone(t.partial[:i]))
			t.partial = t.partial[i+1:]
		}
		if len(t.partial) > maxTailLine {
			t.output(t.stream, bytes.Clone(t.partial))
			t.partial = nil
		}
		if n == 0 || err != nil {
			return
		}
	}
}

func (t *fileTail) close() {
	if t.f == nil {
		return
	}
	if len(t.partial) > 0 {
		t.output(t.stream, t.partial)
		t.partial = nil
	}
	t.f.Close()
	t.f = nil
}

// writeEnvFile writes the job's environment into its directory (mode
// 0600: it holds the secret), for a runner that adopts the job later.
func writeEnvFile(dir string, env []string) error {
	path := filepath.Join(dir, envFile)
	f, err := os.OpenFile(path+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("job: the job's environment file: %w", err)
	}
	var b strings.Builder
	for _, kv := range env {
		b.WriteString(kv + "\n")
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("job: the job's environment file: %w", err)
	}
	if err := f.Chmod(0o600); err != nil { // an existing .tmp kept its mode
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("job: the job's environment file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("job: the job's environment file: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// adopting is cfg for a runner that takes back the job of cfg.Adopt: the
// job's id, secret and directory, the dead driver's gossip address to bind
// first (the workers' seed; Start falls back to cfg's own when it cannot),
// and, unless cfg sets one, the job's probe timeout (the one its workers
// have).
func (cfg Config) adopting() (Config, error) {
	a := cfg.Adopt
	w, err := envconfig.LoadElastic(func(name string) string { return lookupEnv(a.Env, name) })
	if err != nil {
		return cfg, fmt.Errorf("%w: adopting %s: %w", ErrInvalidConfig, a.Dir, err)
	}
	if cfg.OutputDir != "" && filepath.Clean(cfg.OutputDir) != filepath.Clean(a.Dir) {
		return cfg, fmt.Errorf("%w: OutputDir %s is not the adopted job's directory %s", ErrInvalidConfig, cfg.OutputDir, a.Dir)
	}
	host, port, err := net.SplitHostPort(w.Seeds[0])
	if err != nil {
		return cfg, fmt.Errorf("%w: adopting %s: the job's seed %q: %w", ErrInvalidConfig, a.Dir, w.Seeds[0], err)
	}
	if cfg.Gossip.BindPort, err = strconv.Atoi(port); err != nil {
		return cfg, fmt.Errorf("%w: adopting %s: the job's seed %q: bad port", ErrInvalidConfig, a.Dir, w.Seeds[0])
	}
	cfg.Gossip.BindAddr = host
	cfg.JobID, cfg.Secret, cfg.OutputDir = w.JobID, w.Secret, a.Dir
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = w.ProbeTimeout
	}
	return cfg, nil
}

// notOwnSeed says why an adopting runner whose own address is own
// (Adoption.OwnAddr) does not bind the workers' seed at host seed: it is
// another address. Both are compared as IPs; a name, or an unspecified own
// address, leaves the seed to be tried.
func notOwnSeed(own, seed string) error {
	o, err := netip.ParseAddr(own)
	if err != nil || o.IsUnspecified() {
		return nil
	}
	s, err := netip.ParseAddr(seed)
	if err != nil || s.Unmap() == o.Unmap() {
		return nil
	}
	return fmt.Errorf("it is not this runner's address %s", o)
}

// withSeeds is the job's environment env with its seeds (GOROVOD_SEEDS)
// set to addr alone.
func withSeeds(env []string, addr string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == envconfig.EnvSeeds {
			kv = k + "=" + addr
		}
		out = append(out, kv)
	}
	return out
}

// adoptStopGrace is how long an adopted worker that is stopped has before
// SIGKILL (LocalLauncher's default StopGrace).
const adoptStopGrace = 5 * time.Second

// adopted finishes Start for an adopted job: the processes of the record
// go into the roster (the running ones followed by pid, the others with
// the end the record gives them — state, error and, for one the dead
// runner stopped, why — or Unknown), the floor is told of the ones gone
// while no runner watched, and the job runs.
func (j *Job) adopted(ctx context.Context, fail func(error) (*Job, error)) (*Job, error) {
	a := j.cfg.Adopt
	r := j.roster
	var running []AdoptedWorker
	var gone []string
	r.mu.Lock()
	r.place.share = map[string]int{}
	for _, w := range a.Workers {
		if w.Index < 0 || w.Index > 1<<20 {
			r.mu.Unlock()
			return fail(fmt.Errorf("job: adopting %s: launch index %d in the record", a.Dir, w.Index))
		}
		r.launches = max(r.launches, w.Index+1)
		r.place.share[w.Host]++
		switch {
		case w.Running || w.Remote:
			r.standing.add()
			r.place.take(w.Host)
			running = append(running, w)
		case w.Exited:
			var err error
			if w.Why != "" {
				err = errors.New(w.Why)
			}
			r.putExitedLocked(recordedEnd(w, parseState(w.State), err))
		default:
			r.putExitedLocked(recordedEnd(w, Unknown, fmt.Errorf("%s: %w", w.Why, ErrExitUnknown)))
			gone = append(gone, fmt.Sprintf("worker %d (pid %d): %s", w.Index, w.PID, w.Why))
			j.floor.toReplace++
		}
	}
	r.mu.Unlock()
	if len(running) == 0 {
		return fail(fmt.Errorf("job: adopting job %s in %s: none of its workers runs", j.cfg.JobID, a.Dir))
	}
	var refs []WorkerRef
	for _, w := range running {
		index := w.Index
		output := func(stream string, line []byte) {
			j.events.emit(WorkerOutput{Worker: index, Stream: stream, Line: line})
		}
		var p Process
		var err error
		if w.Remote {
			if ad, ok := j.cfg.Launcher.(WorkerAdopter); ok {
				p, err = ad.Adopt(j.workCtx, AdoptRequest{Index: index, PID: w.PID, Host: w.Host, JobID: j.cfg.JobID, OutputDir: a.Dir, Output: output, Notice: j.events.notice})
			} else {
				err = fmt.Errorf("on host %s: this runner's launcher cannot take back workers of other hosts", w.Host)
			}
		} else {
			p, err = adoptProcess(j.workCtx, a.Dir, w.RecordedWorker, adoptStopGrace, output)
		}
		ref := WorkerRef{Index: w.Index, PID: w.PID, Host: w.Host}
		if err != nil {
			r.mu.Lock()
			r.putExitedLocked(recordedEnd(w, Unknown, fmt.Errorf("not adopted (%v): %w", err, ErrExitUnknown)))
			r.place.release(w.Host)
			j.floor.toReplace++
			r.standing.left()
			r.mu.Unlock()
			gone = append(gone, fmt.Sprintf("worker %d (pid %d): %v", w.Index, w.PID, err))
			continue
		}
		r.launched(index, ref, p)
		if w.Gossip != "" {
			// The dead runner's driver listed it: out of this driver's
			// view, it is woken as one that left the view.
			r.listedAt(index, time.Now())
		}
		go j.await(index, p)
		refs = append(refs, ref)
	}
	first := []Event{JobStarted{At: now(), JobID: j.cfg.JobID, DriverAddr: j.driver.GossipAddr(), JobFile: j.jobFile, Workers: len(refs), Adopted: true}}
	for _, ref := range refs {
		first = append(first, WorkerStarted{At: now(), Worker: ref, Initial: true, Adopted: true})
	}
	j.events.release(first...) // held since Start's hold
	for _, g := range gone {
		j.events.notice("not adopted, exit status unknown: " + g)
	}
	// The Discovery's list came before the workers taken back: those on a
	// host it lacks (an allocation that shrank while no runner watched)
	// leave as a dropped host's do. No later list drops such a host, since
	// a host is dropped when a list that named it is followed by one that
	// does not.
	r.mu.Lock()
	unlisted := r.place.unlisted()
	r.mu.Unlock()
	if len(unlisted) > 0 {
		j.inbox.addDropped(unlisted)
		j.inbox.wake()
	}
	j.run(ctx)
	return j, nil
}

// recordedEnd is the proc of worker w of an adopted job, which ended in
// state (with err) before this runner took the job back, or was gone. The
// end the record gives stands: a stopped worker keeps why the runner that
// died stopped it, and rule 6 was that runner's to apply with what it
// knew, so a worker the record gives as finished is not taken, at the
// job's end, for one never admitted (presence.final: everIn).
func recordedEnd(w AdoptedWorker, state WorkerState, err error) *proc {
	done := make(chan struct{})
	close(done)
	p := &proc{rec: WorkerRecord{WorkerRef: WorkerRef{Index: w.Index, PID: w.PID, Host: w.Host}, State: state, Err: err},
		p: exitedProc{pid: w.PID, done: done, err: err}}
	if state == Stopped {
		p.rec.StopReason = w.StopReason
	}
	p.everIn = state == Finished
	return p
}

// parseState is the WorkerState a record names (Unknown for a name it does
// not know).
func parseState(name string) WorkerState {
	for s := Running; s <= Unknown; s++ {
		if s.String() == name {
			return s
		}
	}
	return Unknown
}

// reportedEnd says whether adopted worker index, which has exited,
// reported the end of training to this runner's driver. The report and the
// exit race (the exit is seen by polling): it waits for the report up to
// lateReportWait.
func (j *Job) reportedEnd(index int) bool {
	name := j.roster.nameOf(index)
	if name == "" {
		return false
	}
	deadline := time.NewTimer(lateReportWait)
	defer deadline.Stop()
	tick := time.NewTicker(adoptedPoll / 2)
	defer tick.Stop()
	for {
		select {
		case <-j.driver.Finished():
			if j.driver.Current().Rank(name) >= 0 && !slices.Contains(j.driver.Unfinished(), name) {
				return true
			}
		default:
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return false
		}
	}
}

// WorkerAdopter is a Launcher that can take back a worker it started on
// another host for a runner that died (Config.Adopt): SSHLauncher.
type WorkerAdopter interface {
	// Adopt follows the running worker r names until it exits: its new
	// output lines go to r.Output, signals reach it, and when ctx ends it
	// is stopped, as a Launcher's processes are. Its Err wraps
	// ErrExitUnknown once it has exited. Adopt returns an error when the
	// process is not that worker of the job, or not running.
	Adopt(ctx context.Context, r AdoptRequest) (Process, error)
}

// AdoptRequest is a running worker of an adopted job on another host.
type AdoptRequest struct {
	Index     int    // its launch index
	PID       int    // on Host
	Host      string // where it runs
	JobID     string
	OutputDir string // the job's directory: the worker's output files are there on Host
	Output    func(stream string, line []byte)
	// Notice reports what a person should know of the worker (a pod the
	// cluster took away), as LaunchRequest.Notice.
	Notice func(msg string)
}
