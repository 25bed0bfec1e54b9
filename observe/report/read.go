package report

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/gorovod/gorovod/heuristics"
)

// Progress is one periodic record of a running job, as `gorovod run --json`
// prints it: {"event":"progress", ...}. Fields a run cannot measure are
// omitted; every field is optional.
type Progress struct {
	Elapsed float64 `json:"elapsed_s"` // since the first world formed
	Step    int64   `json:"step"`
	Workers int     `json:"workers"`
	Epoch   uint64  `json:"world_epoch"`
	// Throughput is the job's, all workers together, in Unit (samples/s, or
	// steps/s when the trainer reports no samples).
	Throughput float64 `json:"throughput,omitempty"`
	Unit       string  `json:"unit,omitempty"`
	// StepMS and ComputeMS are the median step time and compute time over
	// the record's window, in milliseconds.
	StepMS    float64 `json:"step_ms,omitempty"`
	ComputeMS float64 `json:"compute_ms,omitempty"`
	// Loss is the mean training loss the workers reported over the window
	// (absent when the trainer reports none).
	Loss *float64 `json:"loss,omitempty"`
}

// TrainerStep is one step as the trainers' own JSON lines describe it,
// averaged over the workers that printed it.
type TrainerStep struct {
	Step    int64
	Loss    float64 // mean over the lines that had one; NaN when none did
	StepMS  float64 // median over the lines; 0 when none had it
	Workers int     // the world size the lines report (the largest)
	Global  int     // samples the world processed in the step (0: unknown)
	Lines   int     // how many lines described the step
}

// Run is what Read found in a run's output.
type Run struct {
	// Events are the engine's events in order (world changes, decisions and
	// their outcomes, stragglers, errors).
	Events []heuristics.Event
	// Summary is the run's final summary; nil when the output has none (the
	// run was interrupted, or the output was cut).
	Summary  *heuristics.Summary
	Progress []Progress
	Steps    []TrainerStep // by step
	// Lines counts the lines read, Skipped those that were none of the
	// above (progress bars, trainers' plain text), Bad those that looked like
	// one of the above and did not decode.
	Lines, Skipped, Bad int
	// FirstBad describes the first bad line, for a message.
	FirstBad string
}

// maxLine bounds one line; longer ones (a trainer dumping a tensor) are
// skipped rather than read into memory.
const maxLine = 4 << 20

// Read reads a run's output. It fails only when r fails; lines it cannot use
// are counted in Skipped and Bad.
func Read(r io.Reader) (*Run, error) {
	run := &Run{}
	steps := map[int64]*stepAcc{}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, tooLong, err := readLine(br)
		if len(line) > 0 || tooLong {
			run.Lines++
			if tooLong {
				run.Skipped++
			} else {
				run.parseLine(line, steps)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return run, err
		}
	}
	run.Steps = finishSteps(steps)
	slices.SortStableFunc(run.Progress, func(a, b Progress) int { return cmp.Compare(a.Elapsed, b.Elapsed) })
	return run, nil
}

// readLine returns the next line without its newline; a line over maxLine is
// consumed and reported as tooLong.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if len(buf)+len(chunk) > maxLine {
			tooLong = true
		} else {
			buf = append(buf, chunk...)
		}
		if err != nil || !isPrefix {
			if tooLong {
				buf = nil
			}
			return bytes.TrimSpace(buf), tooLong, err
		}
	}
}

// stepAcc gathers the trainer lines of one step.
type stepAcc struct {
	loss    float64
	nLoss   int
	ms      []float64
	workers int
	global  int
	lines   int
}

// envelope is the part of a line that says what it is.
type envelope struct {
	Event *string `json:"event"`
}

func (run *Run) bad(line []byte, err error) {
	run.Bad++
	if run.FirstBad == "" {
		s := string(line)
		if len(s) > 120 {
			s = s[:120] + "…"
		}
		run.FirstBad = fmt.Sprintf("line %d %q: %v", run.Lines, s, err)
	}
}

