package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testio"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/driver"
)

// traceEvent is what the tests read of a timeline's events.
type traceEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func readTrace(t *testing.T, b []byte) []traceEvent {
	t.Helper()
	raw, err := timeline.ReadEvents(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the timeline does not parse: %v", err)
	}
	evs := make([]traceEvent, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return evs
}

func countEvents(evs []traceEvent) map[string]int {
	n := map[string]int{}
	for _, e := range evs {
		n[e.Ph+" "+e.Name]++
	}
	return n
}

// TestSessionTimelineAndStall: two workers train while one stops, before the
// gradient allreduce of step 4, for several stall-check times. The waiting
// worker's inspector warns; the snapshots both send (at the warning and as
// heartbeats) let stall.Find name the stopped worker's rank and the tensors
// it lacks; the worker's timeline holds its steps, gradient allreduces,
// collectives with their phases, world switches, state broadcasts and the
// stall.
func TestSessionTimelineAndStall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	const check = 150 * time.Millisecond
	const steps, stopAt = 6, 4
	var mu stdsync.Mutex
	snaps := map[string][]stall.Snapshot{}
	bufs := map[string]*testio.Buffer{}
	var found []stall.Stall
	names := []string{"runs", "stops"}
	errs := make(chan error, len(names))
	for _, name := range names {
		w := startToy(t, name, coord, 64)
		buf := &testio.Buffer{}
		bufs[name] = buf
		tl := timeline.New(buf, timeline.Config{ProcessName: name})
		go func() {
			errs <- func() error {
				sess, err := joinCoord(ctx, coord, name, w.tr, w.state, func(c *Config) {
					c.Timeline, c.StallCheck = tl, check
					c.OnStallSnapshot = func(s stall.Snapshot) {
						mu.Lock()
						defer mu.Unlock()
						s.Worker = name
						snaps[name] = append(snaps[name], s)
						if s.InFlight && s.For >= check {
							var latest []stall.Snapshot
							for _, l := range snaps {
								latest = append(latest, l[len(l)-1])
							}
							if st, ok := stall.Find(s.Epoch, latest, check); ok {
								found = append(found, st)
							}
						}
					}
				})
				if err != nil {
					return err
				}
				defer tl.Close(context.Background())
				defer sess.Close()
				grads := []collective.Buffer{collective.SliceBuffer(make([]float32, 1<<16)), collective.SliceBuffer(make([]float64, 24))}
				for sess.Step() < steps {
					if name == "stops" && sess.Step()+1 == stopAt {
						time.Sleep(8 * check) // the trainer is stuck; the process is not
					}
					if err := sess.Allreduce(ctx, Reduction{}, grads...); err != nil {
						return err
					}
					if err := sess.Commit(ctx); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range names {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(found) == 0 {
		t.Fatalf("no stall found; snapshots %+v", snaps)
	}
	st := found[0]
	stopped := -1
	for _, s := range snaps["stops"] {
		stopped = s.Rank
	}
	if _, ok := st.Missing[stopped]; !ok || len(st.Missing) != 1 || len(st.Waiting) != 1 {
		t.Fatalf("stall %+v: want rank %d (the stopped worker) missing, the other waiting", st, stopped)
	}
	msg := st.String()
	for _, want := range []string{"missing ranks: " + string(rune('0'+stopped)), "lacks gradient 0 (float32×65536), gradient 1 (float64×24)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stall message %q lacks %q", msg, want)
		}
	}

	n := countEvents(readTrace(t, bufs["runs"].Bytes()))
	for _, want := range []string{"X step", "X allreduce gradients", "X allreduce", "X reduce-scatter", "X allgather",
		"X enter world", "X state broadcast", "i world", "C world size", "i stall"} {
		if n[want] == 0 {
			t.Errorf("the timeline has no %q event: %v", want, n)
		}
	}
	if n["X step"] != steps {
		t.Errorf("%d step events, want %d", n["X step"], steps)
	}
}

// TestWorkerConfigFromEnvObservability: the environment `gorovod run` gives
// a worker names its timeline part, stall check time and logging, and a bad
// value is refused.
func TestWorkerConfigFromEnvObservability(t *testing.T) {
	base := filepath.Join(t.TempDir(), "job.json")
	env := map[string]string{
		envconfig.EnvJobID: "job-x", envconfig.EnvSecret: "00112233445566778899aabbccddeeff", envconfig.EnvSeeds: "127.0.0.1:1",
		envconfig.EnvLaunchIndex: "3", envconfig.EnvTimeline: base, envconfig.EnvStallCheckTime: "2s",
		envconfig.EnvLogLevel: "info", envconfig.EnvLogFormat: "json",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := WorkerConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if want := base + ".job-x.worker3.json"; cfg.Timeline != want || cfg.Session.StallCheck != 2*time.Second || cfg.Logger == nil {
		t.Fatalf("timeline %q (want %q), stall check %v, logger %v", cfg.Timeline, want, cfg.Session.StallCheck, cfg.Logger)
	}
	t.Setenv(envconfig.EnvStallCheckTime, "off")
	if cfg, err = WorkerConfigFromEnv(); err != nil || cfg.Session.StallCheck >= 0 {
		t.Fatalf("off: %v, %v", cfg.Session.StallCheck, err)
	}
	for k, v := range map[string]string{envconfig.EnvStallCheckTime: "-1s", envconfig.EnvLogLevel: "loud"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := WorkerConfigFromEnv(); err == nil {
				t.Fatalf("%s=%s accepted", k, v)
			}
		})
	}
}

// TestTrainAloneWritesTimeline: a trainer alone in a world of one writes
// GOROVOD_TIMELINE itself (there is nothing to merge).
func TestTrainAloneWritesTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "alone.json")
	t.Setenv(envconfig.EnvTimeline, path)
	state := NewState()
	x := make([]float32, 64)
	state.RegisterTensor("x", x)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Train(ctx, TrainConfig{Steps: 5, NoLeaveSignal: true}, state, func(ctx context.Context, s *TrainStep) error {
		return s.Session.Allreduce(ctx, Reduction{}, collective.SliceBuffer(x))
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := countEvents(readTrace(t, b)); n["X step"] != 5 || n["X allreduce gradients"] != 5 || n["i world"] != 1 {
		t.Fatalf("events: %v", n)
	}
}
