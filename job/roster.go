package job

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// roster is what the runner knows of the job's processes: every process it
// launched (by launch index, and by member name once the driver reports
// it). It composes, under its one mu, where workers go (placement,
// placement.go), where the job stands (standing, standing.go: processes
// running, ended, training over, draining) and the workers that joined by
// hand (handStarted, handstarted.go), and ties them to the records. One
// mutex for all, so that a decision sees the records and those in one look;
// it also guards the fields of the floor marked so, for the same reason.
type roster struct {
	localHost string // a worker that publishes no launch index is matched by pid on this host

	mu       sync.Mutex
	procs    []*proc          // by launch index; nil for a launch that failed
	byName   map[string]*proc // member name → process, as the driver reports them
	hand     handStarted      // the workers that joined by hand
	place    placement        // where workers go: hosts, slots taken, shares
	standing standing         // processes running, ended, training over, draining
}

func newRoster(localHost string) *roster {
	return &roster{localHost: localHost, byName: map[string]*proc{}, hand: newHandStarted(),
		place: newPlacement(), standing: newStanding()}
}

// proc is a worker process of the job.
type proc struct {
	rec     WorkerRecord
	p       Process
	stopped bool // stopped by the runner (end-of-job rule 3)
	stuck   bool // stopped because the driver removed it as stuck: Stopped even if it exits with 0

	removed     bool // taken out by the autoscaling engine
	replacement bool // started by the floor
	forEngine   bool // started by the autoscaling engine (provisioner.Start)
	presence         // rule 6 (rejoin.go)
}

// reserveLocked takes the next launch index and counts the process as running
// on host, so that neither the job's end nor another placement overlooks it
// while it starts.
func (r *roster) reserveLocked(host string) int {
	i := len(r.procs)
	r.procs = append(r.procs, nil)
	r.standing.add()
	r.place.take(host)
	return i
}

// reserve places one more worker on the first host with a free slot and
// reserves its launch index; share is how many workers the job started on
// that host (at least 1). It refuses with ErrEnded once the job has ended or
// every worker was asked to leave, and ErrNoSlot when the hosts are full.
func (r *roster) reserve() (index int, host string, share int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.standing.admit(); err != nil {
		return 0, "", 0, err
	}
	host, ok := r.place.pick()
	if !ok {
		return 0, "", 0, ErrNoSlot
	}
	share = r.place.shareOf(host)
	return r.reserveLocked(host), host, share, nil
}

// launched records the process started for reservation index.
func (r *roster) launched(index int, ref WorkerRef, p Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs[index] = &proc{rec: WorkerRecord{WorkerRef: ref, State: Running, Started: time.Now()}, p: p}
}

// markStartedBy records who asked for process index.
func (r *roster) markStartedBy(index int, by startedBy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs[index].replacement, r.procs[index].forEngine = by == startedByFloor, by == startedByEngine
}

// unreserve gives back a reservation whose launch failed.
func (r *roster) unreserve(host string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.place.release(host)
	r.standing.left()
}

// left counts one process less, after its exit was recorded (exited).
func (r *roster) left() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.standing.left()
}

// exited records the end of process index, classified (rules 5 and 6);
// noteLocked is told of it with mu held (the floor's accounting); lostStart
// says it was started by the engine and ended before it ever entered a
// world, while the job was not ending. The
// process still counts as running until left.
func (r *roster) exited(index int, p Process, reportedEnd bool, noteLocked func(*proc)) (ev WorkerExited, lostStart bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.procs[index]
	w.rec.Exited, w.rec.Err = time.Now(), p.Err()
	w.p = exitedProcess(p)
	w.rec.State = classify(w.rec.Err, w.stopped)
	if w.stuck && w.rec.State == Finished {
		w.rec.State = Stopped // a trainer that exits 0 on StopSignal did not finish
	}
	if w.rec.State == Unknown && reportedEnd {
		w.rec.State = Finished // it said so itself; its exit status is still unknown (Err)
	}
	r.reclassifyLocked(w)
	noteLocked(w)
	r.place.release(w.rec.Host)
	lostStart = w.forEngine && !w.everIn && !w.removed && !w.stopped && !r.standing.trainingOver && !r.standing.draining
	return WorkerExited{At: now(), Worker: w.rec.WorkerRef, Name: w.rec.Name, State: w.rec.State, Err: w.rec.Err}, lostStart
}

// records describes every process launched, by launch index.
func (r *roster) records() []WorkerRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerRecord, 0, len(r.procs))
	for _, p := range r.procs {
		if p != nil {
			out = append(out, p.rec)
		}
	}
	return out
}

// final is the roster at the job's end: every process's record, rule 6
// applied with all the runner knows by then, and the hand-started workers
// (in last, the last world, or not, and whether they finished training).
func (r *roster) final(last epoch.World) ([]WorkerRecord, []HandStartedWorker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var recs []WorkerRecord
	for _, p := range r.procs {
		if p != nil {
			r.reclassifyLocked(p)
			recs = append(recs, p.rec)
		}
	}
	return recs, r.hand.final(last, r.standing.trainingOver)
}

// addDoneEarly records that the driver took member name out of the world
// because it had finished training (the others redo the last step).
func (r *roster) addDoneEarly(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hand.finishedEarly(name)
}

// processes lists the processes launched so far (exited ones included).
func (r *roster) processes() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []Process
	for _, p := range r.procs {
		if p != nil {
			ps = append(ps, p.p)
		}
	}
	return ps
}

