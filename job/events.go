package job

import (
	"fmt"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/sync/epoch"
)

// Sink receives a job's events: the human display of `gorovod run`, JSON
// lines, metrics, a timeline. The runner calls Event for one event at a time,
// in order, from its own goroutines; Event must not call the Job's methods
// that change it (AddWorkers) and should return quickly: worker output waits
// for it.
type Sink interface {
	Event(Event)
}

// SinkFunc makes a function a Sink.
type SinkFunc func(Event)

// Event calls f.
func (f SinkFunc) Event(e Event) { f(e) }

// Event is one of the types below; a sink switches on the type and ignores
// the kinds it does not know (more may come).
type Event interface {
	// When is the time the event happened.
	When() time.Time
}

// At is the time an event happened; the event types embed it.
type At struct {
	Time time.Time `json:"time"`
}

// When returns the time.
func (a At) When() time.Time { return a.Time }

// JobStarted: the driver runs and the first workers have been launched (a
// WorkerStarted follows for each, with Initial set).
type JobStarted struct {
	At
	JobID string `json:"job_id"`
	// DriverAddr is the gossip address workers join through.
	DriverAddr string `json:"driver_addr"`
	// JobFile is the path of the job file (Config.JobFile), or "".
	JobFile string `json:"job_file,omitempty"`
	Workers int    `json:"workers"`
	// Adopted: this runner took the job back (Config.Adopt); Workers are
	// those it found running.
	Adopted bool `json:"adopted,omitempty"`
}

// WorkerRef names a worker process the runner launched.
type WorkerRef struct {
	Index int    `json:"index"` // the launch index
	Host  string `json:"host,omitempty"`
	PID   int    `json:"pid,omitempty"`
}

// String names the process for a person: "worker 2 (pid 4711)", with " on
// HOST" for a process on another host.
func (w WorkerRef) String() string {
	if w.Host != "" {
		return fmt.Sprintf("worker %d (pid %d on %s)", w.Index, w.PID, w.Host)
	}
	return fmt.Sprintf("worker %d (pid %d)", w.Index, w.PID)
}

// WorkerStarted: a worker process was launched.
type WorkerStarted struct {
	At
	Worker WorkerRef `json:"worker"`
	// Initial says it is one of the workers the job started with (rather
	// than one added later, by AddWorkers or the autoscaling engine).
	Initial bool `json:"initial"`
	// Adopted: a running worker of an adopted job (Config.Adopt), not
	// started by this runner.
	Adopted bool `json:"adopted,omitempty"`
}

// WorkerExited: a worker process the runner launched has exited.
type WorkerExited struct {
	At
	Worker WorkerRef `json:"worker"`
	// Name is its member name, when it joined the job.
	Name  string      `json:"name,omitempty"`
	State WorkerState `json:"state"`
	// StopReason says why the runner stopped it, when State is Stopped.
	StopReason StopReason `json:"stop_reason,omitempty"`
	Err        error      `json:"-"`
}

// WorkerOutput is one line a worker printed; Line is valid only during the
// Event call.
type WorkerOutput struct {
	Worker int    // the launch index
	Stream string // "stdout" or "stderr"
	Line   []byte
}

// When is the zero time: output lines are not timestamped (there are many).
func (WorkerOutput) When() time.Time { return time.Time{} }

// WorldChanged: the driver proposed a new world. Joined and Left are the
// member names that entered and left it since the previous world: workers
// started by hand show here (and only here), as well as launched ones.
type WorldChanged struct {
	At
	World  epoch.World `json:"world"`
	Joined []string    `json:"joined,omitempty"`
	Left   []string    `json:"left,omitempty"`
	// ByHand are the members of Joined the runner did not launch: started by
	// hand with the job file (or by another launcher).
	ByHand []string `json:"by_hand,omitempty"`
}

// Autoscaling is an event of the autoscaling engine: a decision, its outcome,
// a straggler, or a world as the engine measures it.
type Autoscaling struct {
	heuristics.Event
}

// When is the engine's time of the event.
func (a Autoscaling) When() time.Time { return a.Time }

// TrainingFinished: a member of the current world reported that training is
// over. The workers of the last world exit by themselves; others still
// waiting to join are stopped after Config.FinishGrace.
type TrainingFinished struct {
	At
}

// HostsChanged: the Discovery reported a new host list.
type HostsChanged struct {
	At
	Hosts []Host `json:"hosts"`
}

// Notice is something a person watching the job should know that has no
// event of its own (a worker that got no GPU, a removed worker that would not
// exit, an error of the Discovery), as a sentence.
type Notice struct {
	At
	Message string `json:"message"`
}

// JobEnded: every worker process has exited; the last event.
type JobEnded struct {
	At
	Outcome Outcome `json:"outcome"`
}

func now() At { return At{Time: time.Now()} }
