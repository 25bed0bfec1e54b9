package simulator

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ModelConfig is what the simulator needs to know about a model beyond its
// traces. Its JSON form is an application's model.json (LoadModels).
type ModelConfig struct {
	// MaxEpochs is the training length: a job completes when it has made the
	// progress its traces record after this many epochs.
	MaxEpochs int `json:"max_epochs"`
	// MaxLocalBatch caps the batch one GPU processes per step (memory); 0
	// means the largest one the placement traces measured.
	MaxLocalBatch int `json:"max_local_bsz"`
	// FixedBatch, when set, is the batch size Pollux keeps for this model
	// instead of adapting it.
	FixedBatch int `json:"fixed_batch"`
	// MaxReplicas, when set, caps the replicas Pollux and Optimus give a
	// job of this model.
	MaxReplicas int `json:"max_replicas"`
}

// DefaultModels are the six models of Pollux's simulator study as the original
// simulator configures them (Apache-2.0, see docs/scheduler.md): training
// lengths, YOLOv3's memory limit, and NCF run on one GPU at its largest batch
// size.
func DefaultModels() map[string]ModelConfig {
	return map[string]ModelConfig{
		"bert":        {MaxEpochs: 2},
		"cifar10":     {MaxEpochs: 100},
		"ncf":         {MaxEpochs: 10, FixedBatch: 32768, MaxReplicas: 1},
		"imagenet":    {MaxEpochs: 90},
		"deepspeech2": {MaxEpochs: 80},
		"yolov3":      {MaxEpochs: 50, MaxLocalBatch: 8},
	}
}

// validationRun is one model trained to the end at one fixed batch size: per
// epoch, the progress made (in steps at the initial batch size, scaled by
// statistical efficiency), the iterations run, and the gradient statistics.
type validationRun struct {
	batch     int
	progress  []float64
	iteration []float64
	gradSqr   []float64
	gradVar   []float64
}

// Trace is one model's measurements: step times by placement and local batch
// size, and training progress and gradient statistics by batch size. It is
// read-only once loaded and safe for concurrent use.
type Trace struct {
	Name string
	// InitBatchSize and MaxBatchSize are the smallest and largest global
	// batch sizes the model was validated at.
	InitBatchSize, MaxBatchSize int
	// MinLocalBatch and MaxLocalBatch bound the batch one GPU processes.
	MinLocalBatch, MaxLocalBatch int
	// MaxEpochs is the model's training length (ModelConfig.MaxEpochs, or
	// ValidatedEpochs when that is unset); ValidatedEpochs is how many
	// epochs every validation run records, the longest a job can train.
	MaxEpochs, ValidatedEpochs int

	runs       []validationRun  // by increasing batch size
	placements map[string]curve // keyed by normalized placement
	scatter    interpolator     // everything else
	progress   []float64        // progress[e]: needed to finish epoch e, for every validated epoch
}

// placementKey is how the traces name a placement: the GPU count on each
// node, as digits, rotated to the lexicographically smallest rotation (a ring
// looks the same from any node). ok is false when a count does not fit one
// digit, which no trace measures.
func placementKey(placement []int) (key string, ok bool) {
	var digits []byte
	for _, g := range placement {
		if g == 0 {
			continue
		}
		if g < 0 || g > 9 {
			return "", false
		}
		digits = append(digits, byte('0'+g))
	}
	best := string(digits)
	for i := 1; i < len(digits); i++ {
		if r := string(digits[i:]) + string(digits[:i]); r < best {
			best = r
		}
	}
	return best, true
}

// StepTime returns the step time and the synchronization part of it, in
// seconds, for a job with the given GPUs per node (zeros are skipped) and
// local batch size: from the placement's own measurements when they cover
// the batch size, otherwise interpolated over (nodes, replicas, local batch)
// across all measurements, with more than 16 nodes treated as 16.
func (t *Trace) StepTime(placement []int, localBatch float64) (step, sync float64, err error) {
	nodes, replicas := 0, 0
	for _, g := range placement {
		if g > 0 {
			nodes++
			replicas += g
		}
	}
	if replicas == 0 {
		return 0, 0, errors.New("empty placement")
	}
	if key, ok := placementKey(placement); ok {
		if c, ok := t.placements[key]; ok {
			if at, ok := c.eval(localBatch); ok {
				return at.step, at.sync, nil
			}
		}
	}
	at, err := t.scatter.eval(min(nodes, 16), replicas, localBatch)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", t.Name, err)
	}
	return at.step, at.sync, nil
}

