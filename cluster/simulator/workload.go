package simulator

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WorkloadJob is one job of a workload: when it arrives, which model it
// trains, and the replica count and batch size its user asked for (the
// baselines use them; Pollux chooses its own).
type WorkloadJob struct {
	Name      string
	Submitted time.Duration // since the workload began
	Model     string
	Replicas  int
	BatchSize int
	// Epochs, when set, is the job's training length in epochs instead of
	// its model's MaxEpochs; at most the epochs its validation traces
	// record.
	Epochs int
	// MaxReplicas, when set, caps the replicas Pollux and Optimus give the
	// job (below its model's cap, if any); Tiresias runs Replicas.
	MaxReplicas int
	// MinReplicas, when set, is the fewest replicas the job runs on: every
	// policy gives it at least this many or none, and Config.Elastic keeps
	// a running job at it.
	MinReplicas int
}

// ReadWorkloadFile reads a workload CSV file (see ParseWorkload).
func ReadWorkloadFile(path string) ([]WorkloadJob, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	jobs, err := ParseWorkload(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return jobs, nil
}

// maxSubmitSeconds bounds arrival times (a year) so they fit a Duration.
const maxSubmitSeconds = 365 * 24 * 3600

// ParseWorkload parses a workload in the format of Pollux's artifact: a header
// naming the columns name, time (seconds), application, num_replicas and
// batch_size, then one job per row. Three optional columns set a job's own
// length and bounds: epochs (WorkloadJob.Epochs), max_replicas
// (WorkloadJob.MaxReplicas) and min_replicas (WorkloadJob.MinReplicas), each
// a positive integer or empty for the default. Names must be unique; the jobs
// are returned in file order.
func ParseWorkload(r io.Reader) ([]WorkloadJob, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("workload header: %w", err)
	}
	index := map[string]int{}
	for i, h := range header {
		index[strings.TrimSpace(h)] = i
	}
	for _, c := range []string{"name", "time", "application", "num_replicas", "batch_size"} {
		if _, ok := index[c]; !ok {
			return nil, fmt.Errorf("workload: no column %q (have %q)", c, header)
		}
	}
	var jobs []WorkloadJob
	seen := map[string]bool{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		line, _ := cr.FieldPos(0)
		field := func(c string) string { return strings.TrimSpace(rec[index[c]]) }
		j := WorkloadJob{Name: field("name"), Model: field("application")}
		if j.Name == "" || j.Model == "" {
			return nil, fmt.Errorf("workload line %d: empty name or application", line)
		}
		if seen[j.Name] {
			return nil, fmt.Errorf("workload line %d: job %q appears twice", line, j.Name)
		}
		seen[j.Name] = true
		t, err := strconv.ParseFloat(field("time"), 64)
		if err != nil || math.IsNaN(t) || t < 0 || t > maxSubmitSeconds {
			return nil, fmt.Errorf("workload line %d: time %q is not a number of seconds in [0, %d]", line, field("time"), maxSubmitSeconds)
		}
		j.Submitted = time.Duration(t * float64(time.Second))
		for _, p := range []struct {
			col      string
			dst      *int
			optional bool
		}{
			{"num_replicas", &j.Replicas, false}, {"batch_size", &j.BatchSize, false},
			{"epochs", &j.Epochs, true}, {"max_replicas", &j.MaxReplicas, true},
			{"min_replicas", &j.MinReplicas, true},
		} {
			if _, ok := index[p.col]; !ok && p.optional {
				continue
			}
			s := field(p.col)
			if s == "" && p.optional {
				continue // the model's
			}
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 || v > 1<<24 {
				return nil, fmt.Errorf("workload line %d: %s %q is not a positive integer", line, p.col, s)
			}
			*p.dst = v
		}
		if j.MaxReplicas > 0 && j.MinReplicas > j.MaxReplicas {
			return nil, fmt.Errorf("workload line %d: min_replicas %d above max_replicas %d", line, j.MinReplicas, j.MaxReplicas)
		}
		jobs = append(jobs, j)
	}
	if len(jobs) == 0 {
		return nil, errors.New("workload: no jobs")
	}
	return jobs, nil
}

// Applications returns the applications (models) a workload's jobs name,
// sorted and without duplicates: the ones whose traces it needs.
func Applications(jobs []WorkloadJob) []string {
	var apps []string
	for _, j := range jobs {
		apps = append(apps, j.Model)
	}
	slices.Sort(apps)
	return slices.Compact(apps)
}
