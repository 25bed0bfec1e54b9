package pool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// JobSpec describes one job of the pool.
type JobSpec struct {
	// Name names the job in the pool's table; unique.
	Name string
	// Argv is the worker command; Env holds NAME=value entries its workers
	// get besides the job's own (and Config.Job.Env).
	Argv []string
	Env  []string
	// Workers is the size the job's user asks for: Tiresias runs it at this
	// size. Default MinWorkers.
	Workers int
	// MinWorkers is the fewest workers the job runs with (default 1): it
	// starts only once that many slots are free and keeps them to its end.
	// MaxWorkers is the most (0: the whole pool).
	MinWorkers, MaxWorkers int
	// Submit is when the job arrives, after the pool starts.
	Submit time.Duration
	// InitBatch is M0 for the job's goodput model, the global batch its
	// learning rate is tuned for (0: its first step's); Limits bound the
	// batch sizes the model may choose (zero: the job keeps its batch).
	InitBatch int
	Limits    goodput.Limits
}

// ErrInvalidJobs is wrapped by every error about a jobs file or a JobSpec.
var ErrInvalidJobs = errors.New("pool: invalid jobs")

// fileJob is a job in a jobs file.
type fileJob struct {
	Name       string         `json:"name"`
	Argv       []string       `json:"argv"`
	Env        []string       `json:"env"`
	Workers    int            `json:"workers"`
	MinWorkers int            `json:"min_workers"`
	MaxWorkers int            `json:"max_workers"`
	Submit     string         `json:"submit"`
	InitBatch  int            `json:"init_batch"`
	Limits     goodput.Limits `json:"limits"`
}

// ReadJobs reads a jobs file: a JSON array of objects with the fields name,
// argv, env, workers, min_workers, max_workers, submit (a duration such as
// "30s"), init_batch and limits (max_batch, min_micro_batch,
// max_micro_batch, accumulation); only name and argv are required. Unknown
// fields are errors (a misspelt field would silently do nothing).
func ReadJobs(r io.Reader) ([]JobSpec, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var file []fileJob
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJobs, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: more than one JSON value (want one array of jobs)", ErrInvalidJobs)
	}
	specs := make([]JobSpec, len(file))
	for i, f := range file {
		s := JobSpec{Name: f.Name, Argv: f.Argv, Env: f.Env, Workers: f.Workers, MinWorkers: f.MinWorkers,
			MaxWorkers: f.MaxWorkers, InitBatch: f.InitBatch, Limits: f.Limits}
		if f.Submit != "" {
			if s.Submit, err = time.ParseDuration(f.Submit); err != nil {
				return nil, fmt.Errorf("%w: job %d (%q): submit: %v", ErrInvalidJobs, i+1, f.Name, err)
			}
		}
		specs[i] = s
	}
	if err := validateSpecs(specs, 0); err != nil {
		return nil, err
	}
	return specs, nil
}

// validateSpecs checks the jobs, and with slots > 0 that each fits the pool.
func validateSpecs(specs []JobSpec, slots int) error {
	if len(specs) == 0 {
		return fmt.Errorf("%w: no jobs", ErrInvalidJobs)
	}
	seen := map[string]bool{}
	for i, s := range specs {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: job %d (%q): %s", ErrInvalidJobs, i+1, s.Name, fmt.Sprintf(format, args...))
		}
		switch {
		case s.Name == "":
			return bad("no name")
		case seen[s.Name]:
			return bad("the name is taken by an earlier job")
		case len(s.Argv) == 0 || s.Argv[0] == "":
			return bad("no command (argv)")
		case s.Workers < 0 || s.MinWorkers < 0 || s.MaxWorkers < 0 || s.InitBatch < 0:
			return bad("negative workers, min_workers, max_workers or init_batch")
		case s.MaxWorkers > 0 && (max(s.MinWorkers, 1) > s.MaxWorkers || s.Workers > s.MaxWorkers):
			return bad("min_workers %d and workers %d must not exceed max_workers %d", s.MinWorkers, s.Workers, s.MaxWorkers)
		case s.Workers > 0 && s.Workers < s.MinWorkers:
			return bad("workers %d is below min_workers %d", s.Workers, s.MinWorkers)
		case s.Submit < 0:
			return bad("negative submit time")
		case slots > 0 && max(s.MinWorkers, s.Workers, 1) > slots:
			return bad("needs %d workers, the pool has %d slots", max(s.MinWorkers, s.Workers, 1), slots)
		}
		if s.InitBatch > 0 {
			if err := s.Limits.Validate(s.InitBatch); err != nil {
				return bad("%v", err)
			}
		}
		seen[s.Name] = true
	}
	return nil
}
