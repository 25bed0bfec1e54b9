package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	gsync "github.com/gorovod/gorovod/sync"
)

// world is where the trainer's gradients are averaged: the elastic job when
// the process runs under `gorovod run`, or a world of one otherwise, so the same
// loop serves the single-process baseline.
type world interface {
	Rank() int
	Size() int
	WorldEpoch() uint64
	Step() int64
	Allreduce(ctx context.Context, grads [][]float32) error
	Commit(ctx context.Context) error
	// RecordSamples and SetTotalSteps tell the autoscaling engine the step's
	// samples and the job's length.
	RecordSamples(n int)
	SetTotalSteps(n int64)
	// Finish reports that training is over and leaves.
	Finish(ctx context.Context) error
	// CheckLeave starts a graceful leave once SIGTERM has arrived.
	CheckLeave(ctx context.Context) error
	Close() error
}

func joinWorld(ctx context.Context, state *gsync.State, verbose bool, stderr io.Writer) (world, error) {
	cfg, err := gsync.WorkerConfigFromEnv()
	if err != nil {
		if gsync.UnderLauncher() {
			return nil, err
		}
		return &single{state: state}, nil
	}
	if verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	w, err := gsync.StartWorker(ctx, cfg, state)
	if err != nil {
		return nil, err
	}
	e := &elastic{Worker: w, term: make(chan os.Signal, 1)}
	signal.Notify(e.term, syscall.SIGTERM)
	return e, nil
}

type elastic struct {
	*gsync.Worker
	term    chan os.Signal
	leaving bool
}

func (e *elastic) WorldEpoch() uint64 { return e.World().Number }

func (e *elastic) CheckLeave(ctx context.Context) error {
	select {
	case <-e.term:
		if !e.leaving {
			e.leaving = true
			if err := e.RequestLeave(ctx); err != nil {
				return fmt.Errorf("asking to leave: %w", err)
			}
		}
	default:
	}
	return nil
}

func (e *elastic) Close() error {
	signal.Stop(e.term)
	return e.Worker.Close()
}

func (e *elastic) Finish(ctx context.Context) error {
	signal.Stop(e.term)
	return e.Worker.Finish(ctx)
}

// single is the world of one process.
type single struct{ state *gsync.State }

func (s *single) Rank() int                                    { return 0 }
func (s *single) Size() int                                    { return 1 }
func (s *single) WorldEpoch() uint64                           { return 0 }
func (s *single) Step() int64                                  { return s.state.Step }
func (s *single) Allreduce(context.Context, [][]float32) error { return nil }
func (s *single) CheckLeave(context.Context) error             { return nil }
func (s *single) Close() error                                 { return nil }

func (s *single) Commit(context.Context) error {
	s.state.Step++
	return nil
}

func (s *single) Finish(context.Context) error { return nil }
func (s *single) RecordSamples(int)            {}
func (s *single) SetTotalSteps(int64)          {}
