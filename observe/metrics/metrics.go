package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/heuristics"
)

// Failure kinds, the "kind" label of gorovod_failures_total.
const (
	// FailureWorkerLost: a worker process ended by a signal or vanished
	// (kill -9, a crashed host): what an elastic job survives.
	FailureWorkerLost = "worker_lost"
	// FailureWorkerExited: a worker exited with an error of its own.
	FailureWorkerExited = "worker_exited"
	// FailureWorkerFailed: gossip declared a worker dead (frozen or
	// partitioned) while its process may still run.
	FailureWorkerFailed = "worker_failed"
	// FailureCollective: a collective failed and its world was rebuilt.
	FailureCollective = "collective"
	// FailureDecision: the autoscaling engine could not carry out a decision.
	FailureDecision = "decision"
	// FailureHeuristic: the autoscaling policy itself failed.
	FailureHeuristic = "heuristic"
)

// Job is the metrics of one elastic job, as its driver sees them.
type Job struct {
	reg *prometheus.Registry

	mu       sync.Mutex // orders the monotone updates of step and epoch
	lastStep int64
	epoch    uint64
	lossOnce sync.Once

	step          prometheus.Gauge
	totalSteps    prometheus.Gauge
	workerSteps   prometheus.Counter
	samples       prometheus.Counter
	stepTime      prometheus.Histogram
	computeTime   prometheus.Histogram
	throughput    *prometheus.GaugeVec
	worldSize     prometheus.Gauge
	worldEpoch    prometheus.Gauge
	worldChanges  prometheus.Counter
	worldChangeS  prometheus.Histogram
	failures      *prometheus.CounterVec
	decisions     *prometheus.CounterVec
	decisionEnds  *prometheus.CounterVec
	stragglers    prometheus.Counter
	bytesReduced  *prometheus.CounterVec
	collectiveOps *prometheus.CounterVec
	loss          prometheus.Gauge
	stalls        prometheus.Counter
}

// Bucket layouts: steps from a millisecond to a minute, world changes from
// 10 ms to 2 minutes (a new worker loading its data and model).
var (
	stepBuckets        = prometheus.ExponentialBucketsRange(0.001, 60, 17)
	worldChangeBuckets = prometheus.ExponentialBucketsRange(0.01, 120, 15)
)

// NewJob returns a job's metrics in a registry of their own, with the Go
// runtime's and the process's standard collectors beside them.
func NewJob() *Job {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	j := &Job{
		reg: reg,
		step: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_step",
			Help: "The newest step a worker has committed."}),
		totalSteps: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_total_steps",
			Help: "The job's planned length in steps (0: unknown)."}),
		workerSteps: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorovod_worker_steps_total",
			Help: "Steps committed, counted once per worker that committed them."}),
		samples: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorovod_samples_total",
			Help: "Training samples processed, all workers together (0 when trainers do not report samples)."}),
		stepTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorovod_step_seconds",
			Help: "Step time per worker-step, from the end of the previous step to the end of this one.", Buckets: stepBuckets}),
		computeTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorovod_compute_seconds",
			Help: "The part of each worker-step not spent waiting for the other workers.", Buckets: stepBuckets}),
		throughput: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorovod_throughput",
			Help: "Throughput of the current world, all workers together, as the autoscaling engine measures it (median batch over median step time)."},
			[]string{"unit"}),
		worldSize: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_world_size",
			Help: "Workers in the current world."}),
		worldEpoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_world_epoch",
			Help: "The current world epoch."}),
		worldChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorovod_world_changes_total",
			Help: "World epochs formed after the first (joins, leaves, failures)."}),
		worldChangeS: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorovod_world_change_seconds",
			Help: "How long moving to a new world took, once per worker and world: connecting its ring and receiving the state.", Buckets: worldChangeBuckets}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_failures_total",
			Help: "Failures by kind: worker_lost, worker_exited, worker_failed, collective, decision, heuristic."}, []string{"kind"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_autoscaling_decisions_total",
			Help: "Decisions the autoscaling engine acted on, by action (grow, shrink, replace)."}, []string{"action"}),
		decisionEnds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_autoscaling_outcomes_total",
			Help: "Outcomes of the engine's decisions: done, failed; settled when the policy found its target."}, []string{"outcome"}),
		stragglers: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorovod_stragglers_total",
			Help: "Straggler reports of the engine (found, replaced or not)."}),
		bytesReduced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_collective_bytes_total",
			Help: "Bytes in the buffers of the workers' collectives, by collective."}, []string{"collective"}),
		collectiveOps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_collectives_total",
			Help: "Collectives the workers ran, by collective."}, []string{"collective"}),
		loss: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_loss",
			Help: "The training loss the workers reported last (mean per sample over a report's steps; absent until one does)."}),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorovod_stalls_total",
			Help: "Stalls found: ranks that waited in a collective past the stall check time for ranks that had not entered it."}),
	}
	reg.MustRegister(j.step, j.totalSteps, j.workerSteps, j.samples, j.stepTime, j.computeTime, j.throughput,
		j.worldSize, j.worldEpoch, j.worldChanges, j.worldChangeS, j.failures, j.decisions, j.decisionEnds,
		j.stragglers, j.bytesReduced, j.collectiveOps, j.stalls)
	for _, k := range []string{FailureWorkerLost, FailureWorkerExited, FailureWorkerFailed, FailureCollective, FailureDecision, FailureHeuristic} {
		j.failures.WithLabelValues(k) // every kind shows, at 0
	}
	return j
}

