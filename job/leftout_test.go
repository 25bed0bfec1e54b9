package job_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/sync/epoch"
)

// leftOutWatch is the sink of TestPausedWorkerLeftOutComesBack: the newest
// world, and the workers that exited.
type leftOutWatch struct {
	mu     sync.Mutex
	world  epoch.World
	exited []job.WorkerExited
	// steps counts the steps each worker (by launch index) committed in a
	// world of three.
	steps map[int]int
	// said is each worker's newest "trainer: ..." line: why one ended.
	said   map[int]string
	notify chan struct{}
}

func (l *leftOutWatch) Event(e job.Event) {
	l.mu.Lock()
	switch e := e.(type) {
	case job.WorldChanged:
		l.world = e.World
	case job.WorkerExited:
		l.exited = append(l.exited, e)
	case job.WorkerOutput:
		if e.Stream == "stderr" && bytes.HasPrefix(e.Line, []byte("trainer: ")) {
			l.said[e.Worker] = string(e.Line)
		}
		var line struct {
			Step int64 `json:"step"`
			Size int   `json:"size"`
		}
		if e.Stream != "stdout" || json.Unmarshal(e.Line, &line) != nil || line.Size != 3 {
			l.mu.Unlock()
			return
		}
		l.steps[e.Worker]++
	default:
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds of the newest world, failing at once if
// worker index exits (a worker left out must come back, not end).
func (l *leftOutWatch) waitFor(ctx context.Context, what string, index int, cond func(w epoch.World, steps int) bool) error {
	for {
		l.mu.Lock()
		world, exited, steps, said := l.world, slices.Clone(l.exited), l.steps[index], l.said[index]
		l.mu.Unlock()
		for _, e := range exited {
			if e.Worker.Index == index {
				return fmt.Errorf("waiting for %s: worker %d exited (%s, %v: %q) instead of coming back; newest world %v", what, index, e.State, e.Err, said, world)
			}
		}
		if cond(world, steps) {
			return nil
		}
		select {
		case <-l.notify:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (newest world %v)", what, ctx.Err(), world)
		}
	}
}

// A worker paused long enough for the driver to leave it out of the world
// (gossip declares it dead and it does not answer its probe: what a load
// spike does to a starved worker) comes back once it runs again, and the job
// trains in a world of three again. The test trainer answers ErrExcluded as
// sync.Train does (rule 6 in end.go): one that ended instead (status 1 when
// the failed collective's recovery landed in the world without it) left the
// churn soak (TestSoakChurn) at a world of two, its MinWorkers, which the job
// had no reason to grow, while the soak waited for three.
//
// Whether the resumed worker's session sees the world without it depends on
// a race: when the proposer admits it again under its old name (its gossip
// refutes its death) before the session awaits the next world, it never
// does. So the worker is paused again, up to pauseRounds times, until a
// round where it came back as a new member: the path that ended it before.
func TestPausedWorkerLeftOutComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts, pauses and resumes real worker processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	watch := &leftOutWatch{notify: make(chan struct{}, 1), steps: map[int]int{}, said: map[int]string{}}
	cfg := job.Config{Argv: []string{os.Args[0]}, Workers: 3, MinWorkers: 2,
		Env:   []string{envSteps + "=1000000000", envStepTime + "=1ms"},
		Sinks: []job.Sink{watch}}
	j, err := job.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_, _ = j.Wait()
	}()
	const paused = 1 // the launch index paused
	record := func() job.WorkerRecord {
		for _, rec := range j.Workers() {
			if rec.Index == paused {
				return rec
			}
		}
		return job.WorkerRecord{}
	}
	var pausedAs string // the member name it had when last paused
	for round := 1; ; round++ {
		// It trains in a world of three before it is paused: paused while
		// that world connects, it is only a joiner the world goes on without.
		watch.mu.Lock()
		before := watch.steps[paused]
		watch.mu.Unlock()
		if err := watch.waitFor(ctx, "steps in a world of three", paused, func(w epoch.World, steps int) bool {
			rec := record()
			return len(w.Members) == 3 && steps >= before+10 && rec.State == job.Running && w.Rank(rec.Name) >= 0
		}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		victim := record()
		if pausedAs != "" && victim.Name != pausedAs {
			t.Logf("round %d: worker %d came back as a new member (%s, was %s); left out %d times, back %d times",
				round-1, paused, victim.Name, pausedAs, victim.Excluded, victim.Rejoined)
			return
		}
		pausedAs = victim.Name
		if round > pauseRounds {
			t.Skipf("in %d rounds the paused worker was always admitted again under its old name before it saw the world without it", pauseRounds)
		}
		if err := syscall.Kill(victim.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		err := watch.waitFor(ctx, "a world without the paused worker", paused, func(w epoch.World, _ int) bool {
			return w.Rank(victim.Name) < 0
		})
		if cerr := syscall.Kill(victim.PID, syscall.SIGCONT); cerr != nil {
			t.Fatal(cerr)
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// pauseRounds bounds TestPausedWorkerLeftOutComesBack's pauses.
const pauseRounds = 8
