package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	gsync "github.com/gorovod/gorovod/sync"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/gpu"
	"github.com/gorovod/gorovod/internal/launch"
	"github.com/gorovod/gorovod/membership"
)

// runCommand is `gorovod run`: the driver of an elastic job plus the local
// launcher of its workers.
func runCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	np := fs.Int("np", 2, "workers to start")
	minNP := fs.Int("min-np", 1, "fewest workers the job trains with; with fewer it waits for more")
	maxNP := fs.Int("max-np", 0, "most workers (0: no limit); SIGUSR1 adds one up to it")
	verbose := fs.Bool("v", false, "log the driver's decisions")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gorovod run [flags] -- TRAINER [ARGS...]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	argv := fs.Args()
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	switch {
	case len(argv) == 0:
		return runUsage(stderr, "no trainer command (gorovod run [flags] -- TRAINER ARGS...)")
	case *np < 1:
		return runUsage(stderr, "--np %d must be at least 1", *np)
	case *minNP < 1 || *minNP > *np:
		return runUsage(stderr, "--min-np %d must be between 1 and --np %d", *minNP, *np)
	case *maxNP != 0 && *maxNP < *np:
		return runUsage(stderr, "--max-np %d is below --np %d", *maxNP, *np)
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return runUsage(stderr, "trainer %q: %v", argv[0], err)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return runJob(ctx, argv, *np, *minNP, *maxNP, log, stdout, stderr)
}

func runUsage(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod run: "+format+"\n", args...)
	return errUsage
}

func runJob(ctx context.Context, argv []string, np, minNP, maxNP int, log *slog.Logger, stdout, stderr io.Writer) error {
	jobID, secret := launch.NewJobID(), launch.NewSecret()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	driver, err := gsync.StartDriver(startCtx, gsync.DriverConfig{
		JobID: jobID, Secret: secret, MinWorkers: minNP, Membership: membership.DefaultConfig(), Logger: log,
	})
	if err != nil {
		return err
	}
	defer driver.Close()
	worker := envconfig.ElasticWorker{JobID: jobID, Secret: secret, Seeds: []string{driver.GossipAddr()}}
	jobFile, err := writeJobFile(worker)
	if err != nil {
		return err
	}
	defer os.Remove(jobFile)

	devices := assignGPUs(ctx, np, stderr)
	var outMu sync.Mutex
	output := func(i int, stream string, line []byte) {
		outMu.Lock()
		defer outMu.Unlock()
		w := stdout
		if stream == "stderr" {
			w = stderr
		}
		fmt.Fprintf(w, "[%d] %s\n", i, line)
	}
	// Workers stop on SIGINT: a SIGTERM sent to one worker means "leave the job
	// gracefully", which the trainers implement.
	jobCtx, stopJob := context.WithCancel(ctx)
	defer stopJob()
	job, err := launch.Start(jobCtx, launch.Spec{
		Argv: argv, NP: np, Output: output, StopSignal: syscall.SIGINT,
		Env: func(i int) []string {
			env := worker.Environ()
			if i < len(devices) {
				env = append(env, envconfig.EnvVisibleDevices+"="+devices[i])
			}
			return env
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "gorovod run: job %s, %d workers, driver %s (pid %d)\n", jobID, np, driver.GossipAddr(), os.Getpid())
	for i, pid := range job.PIDs() {
		fmt.Fprintf(stderr, "gorovod run: worker %d pid %d\n", i, pid)
	}
	fmt.Fprintf(stderr, "gorovod run: add a worker with `kill -USR1 %d`, or start one by hand: env $(cat %s) %s\n",
		os.Getpid(), jobFile, strings.Join(argv, " "))

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	started := np
	finished := driver.Finished()
	var stopLate <-chan time.Time
	for {
		select {
		case <-finished:
			// Training is over; the workers of the last world exit by
			// themselves, and any still waiting to join are stopped.
			finished = nil
			stopLate = time.After(finishGrace)
		case <-stopLate:
			stopJob()
		case <-usr1:
			if maxNP > 0 && started >= maxNP {
				fmt.Fprintf(stderr, "gorovod run: already %d workers started (--max-np %d)\n", started, maxNP)
				continue
			}
			i, err := job.Add()
			if err != nil {
				fmt.Fprintf(stderr, "gorovod run: adding a worker: %v\n", err)
				continue
			}
			started++
			fmt.Fprintf(stderr, "gorovod run: worker %d pid %d\n", i, job.PIDs()[i])
		case <-job.Done():
			return jobOutcome(job.Errors(), driver.Current(), stderr)
		}
	}
}

// assignGPUs gives each of the first np workers one GPU of this host, in ring
// order, when the host has enough; with none (or no NVIDIA driver) the workers
// run on the CPU.
func assignGPUs(ctx context.Context, np int, stderr io.Writer) []string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	inv, err := gpu.System(ctx)
	if err != nil {
		if !gpu.IsNoGPUs(err) {
			fmt.Fprintf(stderr, "gorovod run: GPU discovery: %v\n", err)
		}
		return nil
	}
	devices, err := gpu.AssignDevices(inv.GPUs, np)
	if err != nil {
		fmt.Fprintf(stderr, "gorovod run: %v; workers choose their GPUs themselves\n", err)
		return nil
	}
	fmt.Fprintf(stderr, "gorovod run: one GPU per worker: %s\n", strings.Join(devices, ", "))
	return devices
}

// finishGrace is how long workers get to exit once training is reported
// finished before the launcher stops the rest.
const finishGrace = 3 * time.Second

// jobOutcome: the job succeeded if some worker finished training and every
// failure was a worker lost to a signal (killed, or stopped by us) — losing
// workers is what an elastic job survives. A worker that exited with an error
// of its own fails the job.
func jobOutcome(errs []error, final gsync.Epoch, stderr io.Writer) error {
	succeeded, lost := 0, 0
	var failed []error
	for _, err := range errs {
		var ee *launch.ExitError
		var xe *exec.ExitError
		switch {
		case err == nil:
			succeeded++
		case errors.As(err, &ee) && errors.As(err, &xe) && xe.ExitCode() == -1:
			lost++ // ended by a signal
		default:
			failed = append(failed, err)
		}
	}
	fmt.Fprintf(stderr, "gorovod run: %d workers finished, %d lost, %d failed; last world epoch %d had %d workers\n",
		succeeded, lost, len(failed), final.Number, len(final.Members))
	if len(failed) > 0 {
		return fmt.Errorf("job failed: %w", errors.Join(failed...))
	}
	if succeeded == 0 {
		return errors.New("job failed: no worker finished")
	}
	return nil
}

// writeJobFile records what a hand-started worker needs to join, readable by
// this user only (it holds the job secret).
func writeJobFile(w envconfig.ElasticWorker) (string, error) {
	f, err := os.CreateTemp("", "gorovod-job-*.env")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return "", err
	}
	_, err = f.WriteString(strings.Join(w.Environ(), "\n") + "\n")
	return f.Name(), err
}