// Registry is where the job's metrics live; Serve it, or gather it.
func (j *Job) Registry() *prometheus.Registry { return j.reg }

// ObserveSteps records workers' step reports (the driver's OnStats batches,
// converted as for the engine).
//
// Besides the steps it counts the gradient bytes the workers allreduced
// (gorovod_collective_bytes_total{collective="allreduce"}), the time each
// took to move to a new world (gorovod_world_change_seconds, from a world's
// first step) and sets gorovod_loss to the reports' mean loss when they
// carry one.
func (j *Job) ObserveSteps(reps []heuristics.StepReport) {
	var bytes int64
	var lossSum, lossN float64
	for _, r := range reps {
		j.workerSteps.Inc()
		j.samples.Add(float64(r.Samples))
		j.stepTime.Observe(r.StepTime.Seconds())
		j.computeTime.Observe(r.Compute.Seconds())
		j.raiseStep(r.Step)
		if r.TotalSteps > 0 {
			j.totalSteps.Set(float64(r.TotalSteps))
		}
		if r.Switch > 0 {
			j.worldChangeS.Observe(r.Switch.Seconds())
		}
		bytes += r.Bytes
		if r.HasLoss {
			lossSum, lossN = lossSum+r.Loss, lossN+1
		}
	}
	if bytes > 0 {
		j.bytesReduced.WithLabelValues("allreduce").Add(float64(bytes))
	}
	if lossN > 0 {
		j.lossOnce.Do(func() { j.reg.MustRegister(j.loss) }) // absent until a trainer reports a loss
		j.loss.Set(lossSum / lossN)
	}
}

// Stall counts a stall the driver found (job.Stalled).
func (j *Job) Stall() { j.stalls.Inc() }

// raiseStep moves gorovod_step forward (reports of workers arrive out of order).
func (j *Job) raiseStep(step int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if step > j.lastStep {
		j.lastStep = step
		j.step.Set(float64(step))
	}
}

// World records a new world: its epoch and size. took, when known (> 0), is
// how long the move to it took (ObserveSteps records the workers' own
// account of it); every world after the first counts as a change.
func (j *Job) World(epoch uint64, size int, took time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if epoch <= j.epoch {
		return // an old world, reported late
	}
	if j.epoch > 0 {
		j.worldChanges.Inc()
	}
	j.epoch = epoch
	j.worldEpoch.Set(float64(epoch))
	j.worldSize.Set(float64(size))
	if took > 0 {
		j.worldChangeS.Observe(took.Seconds())
	}
}

// Throughput records the current world's measured throughput in unit
// ("samples/s" or "steps/s", heuristics.Measurement.Unit).
func (j *Job) Throughput(v float64, unit string) {
	j.throughput.Reset()
	j.throughput.WithLabelValues(unit).Set(v)
}

// Failure counts a failure of one of the Failure* kinds.
func (j *Job) Failure(kind string) { j.failures.WithLabelValues(kind).Inc() }

// Event records an autoscaling engine event (EngineConfig.OnEvent):
// decisions by action, their outcomes, stragglers, and the engine's own
// failures.
func (j *Job) Event(ev heuristics.Event) {
	switch ev.Kind {
	case heuristics.EventDecision:
		if ev.Decision != nil {
			j.decisions.WithLabelValues(ev.Decision.Action.String()).Inc()
		}
	case heuristics.EventDone, heuristics.EventSettled:
		j.decisionEnds.WithLabelValues(ev.Kind).Inc()
	case heuristics.EventFailed:
		j.decisionEnds.WithLabelValues(ev.Kind).Inc()
		j.Failure(FailureDecision)
	case heuristics.EventStraggler:
		j.stragglers.Inc()
	case heuristics.EventError:
		j.Failure(FailureHeuristic)
	}
}