func (run *Run) parseLine(line []byte, steps map[int64]*stepAcc) {
	if line[0] == '[' {
		run.parseWorkerLine(line, steps)
		return
	}
	if line[0] != '{' {
		run.Skipped++
		return
	}
	var env envelope
	if err := json.Unmarshal(line, &env); err != nil {
		run.bad(line, err)
		return
	}
	if env.Event == nil {
		run.Skipped++
		return
	}
	switch *env.Event {
	case "summary":
		if sum, ok := decodeLine(run, line, func(*heuristics.Summary) float64 { return 0 }); ok {
			run.Summary = &sum
		}
	case "progress":
		if p, ok := decodeLine(run, line, func(p *Progress) float64 { return p.Elapsed }); ok {
			run.Progress = append(run.Progress, p)
		}
	default:
		if ev, ok := decodeLine(run, line, func(ev *heuristics.Event) float64 { return ev.Elapsed }); ok {
			run.Events = append(run.Events, ev)
		}
	}
}

// decodeLine decodes one JSON line into a T whose elapsed_s, as elapsed
// reads it, must be a time: finite and not negative. A line that fails is
// counted as bad.
func decodeLine[T any](run *Run, line []byte, elapsed func(*T) float64) (T, bool) {
	var v T
	if err := json.Unmarshal(line, &v); err != nil {
		run.bad(line, err)
		return v, false
	}
	if e := elapsed(&v); !finite(e) || e < 0 {
		run.bad(line, fmt.Errorf("elapsed_s %v", e))
		return v, false
	}
	return v, true
}

// trainerLine is the part of an example trainer's --json step line the
// report uses. Lines of other kinds (fashion-mnist's "epoch" and "final")
// have a kind other than "step".
type trainerLine struct {
	Kind    string   `json:"kind"`
	Step    *int64   `json:"step"`
	Loss    *float64 `json:"loss"`
	StepMS  float64  `json:"step_ms"`
	Size    int      `json:"size"`
	Global  int      `json:"global"`
	Samples int      `json:"samples"` // this worker's samples (fashion-mnist)
}

// parseWorkerLine reads "[i] {...}": a worker's stdout line as gorovod run
// relays it.
func (run *Run) parseWorkerLine(line []byte, steps map[int64]*stepAcc) {
	end := bytes.IndexByte(line, ']')
	if end < 2 {
		run.Skipped++
		return
	}
	if _, err := strconv.Atoi(string(line[1:end])); err != nil {
		run.Skipped++
		return
	}
	rest := bytes.TrimSpace(line[end+1:])
	if len(rest) == 0 || rest[0] != '{' {
		run.Skipped++ // a trainer's plain text
		return
	}
	var tl trainerLine
	if err := json.Unmarshal(rest, &tl); err != nil {
		run.bad(line, err)
		return
	}
	if tl.Step == nil || (tl.Kind != "" && tl.Kind != "step") || *tl.Step < 0 {
		run.Skipped++
		return
	}
	acc := steps[*tl.Step]
	if acc == nil {
		if len(steps) >= maxSteps {
			run.Skipped++
			return
		}
		acc = &stepAcc{}
		steps[*tl.Step] = acc
	}
	acc.lines++
	if tl.Loss != nil && finite(*tl.Loss) {
		acc.loss += *tl.Loss
		acc.nLoss++
	}
	if tl.StepMS > 0 && finite(tl.StepMS) {
		acc.ms = append(acc.ms, tl.StepMS)
	}
	acc.workers = max(acc.workers, tl.Size)
	switch {
	case tl.Global > 0:
		acc.global = max(acc.global, tl.Global)
	case tl.Samples > 0:
		acc.global += tl.Samples // per worker: add up the world's
	}
}

// maxSteps bounds the steps Read keeps from trainer lines (a run of ten
// million steps would not fit a plot anyway).
const maxSteps = 1 << 20

func finishSteps(steps map[int64]*stepAcc) []TrainerStep {
	out := make([]TrainerStep, 0, len(steps))
	for step, a := range steps {
		ts := TrainerStep{Step: step, Loss: math.NaN(), Workers: a.workers, Global: a.global, Lines: a.lines}
		if a.nLoss > 0 {
			ts.Loss = a.loss / float64(a.nLoss)
		}
		if len(a.ms) > 0 {
			sort.Float64s(a.ms)
			ts.StepMS = a.ms[len(a.ms)/2]
		}
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b TrainerStep) int { return cmp.Compare(a.Step, b.Step) })
	return out
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