// bracket finds the validated batch sizes around batch and the weight of the
// upper one.
func (t *Trace) bracket(batch float64) (lo, hi *validationRun, w float64, err error) {
	i := sort.Search(len(t.runs), func(i int) bool { return float64(t.runs[i].batch) >= batch })
	if i == len(t.runs) || (float64(t.runs[i].batch) > batch && i == 0) {
		return nil, nil, 0, fmt.Errorf("%s: batch size %g outside the validated range [%d, %d]",
			t.Name, batch, t.InitBatchSize, t.MaxBatchSize)
	}
	if float64(t.runs[i].batch) == batch {
		return &t.runs[i], &t.runs[i], 0, nil
	}
	lo, hi = &t.runs[i-1], &t.runs[i]
	return lo, hi, (batch - float64(lo.batch)) / float64(hi.batch-lo.batch), nil
}

// GradStats returns the squared norm of the true gradient and the variance of
// its estimate during an epoch at a batch size, interpolated linearly between
// the validated batch sizes around it.
func (t *Trace) GradStats(batch float64, epoch int) (sqr, variance float64, err error) {
	if epoch < 0 || epoch >= t.ValidatedEpochs {
		return 0, 0, fmt.Errorf("%s: epoch %d outside [0, %d)", t.Name, epoch, t.ValidatedEpochs)
	}
	lo, hi, w, err := t.bracket(batch)
	if err != nil {
		return 0, 0, err
	}
	return (1-w)*lo.gradSqr[epoch] + w*hi.gradSqr[epoch], (1-w)*lo.gradVar[epoch] + w*hi.gradVar[epoch], nil
}

// Iterations returns how many steps training at a batch size has taken by the
// end of an epoch (interpolated between validated batch sizes).
func (t *Trace) Iterations(batch float64, epoch int) (float64, error) {
	if epoch < 0 || epoch >= t.ValidatedEpochs {
		return 0, fmt.Errorf("%s: epoch %d outside [0, %d)", t.Name, epoch, t.ValidatedEpochs)
	}
	lo, hi, w, err := t.bracket(batch)
	if err != nil {
		return 0, err
	}
	return (1-w)*lo.iteration[epoch] + w*hi.iteration[epoch], nil
}

// Progress is the progress a job must have made to have finished epochs
// epochs (the least over the validated batch sizes; epochs beyond
// ValidatedEpochs count as ValidatedEpochs); Progress(MaxEpochs) completes a
// job of the model's length.
func (t *Trace) Progress(epochs int) float64 {
	if epochs <= 0 {
		return 0
	}
	return t.progress[min(epochs, len(t.progress))-1]
}