// Status records a snapshot of the engine (heuristics.Engine.Status), for a
// caller that polls it: throughput, world size and epoch, steps.
func (j *Job) Status(s heuristics.Status) {
	unit := "steps/s"
	if s.Samples {
		unit = "samples/s"
	}
	if s.Throughput > 0 {
		j.Throughput(s.Throughput, unit)
	}
	if s.TotalSteps > 0 {
		j.totalSteps.Set(float64(s.TotalSteps))
	}
	j.raiseStep(s.Step)
}

// Collectives records collectives workers reported having run since their
// last report (a worker's Worker.Totals, relayed to the driver): count and
// bytes of one kind.
func (j *Job) Collectives(collective string, ops, bytes int64) {
	j.collectiveOps.WithLabelValues(collective).Add(float64(ops))
	j.bytesReduced.WithLabelValues(collective).Add(float64(bytes))
}

// Worker is one worker process's metrics: its collectives.
type Worker struct {
	reg     *prometheus.Registry
	ops     *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	failed  *prometheus.CounterVec

	mu    sync.Mutex
	kinds map[[2]string]*collectiveMetrics // by collective and algorithm
}

// collectiveMetrics are the series of one collective and algorithm, looked
// up once: a tracer call then costs no label hashing.
type collectiveMetrics struct {
	ops, bytes, failed prometheus.Counter
	seconds            prometheus.Observer
	totalOps           int64
	totalBytes         int64
}

// NewWorker returns a worker's metrics in a registry of their own, with the
// Go runtime's and the process's standard collectors.
func NewWorker() *Worker {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w := &Worker{
		reg: reg,
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_collectives_total",
			Help: "Collectives this worker ran, by collective."}, []string{"collective"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_collective_bytes_total",
			Help: "Bytes in the buffers of this worker's collectives, by collective."}, []string{"collective"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorovod_collective_seconds",
			Help:    "Time per collective on this worker, by collective and algorithm.",
			Buckets: prometheus.ExponentialBucketsRange(1e-5, 60, 20)}, []string{"collective", "algorithm"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_collective_failures_total",
			Help: "Collectives that failed on this worker, by collective."}, []string{"collective"}),
		kinds: map[[2]string]*collectiveMetrics{},
	}
	reg.MustRegister(w.ops, w.bytes, w.seconds, w.failed)
	return w
}

// Registry is where the worker's metrics live.
func (w *Worker) Registry() *prometheus.Registry { return w.reg }

func (w *Worker) series(op *collective.OpInfo) *collectiveMetrics {
	key := [2]string{op.Collective, op.Algorithm}
	m := w.kinds[key]
	if m == nil {
		m = &collectiveMetrics{
			ops:     w.ops.WithLabelValues(op.Collective),
			bytes:   w.bytes.WithLabelValues(op.Collective),
			failed:  w.failed.WithLabelValues(op.Collective),
			seconds: w.seconds.WithLabelValues(op.Collective, op.Algorithm),
		}
		w.kinds[key] = m
	}
	return m
}

// Totals returns how many collectives of each kind this worker ran and
// their bytes, for relaying to the driver (Job.Collectives).
func (w *Worker) Totals() map[string][2]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string][2]int64{}
	for key, m := range w.kinds {
		t := out[key[0]]
		out[key[0]] = [2]int64{t[0] + m.totalOps, t[1] + m.totalBytes}
	}
	return out
}

// CollectiveTracer returns a collective.Tracer that counts this worker's
// collectives; collective.Tracers combines it with a timeline's.
func (w *Worker) CollectiveTracer() collective.Tracer { return workerTracer{w} }

type workerTracer struct{ w *Worker }

func (workerTracer) CollectiveStart(collective.OpInfo, time.Time)            {}
func (workerTracer) CollectivePhase(collective.OpInfo, collective.PhaseInfo) {}
func (t workerTracer) CollectiveEnd(op collective.OpInfo, start, end time.Time, err error) {
	t.w.mu.Lock()
	m := t.w.series(&op)
	if err == nil {
		m.totalOps++
		m.totalBytes += op.Bytes
	}
	t.w.mu.Unlock()
	if err != nil {
		m.failed.Inc()
		return
	}
	m.ops.Inc()
	m.bytes.Add(float64(op.Bytes))
	m.seconds.Observe(end.Sub(start).Seconds())
}
