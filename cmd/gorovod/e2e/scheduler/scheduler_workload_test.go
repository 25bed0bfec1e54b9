package scheduler

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// schedulerProcessEnv, set in the environment of this test binary, makes it
// the scheduler service of the end-to-end tests' cluster (TestMain runs
// runSchedulerProcess instead of the tests): a process of its own, whose
// CPU time and memory are the scheduler's alone. Its value is a
// schedulerProcessSpec in JSON.
const schedulerProcessEnv = "GOROVOD_TEST_SCHEDULER_PROCESS"

// schedulerProcessSpec is what the scheduler process is told.
type schedulerProcessSpec struct {
	Kubeconfig string // its service account's
	Identity   string
	Policy     string
	Drivers    e2eDriverPlacement
}

// schedulerRound is the line the scheduler process prints after each round
// it runs: the round's error, and the process's CPU time (user and system,
// getrusage) and resident memory (VmRSS) then.
type schedulerRound struct {
	Err    string        `json:"err,omitempty"`
	CPU    time.Duration `json:"cpu_ns"`
	RSSKiB int64         `json:"rss_kib"`
}

// runSchedulerProcess is the scheduler process: the service with the
// end-to-end tests' Config (e2eServiceConfig) until SIGTERM or SIGINT. It
// returns the process's exit status.
func runSchedulerProcess(specJSON string) int {
	var spec schedulerProcessSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "scheduler process: %s: %v\n", schedulerProcessEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := schedulerProcess(ctx, spec, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "scheduler process: %v\n", err)
		return 1
	}
	return 0
}

func schedulerProcess(ctx context.Context, spec schedulerProcessSpec, out io.Writer) error {
	b, err := os.ReadFile(spec.Kubeconfig)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(b)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	scfg := e2eServiceConfig(spec.Identity, spec.Drivers.customizer(func() string { return "" }))
	scfg.Policy = spec.Policy
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	scfg.OnRound = func(err error) {
		r := schedulerRound{CPU: processCPU(), RSSKiB: residentKiB()}
		if err != nil {
			r.Err = err.Error()
		}
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(r)
	}
	svc, err := service.New(scfg, kc, dc)
	if err != nil {
		return err
	}
	return svc.Run(ctx)
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// residentKiB is this process's resident memory now (VmRSS), in KiB.
func residentKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// scheduledBy is a scheduler process the test started, and the rounds it
// reported.
type scheduledBy struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	rounds []schedulerRound
	stderr bytes.Buffer
	read   chan struct{} // closed when its stdout is read to the end
}

func (s *scheduledBy) roundsSoFar() []schedulerRound {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rounds)
}

// startSchedulerProcess starts the scheduler as a process of its own (this
// test binary, as the service account gorovod.yaml gives the scheduler)
// with policy.
func (e *e2eCluster) startSchedulerProcess(t *testing.T, identity, policy string) *scheduledBy {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "scheduler.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(e.schedKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(schedulerProcessSpec{Kubeconfig: kubeconfig, Identity: identity, Policy: policy, Drivers: e.drivers})
	if err != nil {
		t.Fatal(err)
	}
	s := &scheduledBy{cmd: exec.CommandContext(e.ctx, os.Args[0]), read: make(chan struct{})}
	s.cmd.Env = append(os.Environ(), schedulerProcessEnv+"="+string(spec))
	s.cmd.Stderr = &s.stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r schedulerRound
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				s.mu.Lock()
				s.rounds = append(s.rounds, r)
				s.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.read
		_ = s.cmd.Wait()
	})
	return s
}

// stop ends the scheduler process (SIGTERM, as a Deployment's rollout does)
// and checks that it ended cleanly.
func (s *scheduledBy) stop(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.read
	if err := s.cmd.Wait(); err != nil {
		t.Errorf("the scheduler process: %v; its stderr ends:\n%s", err, tail(s.stderr.Bytes(), 4<<10))
	}
}

