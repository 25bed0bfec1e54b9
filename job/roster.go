package job

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// roster is what the runner knows of the job's processes: the processes it
// launched that still run and the newest keepExited that have exited (by
// launch index, and by member name once the driver reports it), and counts
// of the older ones by how they ended. It composes, under its one mu, where
// workers go (placement, placement.go), where the job stands (standing,
// standing.go: processes running, ended, training over, draining) and the
// workers that joined by hand (handStarted, handstarted.go), and ties them
// to the records. One mutex for all, so that a decision sees the records and
// those in one look; it also guards the fields of the floor marked so, for
// the same reason.
type roster struct {
	localHost  string // a worker that publishes no launch index is matched by pid on this host
	keepExited int    // Config.KeepExitedWorkers

	mu sync.Mutex
	// procs are the processes kept, sorted by launch index: every running
	// one and the newest keepExited that have exited (exitOrder). A launch
	// that failed or is still starting has none.
	procs     []*proc
	exitOrder []*proc // the exited ones among procs, oldest exit first
	launches  int     // launch indexes handed out: the next one
	// earlier counts the exited processes whose records were dropped
	// (trimLocked), by how they ended; finishedNeverIn are those among its
	// Finished that never were in a world: rule 6 makes them Stopped if
	// training is over at the job's end.
	earlier         WorkerCounts
	finishedNeverIn int
	byName          map[string]*proc // member name → process, as the driver reports them
	hand            handStarted      // the workers that joined by hand
	place           placement        // where workers go: hosts, slots taken, shares
	standing        standing         // processes running, ended, training over, draining
	// onGossip is told each process's gossip address as the driver first
	// reports it, and again when it changes (a worker that rejoined), under
	// mu: the record keeps them for a runner that takes the job back.
	onGossip func(index int, addr string)
}

func newRoster(localHost string, keepExited int) *roster {
	return &roster{localHost: localHost, keepExited: max(1, keepExited), byName: map[string]*proc{}, hand: newHandStarted(),
		place: newPlacement(), standing: newStanding()}
}

// proc is a worker process of the job.
type proc struct {
	rec     WorkerRecord
	p       Process
	stopped StopReason // why the runner stopped it (end-of-job rule 3); NoStopReason while it has not
	// midway: stopped while training went on, as stuck or unresponsive:
	// Stopped even if it exits with 0 (a trainer that exits 0 on
	// StopSignal did not finish).
	midway bool

	removed     bool   // taken out by the autoscaling engine
	replacement bool   // started by the floor
	forEngine   bool   // started by the autoscaling engine (provisioner.Start)
	gossip      string // its gossip address, as the driver last reported it
	presence           // rule 6 (rejoin.go)
	view               // in the driver's view or not (unresponsive.go)
}

// stop marks the process as stopped by the runner for why; the first
// reason stands (a worker stopped as stuck is still that when the job ends
// before it has exited).
func (p *proc) stop(why StopReason) {
	if p.stopped == NoStopReason {
		p.stopped = why
	}
}

// reserveLocked takes the next launch index and counts the process as running
// on host, so that neither the job's end nor another placement overlooks it
// while it starts.
func (r *roster) reserveLocked(host string) int {
	i := r.launches
	r.launches++
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
	r.putLocked(&proc{rec: WorkerRecord{WorkerRef: ref, State: Running, Started: time.Now()}, p: p})
}

// findLocked is the kept process of launch index (nil when none: its
// launch failed or is under way, or it exited and its record was dropped).
func (r *roster) findLocked(index int) *proc {
	if i, ok := r.searchLocked(index); ok {
		return r.procs[i]
	}
	return nil
}

// searchLocked is where launch index is, or would go, in procs.
func (r *roster) searchLocked(index int) (int, bool) {
	return slices.BinarySearchFunc(r.procs, index, func(p *proc, index int) int { return p.rec.Index - index })
}

// putLocked keeps p under its launch index (replacing what was kept there).
func (r *roster) putLocked(p *proc) {
	r.launches = max(r.launches, p.rec.Index+1)
	i, ok := r.searchLocked(p.rec.Index)
	if ok {
		r.procs[i] = p
		return
	}
	r.procs = slices.Insert(r.procs, i, p)
}

// putExitedLocked keeps p, a process that has exited (an adopted job's),
// under its launch index.
func (r *roster) putExitedLocked(p *proc) {
	r.putLocked(p)
	r.exitedLocked(p)
}

// exitedLocked notes that p has exited and drops the oldest records of
// exited processes beyond keepExited (trimLocked).
func (r *roster) exitedLocked(p *proc) {
	r.exitOrder = append(r.exitOrder, p)
	r.trimLocked()
}

// trimLocked drops the records of the processes that exited first while
// more than keepExited are kept, counting each in earlier by how it ended,
// and forgets their member names: a job under churn launches workers for
// as long as it runs, and what it keeps of them must not grow with it.
func (r *roster) trimLocked() {
	for len(r.exitOrder) > r.keepExited {
		p := r.exitOrder[0]
		r.exitOrder[0] = nil
		r.exitOrder = r.exitOrder[1:] // append moves it to a new array once its end is reached
		if i, ok := r.searchLocked(p.rec.Index); ok && r.procs[i] == p {
			r.procs = slices.Delete(r.procs, i, i+1)
		}
		for name, q := range r.byName {
			if q == p {
				delete(r.byName, name)
				delete(r.hand.doneEarly, name)
			}
		}
		r.reclassifyLocked(p)
		if p.rec.State == Finished && p.final(Finished, true) != Finished {
			r.finishedNeverIn++ // Finished now, Stopped if training is over at the end
		}
		r.earlier.add(p.rec)
	}
}

