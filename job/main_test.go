package job_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/envconfig"
	gsync "github.com/gorovod/gorovod/sync"
)

// The test binary is also the trainer the tests' jobs run: started with a
// job's environment, it runs trainer instead of the tests.
const (
	envModes    = "JOBTEST_MODES"     // the mode of each launch index, comma-separated; the last one repeats
	envSteps    = "JOBTEST_STEPS"     // steps to train; default 20
	envStepTime = "JOBTEST_STEP_TIME" // simulated compute per step; default 10ms
	// envHeap: print {"heap":..,"epoch":..} (the live heap after a
	// collection) at the first committed step of every world.
	envHeap = "JOBTEST_HEAP"
	// envGate names a FIFO a worker in mode "late" opens before it starts:
	// it starts once the test opens the FIFO for writing.
	envGate = "JOBTEST_GATE"
	// envHeapProfiles names a directory where a worker reporting its heap
	// (envHeap) also writes its heap profile, heap-<launch index>.pb.gz.
	envHeapProfiles = "JOBTEST_HEAP_PROFILES"
)

func TestMain(m *testing.M) {
	if gsync.UnderLauncher() {
		os.Exit(trainer())
	}
	os.Exit(m.Run())
}

// trainer is a worker of a test job. Modes:
//
//	train  train the steps elastically, print {"step":..,"size":..} per
//	       committed step, and report the end of training (the default);
//	       on SIGTERM (job.LeaveSignal), leave gracefully at a commit
//	fail   exit with status 3 at once
//	kill   die from SIGKILL at once
//	wait   never join: wait for the stop signal (a worker that arrives too
//	       late), then exit with status 1
//	waitok as wait, but exit with status 0
//	exit   exit with status 0 at once, as a command that is not a trainer
//	deaf   never join, and ignore the stop and leave signals (a deadlocked
//	       process): only SIGKILL ends it
//	late   train, but only once the FIFO named by JOBTEST_GATE opens
//	pause  pause itself (SIGSTOP) before it joins, then train if continued
//	pausemid   train, and pause itself (SIGSTOP) once, after committing
//	       step 5; train on if continued
//	killmid    train, and die from SIGKILL after committing step 5
func trainer() int {
	mode := "train"
	if modes := strings.Split(os.Getenv(envModes), ","); modes[0] != "" {
		i, _, _ := envconfig.LaunchIndex(os.Getenv)
		mode = modes[min(i, len(modes)-1)]
	}
	switch mode {
	case "fail":
		fmt.Fprintln(os.Stderr, "failing on purpose")
		return 3
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "exit":
		return 0
	case "pause":
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case "late":
		gate, err := os.Open(os.Getenv(envGate)) // blocks until the test opens it for writing
		if err != nil {
			fmt.Fprintln(os.Stderr, "trainer:", err)
			return 1
		}
		gate.Close()
	case "deaf":
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
		fmt.Println("waiting")
		select {}
	case "wait", "waitok":
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGINT)
		fmt.Println("waiting")
		<-stop
		if mode == "waitok" {
			return 0
		}
		return 1
	}
	steps := int64(20)
	if s := os.Getenv(envSteps); s != "" {
		steps, _ = strconv.ParseInt(s, 10, 64)
	}
	stepTime := 10 * time.Millisecond
	if s := os.Getenv(envStepTime); s != "" {
		stepTime, _ = time.ParseDuration(s)
	}
	if err := train(steps, stepTime, mode); err != nil {
		fmt.Fprintln(os.Stderr, "trainer:", err)
		return 1
	}
	return 0
}

// midStep is the step after which a worker in mode pausemid or killmid
// pauses or dies.
const midStep = 5