func tail(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

// fashionMNISTImage is the Fashion-MNIST example trainer's image, with
// Debian's data set where the trainer looks for it.
const fashionMNISTImage = "gorovod.local/fashion-mnist:test"

func fashionMNISTImages(t *testing.T) []testkube.Image {
	t.Helper()
	files := map[string]string{"bin/fashion-mnist": testkube.BuildStatic(t, "../../../../examples/fashion-mnist")}
	for _, f := range []string{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		files["usr/share/datasets/fashion-mnist/"+f] = "/usr/share/datasets/fashion-mnist/" + f
	}
	return []testkube.Image{{Ref: fashionMNISTImage, Files: files, Entrypoint: []string{"/bin/fashion-mnist"}}}
}

// workloadArrival is one job of the measured workload: when it is submitted
// (after the run's first) and what it is.
type workloadArrival struct {
	after time.Duration
	job   e2eJob
}

// workload is the measured workload's 6 jobs, arriving over 2 minutes: four
// of the synthetic trainer (48 ms a step alone, its compute a sleep that
// shrinks with more workers) of different lengths and worker bounds, and
// two of the Fashion-MNIST example (real compute, on this machine's cores)
// where Debian's data set is installed, else two more synthetic ones whose
// fixed per-step time does not shrink with workers.
func workload(fashion bool) []workloadArrival {
	w := []workloadArrival{
		{0, e2eJob{name: "a", steps: 2500, samples: 1200, minWorkers: 1, maxWorkers: 4}},
		{20 * time.Second, e2eJob{name: "b", steps: 1500, samples: 1200, minWorkers: 1, maxWorkers: 2}},
		{40 * time.Second, e2eJob{name: "c", fashionMNIST: true, trainer: []string{"--epochs", "6"}, minWorkers: 1, maxWorkers: 4}},
		{60 * time.Second, e2eJob{name: "d", steps: 3000, samples: 960, minWorkers: 2, maxWorkers: 4}},
		{90 * time.Second, e2eJob{name: "e", fashionMNIST: true, trainer: []string{"--epochs", "4"}, minWorkers: 1, maxWorkers: 2}},
		{120 * time.Second, e2eJob{name: "f", steps: 1000, samples: 960, minWorkers: 1, maxWorkers: 4}},
	}
	if !fashion {
		for i, a := range w {
			if a.job.fashionMNIST {
				w[i].job = e2eJob{name: a.job.name, steps: 1200, samples: 960, minWorkers: a.job.minWorkers, maxWorkers: a.job.maxWorkers,
					trainer: []string{"--step-overhead", "40ms"}}
			}
		}
	}
	return w
}

// workloadRun is one run of the workload under one policy.
type workloadRun struct {
	policy string
	run    int
	jobs   []*e2eJob
	sched  *scheduledBy
}

// TestSchedulerWorkloadOnKubelets measures the scheduler service on the
// cluster of TestSchedulerAndDriversOnKubelets (two real kubelets of two
// slots each): the 6 jobs of workload, submitted with `gorovod submit` on a
// fixed schedule, under each policy in turn (the scheduler a process of its
// own, `go test`'s binary run as one), each run after the previous one's
// pods are gone. It reports per run the jobs' completion times (submit to
// Succeeded, as the test saw the status), the makespan, each change of a
// job's world (the time from the last step of the old world to the first
// of the new, from the container runtime's log timestamps) and the
// scheduler's CPU time and resident memory at each round; it checks what
// TestSchedulerAndDriversOnKubelets checks of every job (it succeeds,
// follows its allocations, its workers agree on the parameters at every
// step).
//
// Opt in with GOROVOD_MEASURE_WORKLOAD=1; GOROVOD_MEASURE_POLICIES
// (default pollux,optimus,tiresias) and GOROVOD_MEASURE_RUNS (default 1)
// choose the runs. Without -race, for the scheduler's own figures:
//
//	GOROVOD_MEASURE_WORKLOAD=1 go test -run TestSchedulerWorkloadOnKubelets -v -timeout 90m ./cmd/gorovod
func TestSchedulerWorkloadOnKubelets(t *testing.T) {
	if os.Getenv("GOROVOD_MEASURE_WORKLOAD") != "1" {
		t.Skip("a measurement of several minutes a policy: set GOROVOD_MEASURE_WORKLOAD=1 (CI tests the scheduler and drivers on these kubelets in TestSchedulerAndDriversOnKubelets and its siblings)")
	}
	policies := strings.Split(cmp.Or(os.Getenv("GOROVOD_MEASURE_POLICIES"), strings.Join(service.Policies, ",")), ",")
	runs, err := strconv.Atoi(cmp.Or(os.Getenv("GOROVOD_MEASURE_RUNS"), "1"))
	if err != nil || runs < 1 {
		t.Fatalf("GOROVOD_MEASURE_RUNS=%q", os.Getenv("GOROVOD_MEASURE_RUNS"))
	}
	fashion := e2e.HaveFashionMNIST()
	var images []testkube.Image
	if fashion {
		images = fashionMNISTImages(t)
	} else {
		t.Log("no Fashion-MNIST data set here (Debian's dataset-fashion-mnist): jobs c and e are synthetic with a fixed step overhead")
	}
	const perRun = 9 * time.Minute
	// Nodes without addresses, every pod at 127.0.0.1: the figures
	// docs/scheduler.md gives were measured on them. Where the workers and
	// the drivers bind is checked by the tests on nodes with addresses
	// (newE2EClusterPodIPs).
	e := newE2EClusterWith(t, time.Duration(runs*len(policies))*perRun+5*time.Minute, images)
	var done []*workloadRun
	var all []*e2eJob
	defer func() { e.logFailure(t, all) }()
	for r := 1; r <= runs; r++ {
		for _, policy := range policies {
			wr := &workloadRun{policy: policy, run: r}
			t.Logf("run %d under %s, load average %s", r, policy, e2e.LoadAverage())
			wr.sched = e.startSchedulerProcess(t, fmt.Sprintf("workload-%s-%d", policy, r), policy)
			start := time.Now()
			for _, a := range workload(fashion) {
				select {
				case <-time.After(time.Until(start.Add(a.after))): // the arrival schedule
				case <-e.ctx.Done():
					t.Fatal(e.ctx.Err())
				}
				j := a.job
				j.name = fmt.Sprintf("%s-%d-%s", policy, r, j.name)
				e.submit(&j)
				wr.jobs = append(wr.jobs, &j)
				all = append(all, &j)
			}
			e2e.Poll(t, "every job of the run ended", perRun, func() bool {
				for _, j := range wr.jobs {
					if gj := e.hist.job(j.name); gj == nil || !gj.Status.Phase.Ended() {
						return false
					}
				}
				return true
			})
			wr.sched.stop(t)
			done = append(done, wr)
			// The next run starts on free nodes: the jobs' pods gone.
			e2e.Poll(t, "the run's pods gone", 2*time.Minute, func() bool {
				pods, err := e.admin.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
				if err != nil {
					return false
				}
				return !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool {
					return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending
				})
			})
		}
	}
	e.stopFollowing()
	e.checkJobs(t, all)
	reportWorkload(t, e, done)
}