// markStartedBy records who asked for process index.
func (r *roster) markStartedBy(index int, by startedBy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.findLocked(index); p != nil {
		p.replacement, p.forEngine = by == startedByFloor, by == startedByEngine
	}
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
	w := r.findLocked(index) // running: kept
	w.rec.Exited, w.rec.Err = time.Now(), p.Err()
	w.p = exitedProcess(p)
	w.rec.State = classify(w.rec.Err, w.stopped != NoStopReason)
	if w.midway && w.rec.State == Finished {
		w.rec.State = Stopped
	}
	if w.rec.State == Unknown && reportedEnd {
		w.rec.State = Finished // it said so itself; its exit status is still unknown (Err)
	}
	if w.rec.State == Stopped {
		w.rec.StopReason = w.stopped
	}
	r.reclassifyLocked(w)
	noteLocked(w)
	r.place.release(w.rec.Host)
	lostStart = w.forEngine && !w.everIn && !w.removed && w.stopped == NoStopReason && !r.standing.trainingOver && !r.standing.draining
	r.exitedLocked(w)
	return WorkerExited{At: now(), Worker: w.rec.WorkerRef, Name: w.rec.Name, State: w.rec.State, StopReason: w.rec.StopReason, Err: w.rec.Err}, lostStart
}

// records describes the processes kept (every running one and the newest
// keepExited that exited), by launch index.
func (r *roster) records() []WorkerRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerRecord, 0, len(r.procs))
	for _, p := range r.procs {
		out = append(out, p.rec)
	}
	return out
}

// final is the roster at the job's end: the record of every process kept,
// rule 6 applied with all the runner knows by then, the counts of the
// others by how they ended (rule 6 too), and the hand-started workers (in
// last, the last world, or not, and whether they finished training).
func (r *roster) final(last epoch.World) ([]WorkerRecord, WorkerCounts, []HandStartedWorker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var recs []WorkerRecord
	for _, p := range r.procs {
		r.reclassifyLocked(p)
		recs = append(recs, p.rec)
	}
	earlier := r.earlier
	earlier.StoppedBy = maps.Clone(earlier.StoppedBy)
	if r.standing.trainingOver {
		earlier.Finished -= r.finishedNeverIn
		earlier.addStopped(StopNotNeeded, r.finishedNeverIn)
	}
	return recs, earlier, r.hand.final(last, r.standing.trainingOver)
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
		ps = append(ps, p.p)
	}
	return ps
}

// drain marks the job as draining (LeaveAll) and lists its running
// processes.
func (r *roster) drain() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.standing.draining = true
	return r.runningLocked()
}

// running lists the processes still running.
func (r *roster) running() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runningLocked()
}

func (r *roster) runningLocked() []Process {
	var procs []Process
	for _, p := range r.procs {
		if p.rec.State == Running {
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
		if _, ours := r.matchLocked(w); !ours {
			n++
		}
	}
	return n
}

// learn maps the driver's workers ws to the processes of the job: by the
// launch index a worker publishes, or else by its process id on this host,
// and notes their gossip addresses (onGossip).
func (r *roster) learn(ws []driver.WorkerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if p, _ := r.matchLocked(w); p != nil {
			p.rec.Name = w.Name
			r.byName[w.Name] = p
			if w.Gossip != "" && w.Gossip != p.gossip {
				p.gossip = w.Gossip
				if r.onGossip != nil {
					r.onGossip(p.rec.Index, w.Gossip)
				}
			}
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
	if q := r.findLocked(index); q != nil {
		for name, p := range r.byName {
			if p == q {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// matchLocked is the kept process behind the driver's worker w, and ours
// says w is a process of the job: it publishes a launch index the job gave
// out (p is nil when its process exited and its record was dropped, or,
// for a moment, while its launch is being recorded), or it runs here under
// a running process's pid. A worker that is not ours was started by hand.
func (r *roster) matchLocked(w driver.WorkerInfo) (p *proc, ours bool) {
	if w.Launch != "" {
		i, err := strconv.Atoi(w.Launch)
		if err != nil || i < 0 || i >= r.launches {
			return nil, false
		}
		return r.findLocked(i), true
	}
	if w.PID == 0 || w.Host != r.localHost {
		return nil, false
	}
	for _, p := range r.procs {
		if p.rec.Host == "" && p.rec.PID == w.PID && p.rec.State == Running {
			return p, true
		}
	}
	return nil, false
}

// notJoined lists the running processes of the job that are none of ws,
// the driver's workers, in launch order.
func (r *roster) notJoined(ws []driver.WorkerInfo) []WorkerRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	joined := map[*proc]bool{}
	for _, w := range ws {
		if p, _ := r.matchLocked(w); p != nil {
			joined[p] = true
		}
	}
	var out []WorkerRef
	for _, p := range r.procs {
		if p.rec.State == Running && !joined[p] {
			out = append(out, p.rec.WorkerRef)
		}
	}
	return out
}

// nameOf is process index's member name ("" when not known).
func (r *roster) nameOf(index int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.findLocked(index); p != nil {
		return p.rec.Name
	}
	return ""
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

// firstGone counts the first n launches that are not running: exited (or
// failed to start, or not launched yet).
func (r *roster) firstGone(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	gone := min(r.launches, n)
	for _, p := range r.procs {
		if p.rec.Index < n && p.rec.State == Running {
			gone--
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
	p.stop(StopStuck)
	p.midway = true
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
		if p.rec.Host == host && p.rec.State == Running {
			p.stop(StopHostDropped)
			victims = append(victims, p.p)
			if p.rec.Name != "" {
				names = append(names, p.rec.Name)
			}
		}
	}
	return victims, names
}

// exitedProc is a process that has exited, kept in place of the launcher's
// Process, which holds its command, environment and pipes: the job keeps
// the records of up to Config.KeepExitedWorkers exited workers.
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
