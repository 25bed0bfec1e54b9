package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/heuristics"
)

// scrape GETs addr's /metrics as Prometheus would and parses the text
// exposition format strictly.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %s: %s", resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return fams
}

// value finds the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || (l.GetName() == want[i] && l.GetValue() == want[i+1])
			}
			if !found {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s sample with labels %v", name, want)
	return nil
}

func serve(t *testing.T, ctx context.Context, g interface {
	Gather() ([]*dto.MetricFamily, error)
}) *Server {
	t.Helper()
	s, err := Serve(ctx, g, ServerConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func TestJobMetricsScraped(t *testing.T) {
	j := NewJob()
	s := serve(t, context.Background(), j.Registry())
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":0") {
		t.Fatalf("Addr %q", s.Addr())
	}

	j.World(1, 2, 0)
	if fams := scrape(t, s.Addr()); fams["gorovod_loss"] != nil {
		t.Error("gorovod_loss is served before any trainer reported a loss")
	}
	var reps []heuristics.StepReport
	for step := int64(1); step <= 10; step++ {
		for _, w := range []string{"a", "b"} {
			reps = append(reps, heuristics.StepReport{Worker: w, Epoch: 1, Step: step, Samples: 32,
				StepTime: 50 * time.Millisecond, Compute: 30 * time.Millisecond, TotalSteps: 400})
		}
	}
	j.ObserveSteps(reps)
	j.ObserveSteps([]heuristics.StepReport{{Worker: "a", Epoch: 1, Step: 3, StepTime: time.Second}}) // late, old step
	// The first steps of a world carry the move to it; the gradients' bytes
	// and the loss come with every step that has them.
	j.ObserveSteps([]heuristics.StepReport{
		{Worker: "a", Epoch: 3, Step: 11, Bytes: 4096, Switch: 500 * time.Millisecond, Loss: 0.25, HasLoss: true},
		{Worker: "b", Epoch: 3, Step: 11, Bytes: 4096, Switch: 700 * time.Millisecond, Loss: 0.75, HasLoss: true},
		{Worker: "c", Epoch: 3, Step: 11, Bytes: 4096},
	})
	j.Stall()
	j.World(3, 3, 1500*time.Millisecond)
	j.World(2, 5, 0) // an older world reported late: ignored
	j.Event(heuristics.Event{Kind: heuristics.EventDecision, Decision: &heuristics.Decision{Action: heuristics.Grow, Count: 1}})
	j.Event(heuristics.Event{Kind: heuristics.EventDone})
	j.Event(heuristics.Event{Kind: heuristics.EventDecision, Decision: &heuristics.Decision{Action: heuristics.Replace, Worker: "b"}})
	j.Event(heuristics.Event{Kind: heuristics.EventFailed})
	j.Event(heuristics.Event{Kind: heuristics.EventStraggler})
	j.Event(heuristics.Event{Kind: heuristics.EventWorld}) // not counted here: World is
	j.Failure(FailureWorkerLost)
	j.Failure(FailureWorkerLost)
	j.Status(heuristics.Status{Step: 12, TotalSteps: 400, Throughput: 1234.5, Samples: true})
	j.Collectives("allreduce", 20, 20*4096)

	fams := scrape(t, s.Addr())
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gorovod_step", nil, 12},
		{"gorovod_total_steps", nil, 400},
		{"gorovod_worker_steps_total", nil, 24},
		{"gorovod_samples_total", nil, 640},
		{"gorovod_world_size", nil, 3},
		{"gorovod_world_epoch", nil, 3},
		{"gorovod_world_changes_total", nil, 1},
		{"gorovod_throughput", []string{"unit", "samples/s"}, 1234.5},
		{"gorovod_failures_total", []string{"kind", "worker_lost"}, 2},
		{"gorovod_failures_total", []string{"kind", "decision"}, 1},
		{"gorovod_failures_total", []string{"kind", "heuristic"}, 0},
		{"gorovod_autoscaling_decisions_total", []string{"action", "grow"}, 1},
		{"gorovod_autoscaling_decisions_total", []string{"action", "replace"}, 1},
		{"gorovod_autoscaling_outcomes_total", []string{"outcome", "done"}, 1},
		{"gorovod_autoscaling_outcomes_total", []string{"outcome", "failed"}, 1},
		{"gorovod_stragglers_total", nil, 1},
		{"gorovod_collectives_total", []string{"collective", "allreduce"}, 20},
		{"gorovod_collective_bytes_total", []string{"collective", "allreduce"}, 20*4096 + 3*4096},
		{"gorovod_loss", nil, 0.5},
		{"gorovod_stalls_total", nil, 1},
	}
	for _, c := range checks {
		m := value(t, fams, c.name, c.labels...)
		var got float64
		switch {
		case m.Counter != nil:
			got = m.Counter.GetValue()
		case m.Gauge != nil:
			got = m.Gauge.GetValue()
		}
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	st := value(t, fams, "gorovod_step_seconds").Histogram
	if st.GetSampleCount() != 24 || fmt.Sprintf("%.3f", st.GetSampleSum()) != "2.000" {
		t.Errorf("step histogram: %d samples, sum %v", st.GetSampleCount(), st.GetSampleSum())
	}
	ct := value(t, fams, "gorovod_compute_seconds").Histogram
	if ct.GetSampleCount() != 24 {
		t.Errorf("compute histogram: %d samples", ct.GetSampleCount())
	}
	wc := value(t, fams, "gorovod_world_change_seconds").Histogram
	if wc.GetSampleCount() != 3 || fmt.Sprintf("%.3f", wc.GetSampleSum()) != "2.700" {
		t.Errorf("world change histogram: %d samples, sum %v", wc.GetSampleCount(), wc.GetSampleSum())
	}
	if fams["go_goroutines"] == nil || fams["process_cpu_seconds_total"] == nil {
		t.Error("the Go and process collectors are missing")
	}
}

// TestWorkerMetricsFromCollectives runs real collectives with the worker's
// tracer and checks the scrape counts them.
func TestWorkerMetricsFromCollectives(t *testing.T) {
	const p = 2
	ws := []*Worker{NewWorker(), NewWorker()}
	w := transport.World{JobID: "metrics-test", Epoch: 1, Addrs: make([]string, p)}
	mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: 10 * time.Second}, p)
	comms := make([]*collective.Communicator, p)
	for r := range comms {
		w.Rank = r
		cfg := collective.DefaultConfig()
		cfg.Tracer = collective.Tracers(nil, ws[r].CollectiveTracer())
		c, err := collective.NewFromLinks(w, mesh[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = c
		t.Cleanup(func() { c.Close() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, p)
	for r, c := range comms {
		wg.Go(func() {
			buf := make([]float32, 1<<16)
			for range 5 {
				if errs[r] = collective.Allreduce(ctx, c, buf, buf, collective.Sum); errs[r] != nil {
					return
				}
			}
			errs[r] = c.Barrier(ctx)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s := serve(t, ctx, ws[1].Registry())
	fams := scrape(t, s.Addr())
	if v := value(t, fams, "gorovod_collectives_total", "collective", "allreduce").Counter.GetValue(); v != 5 {
		t.Errorf("allreduces %v", v)
	}
	if v := value(t, fams, "gorovod_collective_bytes_total", "collective", "allreduce").Counter.GetValue(); v != 5*4<<16 {
		t.Errorf("allreduce bytes %v", v)
	}
	if h := value(t, fams, "gorovod_collective_seconds", "collective", "allreduce", "algorithm", "ring").Histogram; h.GetSampleCount() != 5 || h.GetSampleSum() <= 0 {
		t.Errorf("allreduce time histogram %v", h)
	}
	if v := value(t, fams, "gorovod_collectives_total", "collective", "barrier").Counter.GetValue(); v != 1 {
		t.Errorf("barriers %v", v)
	}
	if tot := ws[1].Totals(); tot["allreduce"] != [2]int64{5, 5 * 4 << 16} || tot["barrier"] != [2]int64{1, 0} {
		t.Errorf("Totals %v", tot)
	}
}

func TestServerStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Serve(ctx, NewJob().Registry(), ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	scrape(t, s.Addr())
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := &http.Client{Timeout: time.Second}
		resp, err := c.Get("http://" + s.Addr() + "/metrics")
		if err != nil {
			break // refused: stopped
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("the server still answers after its context ended")
		}
		time.Sleep(10 * time.Millisecond) // polling a server stopping in the background
	}
	cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
	defer ccancel()
	if err := s.Close(cctx); err != nil {
		t.Fatalf("Close after the context stopped it: %v", err)
	}
	// A busy port is an error, not a panic or a hang.
	s2 := serve(t, context.Background(), NewJob().Registry())
	_, err = Serve(context.Background(), NewJob().Registry(), ServerConfig{Addr: s2.Addr()})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Serve on a busy port: %v", err)
	}
}