// worldChange is a job's change of world: the pause from the last step of
// the old world to the first of the new.
type worldChange struct {
	from, to int // world sizes
	pause    time.Duration
	stepTime time.Duration // the old world's median time between steps
}

// worldChanges are the changes of world in a job's trainer lines, in order.
func worldChanges(lines []e2e.TrainerLine) []worldChange {
	type world struct {
		epoch       uint64
		rank0       string
		size        int
		first, last time.Time
		steps       map[int64]time.Time // each step's first line
	}
	var worlds []*world
	byKey := map[string]*world{}
	for _, l := range lines {
		if l.Params == "" || l.Size == 0 {
			continue // the Fashion-MNIST trainer's epoch and final records
		}
		k := fmt.Sprintf("%d/%s", l.WorldEpoch, l.WorldRank0)
		w := byKey[k]
		if w == nil {
			w = &world{epoch: l.WorldEpoch, rank0: l.WorldRank0, size: l.Size, first: l.At, last: l.At, steps: map[int64]time.Time{}}
			byKey[k] = w
			worlds = append(worlds, w)
		}
		if l.At.Before(w.first) {
			w.first = l.At
		}
		if l.At.After(w.last) {
			w.last = l.At
		}
		if at, ok := w.steps[l.Step]; !ok || l.At.Before(at) {
			w.steps[l.Step] = l.At
		}
	}
	slices.SortFunc(worlds, func(a, b *world) int { return a.first.Compare(b.first) })
	var out []worldChange
	for i := 1; i < len(worlds); i++ {
		prev, next := worlds[i-1], worlds[i]
		var gaps []time.Duration
		var steps []int64
		for s := range prev.steps {
			steps = append(steps, s)
		}
		slices.Sort(steps)
		for k := 1; k < len(steps); k++ {
			if steps[k] == steps[k-1]+1 {
				gaps = append(gaps, prev.steps[steps[k]].Sub(prev.steps[steps[k-1]]))
			}
		}
		var median time.Duration
		if len(gaps) > 0 {
			slices.Sort(gaps)
			median = gaps[len(gaps)/2]
		}
		out = append(out, worldChange{from: prev.size, to: next.size, pause: next.first.Sub(prev.last), stepTime: median})
	}
	return out
}