// LoadTraces reads the traces of the given models from dir/<model>/:
// placements.csv, scalability.csv and validation-<batch size>.csv.
func LoadTraces(dir string, models map[string]ModelConfig) (map[string]*Trace, error) {
	names := make([]string, 0, len(models))
	for name := range models {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make(map[string]*Trace, len(models))
	for _, name := range names {
		t, err := LoadTrace(filepath.Join(dir, name), name, models[name])
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

var validationName = regexp.MustCompile(`^validation-([0-9]+)\.csv$`)

// LoadTrace reads one model's traces from dir.
func LoadTrace(dir, name string, cfg ModelConfig) (*Trace, error) {
	open := func(file string) (io.ReadCloser, error) {
		f, err := os.Open(filepath.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", name, err)
		}
		return f, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	in := TraceFiles{Validation: map[int]io.Reader{}}
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for _, e := range entries {
		m := validationName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		batch, err := strconv.Atoi(m[1])
		if err != nil || batch <= 0 {
			return nil, fmt.Errorf("trace %s: bad batch size in %s", name, e.Name())
		}
		f, err := open(e.Name())
		if err != nil {
			return nil, err
		}
		closers = append(closers, f)
		in.Validation[batch] = f
	}
	for _, p := range []struct {
		file string
		dst  *io.Reader
	}{{"placements.csv", &in.Placements}, {"scalability.csv", &in.Scalability}} {
		f, err := open(p.file)
		if err != nil {
			return nil, err
		}
		closers = append(closers, f)
		*p.dst = f
	}
	return ParseTrace(name, cfg, in)
}

// TraceFiles are the contents of one model's trace files.
type TraceFiles struct {
	Placements  io.Reader // placement,local_bsz,step_time,sync_time
	Scalability io.Reader // num_nodes,num_replicas,local_bsz,step_time,sync_time
	// Validation is keyed by batch size:
	// progress,iteration,metric,grad_sqr,grad_var, one row per epoch.
	Validation map[int]io.Reader
}

// table is a parsed CSV file with a header: its numeric columns by name.
type table struct {
	file string
	cols map[string][]float64
	rows int
	raw  map[string][]string
}

// readTable parses a CSV file whose first row names its columns and checks
// that every wanted column is present and numeric (finite); keepRaw columns
// are also kept as text.
func readTable(file string, r io.Reader, want []string, keepRaw ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading the header: %w", file, err)
	}
	index := map[string]int{}
	for i, h := range header {
		index[strings.TrimSpace(h)] = i
	}
	t := &table{file: file, cols: map[string][]float64{}, raw: map[string][]string{}}
	for _, w := range want {
		if _, ok := index[w]; !ok {
			return nil, fmt.Errorf("%s: no column %q (have %q)", file, w, header)
		}
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		t.rows++
		line, _ := cr.FieldPos(0)
		for _, w := range want {
			s := strings.TrimSpace(rec[index[w]])
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%s line %d: column %s: %q is not a finite number", file, line, w, s)
			}
			t.cols[w] = append(t.cols[w], v)
		}
		for _, k := range keepRaw {
			t.raw[k] = append(t.raw[k], strings.TrimSpace(rec[index[k]]))
		}
	}
	if t.rows == 0 {
		return nil, fmt.Errorf("%s: no rows", file)
	}
	return t, nil
}

// ParseTrace builds a model's trace from the contents of its files.
func ParseTrace(name string, cfg ModelConfig, in TraceFiles) (*Trace, error) {
	if in.Placements == nil || in.Scalability == nil {
		return nil, fmt.Errorf("trace %s: placements and scalability traces are required", name)
	}
	if len(in.Validation) == 0 {
		return nil, fmt.Errorf("trace %s: no validation-<batch size>.csv traces", name)
	}
	t := &Trace{Name: name, placements: map[string]curve{}}

	// Placements: one curve per traced placement, and means per
	// (nodes, replicas, local batch) for the scattered interpolation.
	pl, err := readTable(name+"/placements.csv", in.Placements,
		[]string{"local_bsz", "step_time", "sync_time"}, "placement")
	if err != nil {
		return nil, err
	}
	type group struct {
		bsz []float64
		at  []timing
	}
	byKey := map[string]*group{}
	byNR := map[point2]*group{}
	addTo := func(m map[point2]*group, k point2, b float64, at timing) {
		g := m[k]
		if g == nil {
			g = &group{}
			m[k] = g
		}
		g.bsz, g.at = append(g.bsz, b), append(g.at, at)
	}
	minLocal, maxLocal := math.Inf(1), math.Inf(-1)
	for i := 0; i < pl.rows; i++ {
		p := pl.raw["placement"][i]
		counts := make([]int, 0, len(p))
		replicas := 0
		for _, c := range p {
			if c < '1' || c > '9' {
				return nil, fmt.Errorf("%s row %d: placement %q is not a string of GPU counts 1-9", pl.file, i+1, p)
			}
			counts = append(counts, int(c-'0'))
			replicas += int(c - '0')
		}
		if len(counts) == 0 || len(counts) > 16 {
			return nil, fmt.Errorf("%s row %d: placement %q must name 1 to 16 nodes", pl.file, i+1, p)
		}
		b := pl.cols["local_bsz"][i]
		at := timing{pl.cols["step_time"][i], pl.cols["sync_time"][i]}
		if err := checkTiming(pl.file, i+1, b, at); err != nil {
			return nil, err
		}
		minLocal, maxLocal = min(minLocal, b), max(maxLocal, b)
		key, _ := placementKey(counts)
		g := byKey[key]
		if g == nil {
			g = &group{}
			byKey[key] = g
		}
		g.bsz, g.at = append(g.bsz, b), append(g.at, at)
		addTo(byNR, point2{int64(len(counts)), int64(replicas)}, b, at)
	}
	for key, g := range byKey {
		t.placements[key] = newCurve(g.bsz, g.at)
	}
	// The scattered interpolation averages the placements of each
	// (nodes, replicas, local batch) first, then adds the scalability
	// measurements (many nodes) as they are.
	scattered := map[point2]*group{}
	for k, g := range byNR {
		c := newCurve(g.bsz, g.at)
		scattered[k] = &group{bsz: c.bsz, at: c.at}
	}
	sc, err := readTable(name+"/scalability.csv", in.Scalability,
		[]string{"num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"})
	if err != nil {
		return nil, err
	}
	for i := 0; i < sc.rows; i++ {
		n, r := sc.cols["num_nodes"][i], sc.cols["num_replicas"][i]
		if n != math.Trunc(n) || r != math.Trunc(r) || n < 1 || n > 64 || r < n || r > 255 {
			return nil, fmt.Errorf("%s row %d: %g nodes × %g replicas is not a valid configuration", sc.file, i+1, n, r)
		}
		b := sc.cols["local_bsz"][i]
		at := timing{sc.cols["step_time"][i], sc.cols["sync_time"][i]}
		if err := checkTiming(sc.file, i+1, b, at); err != nil {
			return nil, err
		}
		addTo(scattered, point2{int64(n), int64(r)}, b, at)
	}
	keys := make([]point2, 0, len(scattered))
	for k := range scattered {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b point2) int {
		if a.x != b.x {
			return int(a.x - b.x)
		}
		return int(a.y - b.y)
	})
	groups := make([]curve, len(keys))
	for i, k := range keys {
		groups[i] = newCurve(scattered[k].bsz, scattered[k].at)
	}
	if t.scatter, err = newScatter(keys, groups); err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}

	// Validation runs.
	batches := make([]int, 0, len(in.Validation))
	for b := range in.Validation {
		batches = append(batches, b)
	}
	sort.Ints(batches)
	for _, b := range batches {
		if b <= 0 {
			return nil, fmt.Errorf("trace %s: validation batch size %d must be positive", name, b)
		}
		file := fmt.Sprintf("%s/validation-%d.csv", name, b)
		v, err := readTable(file, in.Validation[b],
			[]string{"progress", "iteration", "grad_sqr", "grad_var"})
		if err != nil {
			return nil, err
		}
		t.runs = append(t.runs, validationRun{batch: b,
			progress: v.cols["progress"], iteration: v.cols["iteration"],
			gradSqr: v.cols["grad_sqr"], gradVar: v.cols["grad_var"]})
	}
	t.InitBatchSize, t.MaxBatchSize = batches[0], batches[len(batches)-1]
	t.MinLocalBatch, t.MaxLocalBatch = int(minLocal), int(maxLocal)
	if cfg.MaxLocalBatch > 0 {
		t.MaxLocalBatch = cfg.MaxLocalBatch
	}
	if t.MaxBatchSize < t.MinLocalBatch {
		return nil, fmt.Errorf("trace %s: largest batch size %d is below the smallest local batch %d", name, t.MaxBatchSize, t.MinLocalBatch)
	}
	rows := len(t.runs[0].progress)
	for _, r := range t.runs {
		rows = min(rows, len(r.progress))
	}
	t.MaxEpochs, t.ValidatedEpochs = rows, rows
	if cfg.MaxEpochs > 0 {
		if cfg.MaxEpochs > rows {
			return nil, fmt.Errorf("trace %s: %d epochs wanted but a validation trace has only %d rows", name, cfg.MaxEpochs, rows)
		}
		t.MaxEpochs = cfg.MaxEpochs
	}
	// Every validated epoch, not only the model's, since a workload's job
	// may train longer than its model (WorkloadJob.Epochs).
	t.progress = make([]float64, rows)
	for e := range t.progress {
		t.progress[e] = math.Inf(1)
		for _, r := range t.runs {
			t.progress[e] = min(t.progress[e], r.progress[e])
		}
		if e > 0 && t.progress[e] <= t.progress[e-1] {
			return nil, fmt.Errorf("trace %s: progress does not increase at epoch %d", name, e)
		}
	}
	if t.progress[0] <= 0 {
		return nil, fmt.Errorf("trace %s: progress of the first epoch must be positive", name)
	}
	return t, nil
}

func checkTiming(file string, row int, bsz float64, at timing) error {
	if bsz < 1 || bsz != math.Trunc(bsz) {
		return fmt.Errorf("%s row %d: local batch size %g is not a positive integer", file, row, bsz)
	}
	if at.step <= 0 || at.sync < 0 || at.sync >= at.step {
		return fmt.Errorf("%s row %d: step time %g and sync time %g must satisfy 0 ≤ sync < step", file, row, at.step, at.sync)
	}
	return nil
}
