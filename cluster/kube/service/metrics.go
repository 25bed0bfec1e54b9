package service

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorovod/gorovod/cluster/kube/api"
)

// Metrics are the scheduler service's measurements in Prometheus's format
// (`gorovod scheduler --metrics-addr`): whether this replica leads, its
// rounds (how many, how they ended, how long they took), the jobs by phase
// and the cluster's slots, allocated or not, as the last round left them.
// Every metric is named gorovod_scheduler_*; no label names a job or a node,
// so the series count does not grow with the cluster's history.
type Metrics struct {
	leader    prometheus.Gauge
	rounds    *prometheus.CounterVec
	roundTime prometheus.Histogram
	jobs      *prometheus.GaugeVec
	slots     prometheus.Gauge
	allocated prometheus.Gauge
}

// phases are the values of the jobs gauge's phase label, each always
// reported (0 when no job is in it).
var phases = []api.Phase{api.PhasePending, api.PhaseRunning, api.PhaseSucceeded, api.PhaseFailed}

// NewMetrics makes the service's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_scheduler_leader",
			Help: "1 while this replica runs the scheduling rounds (leads, or runs without leader election), else 0."}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorovod_scheduler_rounds_total",
			Help: "Scheduling rounds this replica ran, by result (ok, error)."}, []string{"result"}),
		roundTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorovod_scheduler_round_seconds",
			Help:    "Time a scheduling round took: reading the jobs and nodes, the policy, the status writes.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		jobs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorovod_scheduler_jobs",
			Help: "GorovodJobs by phase, as the last round left them."}, []string{"phase"}),
		slots: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_scheduler_slots",
			Help: "Worker slots of the Ready, schedulable nodes at the last round."}),
		allocated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorovod_scheduler_slots_allocated",
			Help: "Worker slots allocated to jobs at the last round."}),
	}
	for _, c := range []prometheus.Collector{m.leader, m.rounds, m.roundTime, m.jobs, m.slots, m.allocated} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"ok", "error"} {
		m.rounds.WithLabelValues(r)
	}
	for _, p := range phases {
		m.jobs.WithLabelValues(string(p))
	}
	return m, nil
}

// leading records whether this replica runs the rounds.
func (m *Metrics) leading(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.leader.Set(v)
}

// round records a round that took d and ended with err.
func (m *Metrics) round(d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.rounds.WithLabelValues(result).Inc()
	m.roundTime.Observe(d.Seconds())
}

// state records the jobs by phase and the slots after a round.
func (m *Metrics) state(byPhase map[api.Phase]int, slots, allocated int) {
	if m == nil {
		return
	}
	for _, p := range phases {
		m.jobs.WithLabelValues(string(p)).Set(float64(byPhase[p]))
	}
	m.slots.Set(float64(slots))
	m.allocated.Set(float64(allocated))
}