// reportWorkload logs the runs' table (markdown), each job's changes of
// world, and the scheduler's rounds.
func reportWorkload(t *testing.T, e *e2eCluster, runs []*workloadRun) {
	t.Helper()
	var b strings.Builder
	b.WriteString("\n| policy | run | JCT a, b, c, d, e, f (s) | average JCT (s) | makespan (s) | world changes | pause median / max (s) | rounds | scheduler CPU a round, mean / max (ms) | scheduler RSS, max (MiB) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	var details strings.Builder
	for _, wr := range runs {
		var jcts []string
		var sum time.Duration
		first, last := wr.jobs[0].submitted, time.Time{}
		var pauses []time.Duration
		for _, j := range wr.jobs {
			e.hist.mu.Lock()
			end := e.hist.ended[j.name]
			e.hist.mu.Unlock()
			jct := end.Sub(j.submitted)
			sum += jct
			jcts = append(jcts, fmt.Sprintf("%.0f", jct.Seconds()))
			if end.After(last) {
				last = end
			}
			j.h.Mu.Lock()
			changes := worldChanges(j.h.Lines)
			var startup time.Duration
			for _, l := range j.h.Lines {
				if l.Size > 0 && (startup == 0 || l.At.Sub(j.submitted) < startup) {
					startup = l.At.Sub(j.submitted)
				}
			}
			j.h.Mu.Unlock()
			var cs []string
			for _, c := range changes {
				pauses = append(pauses, c.pause)
				cs = append(cs, fmt.Sprintf("%d→%d %.2fs (steps %.0f ms)", c.from, c.to, c.pause.Seconds(), float64(c.stepTime)/float64(time.Millisecond)))
			}
			fmt.Fprintf(&details, "%s: JCT %.1fs, first step %.1fs after submit, allocations %s; world changes: %s\n",
				j.name, jct.Seconds(), startup.Seconds(), e.hist.describe(j.name), strings.Join(cs, ", "))
		}
		slices.Sort(pauses)
		pauseCol := "–"
		if len(pauses) > 0 {
			pauseCol = fmt.Sprintf("%.2f / %.2f", pauses[len(pauses)/2].Seconds(), pauses[len(pauses)-1].Seconds())
		}
		rounds := wr.sched.roundsSoFar()
		var cpuMean, cpuMax time.Duration
		var rssMax int64
		for i, r := range rounds {
			rssMax = max(rssMax, r.RSSKiB)
			if i > 0 {
				d := r.CPU - rounds[i-1].CPU
				cpuMean += d
				cpuMax = max(cpuMax, d)
			}
		}
		if len(rounds) > 1 {
			cpuMean /= time.Duration(len(rounds) - 1)
		}
		var cpuTotal time.Duration
		if len(rounds) > 0 {
			cpuTotal = rounds[len(rounds)-1].CPU
		}
		fmt.Fprintf(&details, "%s run %d: %d rounds, the scheduler's CPU %.2fs in all, RSS at each round (MiB): %s\n",
			wr.policy, wr.run, len(rounds), cpuTotal.Seconds(), rssList(rounds))
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %.0f | %d | %s | %d | %.1f / %.1f | %.1f |\n", wr.policy, wr.run, strings.Join(jcts, ", "),
			(sum / time.Duration(len(wr.jobs))).Seconds(), last.Sub(first).Seconds(), len(pauses), pauseCol, len(rounds),
			float64(cpuMean)/float64(time.Millisecond), float64(cpuMax)/float64(time.Millisecond), float64(rssMax)/1024)
	}
	t.Logf("load average at the end %s%s\n%s", e2e.LoadAverage(), b.String(), details.String())
}

// rssList is the rounds' resident memory in MiB, every fifth round.
func rssList(rounds []schedulerRound) string {
	var s []string
	for i := 0; i < len(rounds); i += 5 {
		s = append(s, fmt.Sprintf("%.0f", float64(rounds[i].RSSKiB)/1024))
	}
	return strings.Join(s, " ")
}