// drain marks the job as draining (LeaveAll) and lists its running
// processes.
func (r *roster) drain() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.standing.draining = true
	var procs []Process
	for _, p := range r.procs {
		if p != nil && p.rec.State == Running {
			procs = append(procs, p.p)
		}
	}
	return procs
}

// count is how many workers the job has: its processes still running (or
// starting) and the hand-started workers among ws, the driver's workers.
func (r *roster) count(ws []driver.WorkerInfo) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.standing.running
	for _, w := range ws {
		if r.matchLocked(w) == nil {
			n++
		}
	}
	return n
}

// learn maps the driver's workers ws to the processes of the job: by the
// launch index a worker publishes, or else by its process id on this host.
func (r *roster) learn(ws []driver.WorkerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if p := r.matchLocked(w); p != nil {
			p.rec.Name = w.Name
			r.byName[w.Name] = p
			if w.State == membership.StateLeaving {
				p.announceLeaving(w.Name)
			}
		}
	}
}

// names lists every member name process index has had (a worker that
// rejoined has had several), sorted.
func (r *roster) names(index int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for name, p := range r.byName {
		if p == r.procs[index] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (r *roster) matchLocked(w driver.WorkerInfo) *proc {
	if w.Launch != "" {
		i, err := strconv.Atoi(w.Launch)
		if err != nil || i < 0 || i >= len(r.procs) {
			return nil
		}
		return r.procs[i]
	}
	if w.PID == 0 || w.Host != r.localHost {
		return nil
	}
	for _, p := range r.procs {
		if p != nil && p.rec.Host == "" && p.rec.PID == w.PID && p.rec.State == Running {
			return p
		}
	}
	return nil
}

// nameOf is process index's member name ("" when not known).
func (r *roster) nameOf(index int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if index < 0 || index >= len(r.procs) || r.procs[index] == nil {
		return ""
	}
	return r.procs[index].rec.Name
}

// describe names the member name for a person: its launch index and pid
// when it is a process of the job.
func (r *roster) describe(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.byName[name]; p != nil {
		return fmt.Sprintf("worker %d (pid %d, %s)", p.rec.Index, p.rec.PID, name)
	}
	return name
}

// noteHandStarted records name, a member that just joined a world, as
// started by hand when no process of the job is behind it; it reports
// whether it is.
func (r *roster) noteHandStarted(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byName[name] != nil {
		return false
	}
	return r.hand.add(name)
}

// markRemoved marks the process behind member name as taken out by the
// autoscaling engine, and returns it (false when none of the job's
// processes is behind it: a worker started by hand).
func (r *roster) markRemoved(name string) (WorkerRef, Process, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.byName[name]
	if p == nil {
		return WorkerRef{}, nil, false
	}
	p.removed = true
	return p.rec.WorkerRef, p.p, true
}

// anyRunning says whether a member among names is a running process of the
// job.
func (r *roster) anyRunning(names []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range names {
		if p := r.byName[name]; p != nil && p.rec.State == Running {
			return true
		}
	}
	return false
}

// firstGone counts the first n launches that have exited (or failed to
// start).
func (r *roster) firstGone(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	gone := 0
	for _, p := range r.procs[:min(len(r.procs), n)] {
		if p == nil || p.rec.State != Running {
			gone++
		}
	}
	return gone
}

// setTrainingOver records rule 1: a member reported the end of training.
func (r *roster) setTrainingOver() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.standing.trainingOver = true
}

// setHosts takes a new host list from the Discovery and returns the hosts
// it dropped.
func (r *roster) setHosts(hosts []Host) (dropped []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.place.setHosts(hosts)
}

// stopStuck marks the running process behind member name, which the driver
// removed as stuck, as stopped by the runner, and returns it (false when
// none of the job's running processes is behind it: a worker started by
// hand, or one that has exited).
func (r *roster) stopStuck(name string) (WorkerRef, Process, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.byName[name]
	if p == nil || p.rec.State != Running {
		return WorkerRef{}, nil, false
	}
	p.stopped, p.stuck = true, true
	return p.rec.WorkerRef, p.p, true
}

// stopHost marks the running processes on host, a host the Discovery no
// longer lists, as stopped by the runner (rule 3) and returns them with
// their member names; none when the host came back.
func (r *roster) stopHost(host string) (victims []Process, names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.place.has(host) {
		return nil, nil // it came back
	}
	for _, p := range r.procs {
		if p != nil && p.rec.Host == host && p.rec.State == Running {
			p.stopped = true
			victims = append(victims, p.p)
			if p.rec.Name != "" {
				names = append(names, p.rec.Name)
			}
		}
	}
	return victims, names
}

// exitedProc is a process that has exited, kept in place of the launcher's
// Process, which holds its command, environment and pipes: the job keeps a
// record of every worker it launched, and a job under churn launches many.
type exitedProc struct {
	pid  int
	err  error
	done chan struct{} // closed
}

func exitedProcess(p Process) exitedProc {
	e := exitedProc{pid: p.PID(), err: p.Err(), done: make(chan struct{})}
	close(e.done)
	return e
}

func (e exitedProc) PID() int                   { return e.pid }
func (e exitedProc) Signal(sig os.Signal) error { return os.ErrProcessDone }
func (e exitedProc) Done() <-chan struct{}      { return e.done }
func (e exitedProc) Err() error                 { return e.err }