func train(steps int64, stepTime time.Duration, mode string) error {
	cfg, err := gsync.WorkerConfigFromEnv()
	if err != nil {
		return err
	}
	// What a takeover would require of a world (the job's minimum, from
	// GOROVOD_MIN_WORKERS), and how long it waits for a world
	// (GOROVOD_ELASTIC_TIMEOUT): TestRunTrainsToTheEnd checks them.
	fmt.Printf("min workers %d, elastic timeout %v\n", cfg.MinWorkers, cfg.Session.RecoveryTimeout)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
	defer stop()
	leave := make(chan os.Signal, 1)
	signal.Notify(leave, syscall.SIGTERM)
	params := make([]float32, 64)
	state := gsync.NewState()
	state.RegisterTensor("params", params)
	w, err := gsync.StartWorker(ctx, cfg, state)
	if err != nil {
		return err
	}
	w.SetTotalSteps(steps)
	grads := make([]float32, len(params))
	reportHeap := os.Getenv(envHeap) != ""
	if os.Getenv(envHeapProfiles) != "" {
		runtime.MemProfileRate = 64 // every allocation shows in the profiles' difference
	}
	var heapEpoch uint64
	for w.Step() < steps {
		select {
		case <-leave:
			if err := w.RequestLeave(ctx); err != nil {
				w.Close()
				return err
			}
			leave = nil // asked once
		default:
		}
		time.Sleep(stepTime)
		for i := range grads {
			grads[i] = float32(i)
		}
		w.RecordSamples(1)
		w.RecordLoss(1 / float64(w.Step()+1))
		err := w.Allreduce(ctx, gsync.Reduction{}, collective.SliceBuffer(grads))
		if errors.Is(err, gsync.ErrWorldChanged) {
			continue
		}
		if errors.Is(err, gsync.ErrExcluded) {
			// The world the failed collective recovered into leaves this
			// worker out.
			if done, err := leftOut(ctx, w, leave == nil); done {
				return err
			}
			continue
		}
		if err != nil {
			w.Close()
			return err
		}
		for i := range params {
			params[i] += grads[i]
		}
		size := w.Size()
		switch err := w.Commit(ctx); {
		case errors.Is(err, gsync.ErrWorldChanged):
			continue
		case errors.Is(err, gsync.ErrExcluded):
			if done, err := leftOut(ctx, w, leave == nil); done {
				return err
			}
			continue
		case err != nil:
			w.Close()
			return err
		}
		fmt.Printf("{\"step\":%d,\"size\":%d}\n", w.Step(), size)
		if w.Step() == midStep {
			switch mode {
			case "pausemid":
				mode = "train" // once: a step redone after the pause passes here again
				_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			case "killmid":
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
		if e := w.World().Number; reportHeap && e != heapEpoch {
			heapEpoch = e
			fmt.Printf("{\"heap\":%d,\"epoch\":%d}\n", liveHeap(), e)
			if err := writeHeapProfile(); err != nil {
				fmt.Fprintln(os.Stderr, "trainer:", err)
			}
		}
	}
	return w.Finish(ctx)
}

// leftOut answers ErrExcluded as sync.Train does (rule 6 in end.go): a
// worker that asked to leave is done; one left out while it was paused or
// cut off (under load, gossip declares a starved worker dead and its probe
// goes unanswered) comes back as a new member (Worker.Rejoin), unless the
// job will not admit it again. A worker that ended instead would leave a job
// at its MinWorkers one worker short for good: the floor replaces none.
func leftOut(ctx context.Context, w *gsync.Worker, asked bool) (done bool, err error) {
	if asked {
		return true, w.Close()
	}
	switch err := w.Rejoin(ctx); {
	case errors.Is(err, gsync.ErrOutForGood):
		return true, w.Close()
	case err != nil:
		w.Close()
		return true, err
	}
	fmt.Fprintf(os.Stderr, "trainer: left out, back as %s\n", w.Name())
	return false, nil
}

// liveHeap is the bytes of the heap's live objects, measured after two
// collections (the second frees what the first's finalizers released).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// writeHeapProfile writes the heap profile into envHeapProfiles, when set,
// replacing the previous one at once (a rename).
func writeHeapProfile() error {
	dir := os.Getenv(envHeapProfiles)
	if dir == "" {
		return nil
	}
	i, _, _ := envconfig.LaunchIndex(os.Getenv)
	f, err := os.CreateTemp(dir, "heap-*.tmp")
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, fmt.Sprintf("heap-%d.pb.gz", i)))
}
