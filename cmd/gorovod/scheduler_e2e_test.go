package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// e2eJob is one GorovodJob of TestSchedulerAndDriversOnKubelets.
type e2eJob struct {
	name           string
	steps, samples int
	h              *runJobHarness // its workers' trainer lines (no process)
}

// allocationHistory records each job's status.allocation as it changes,
// and whether the world size its driver reports reached each.
type allocationHistory struct {
	mu    sync.Mutex
	sizes map[string][]int // job → allocation sizes in order, repeats dropped
	spans map[string][]allocationSpan
	jobs  map[string]*api.GorovodJob
}

// allocationSpan is one allocation of a running job: from when the test saw
// it until it changed or the job ended (to; zero while it holds), and
// whether the driver's status.worldSize was its size meanwhile.
type allocationSpan struct {
	size     int
	from, to time.Time
	reached  bool
}

func (a *allocationHistory) observe(jobs []*api.GorovodJob) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for _, j := range jobs {
		a.jobs[j.Name] = j
		spans := a.spans[j.Name]
		var cur *allocationSpan
		if k := len(spans); k > 0 && spans[k-1].to.IsZero() {
			cur = &spans[k-1]
		}
		n := len(j.Status.Allocation)
		if cur != nil && (j.Status.Phase != api.PhaseRunning || cur.size != n) {
			cur.to, cur = now, nil
		}
		if j.Status.Phase != api.PhaseRunning {
			continue
		}
		if cur == nil {
			a.spans[j.Name] = append(a.spans[j.Name], allocationSpan{size: n, from: now})
			cur = &a.spans[j.Name][len(a.spans[j.Name])-1]
		}
		if int(j.Status.WorldSize) == n {
			cur.reached = true
		}
		s := a.sizes[j.Name]
		if len(s) == 0 || s[len(s)-1] != n {
			a.sizes[j.Name] = append(s, n)
		}
	}
}

// describe lists the job's allocations: size, how long, reached or not.
func (a *allocationHistory) describe(name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var parts []string
	for _, s := range a.spans[name] {
		mark := "reached"
		if !s.reached {
			mark = "not reached"
		}
		parts = append(parts, fmt.Sprintf("%d for %v (%s)", s.size, s.to.Sub(s.from).Round(100*time.Millisecond), mark))
	}
	return strings.Join(parts, ", ")
}

// unfollowed are the job's allocations that held at least within while the
// job ran, without its world reaching their size.
func (a *allocationHistory) unfollowed(name string, within time.Duration) []allocationSpan {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []allocationSpan
	for _, s := range a.spans[name] {
		if !s.reached && !s.to.IsZero() && s.to.Sub(s.from) >= within {
			out = append(out, s)
		}
	}
	return out
}

func (a *allocationHistory) job(name string) *api.GorovodJob {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.jobs[name]
}

// TestSchedulerAndDriversOnKubelets runs the scheduler service and real job
// drivers together on two real kubelets (each with its own containerd) of
// two worker slots each: three GorovodJobs of the synthetic trainer,
// submitted with `gorovod submit` at different times. The scheduler (in
// process, as its service account from deploy/kubernetes/gorovod.yaml)
// creates each job's driver pod, which runs the real `gorovod run
// --gorovodjob` (a static build in the driver image) as the service account
// gorovod-driver; the driver creates its worker pods where status.allocation
// says. The allocations change as jobs arrive and finish, and the drivers
// follow them: a job trains at every size its allocation had and never at
// more, a job whose allocation changed trains at more than one size, and
// every allocation that held 30 s reached its size in the world the driver
// reports — including a slot handed over from a worker still leaving, whose
// successor's pod the kubelet rejects until the slot is free (the launcher
// makes it again: package kube's PodRejected). Midway
// the scheduler is stopped and a new one started: it keeps the recorded
// allocations. Every job succeeds, its workers agreeing on the parameters at
// every step and training on every sample of each data epoch once.
//
// No CNI plugin and no kube-proxy here (package testkube): the pods use the
// host's network, and the driver pod reaches the API server at its real
// loopback address through KUBERNETES_SERVICE_HOST/PORT (set by the
// service's Config.CustomizeDriver), not through the kubernetes Service.
func TestSchedulerAndDriversOnKubelets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs jobs on real kubelets; skipped with -short")
	}
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skipf("no Kubernetes node here: %s", why)
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	dir := t.TempDir()
	pause := buildStatic(t, dir, "pause", "../../cluster/kube/testdata/podhelper")
	trainer := buildStatic(t, dir, "synthetic", "../../examples/synthetic")
	driver := buildStatic(t, dir, "gorovod", ".")
	// The workers' pod template, in the driver's image: host network (no
	// CNI plugin), the images imported on the nodes.
	template := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(template, []byte(`apiVersion: v1
kind: Pod
spec:
  hostNetwork: true
  containers:
  - name: trainer
    imagePullPolicy: Never
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const driverImage = "gorovod.local/driver:test"
	nodeCfg := testkube.NodeConfig{
		// Ready nodes: the scheduler places workers on no other.
		NetworkReady: true,
		PauseRef:     "gorovod.local/pause:test",
		Images: []testkube.Image{
			{Ref: "gorovod.local/pause:test", Files: map[string]string{"bin/pause": pause}, Entrypoint: []string{"/bin/pause", "pause"}},
			{Ref: "gorovod.local/synthetic:test", Files: map[string]string{"bin/synthetic": trainer}, Entrypoint: []string{"/bin/synthetic"}},
			// The driver writes its workers' environment under /tmp.
			{Ref: driverImage, Files: map[string]string{"usr/local/bin/gorovod": driver, "etc/gorovod/pod.yaml": template, "tmp/pod.yaml": template},
				Entrypoint: []string{"/usr/local/bin/gorovod"}},
		},
	}
	nodes := []*testkube.Node{cp.NewNode(t, nodeCfg), cp.NewNode(t, nodeCfg)}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := testkube.ApplyManifest(ctx, adminDyn, "../../deploy/kubernetes/gorovod.yaml"); err != nil {
		t.Fatal(err)
	}
	const ns = "e2e-jobs"
	if err := cp.Namespace(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForServiceAccount(ctx, admin, "gorovod-system"); err != nil {
		t.Fatal(err)
	}
	// Two worker slots a node, as an operator advertises them on nodes
	// without GPUs.
	for _, n := range nodes {
		if _, err := admin.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType,
			[]byte(`{"status":{"capacity":{"gorovod.io/slot":"2"}}}`), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		poll(t, "the node's slots allocatable", time.Minute, func() bool {
			got, err := admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			q := got.Status.Allocatable["gorovod.io/slot"]
			return err == nil && q.Value() == 2
		})
	}
	jobs := adminDyn.Resource(api.GroupVersionResource()).Namespace(ns)

	// The scheduler, as the service account gorovod.yaml gives it.
	tok, err := admin.CoreV1().ServiceAccounts("gorovod-system").CreateToken(ctx, "gorovod-scheduler",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schedCfg := cp.ConfigFor(tok.Status.Token)
	apiHost, apiPort, ok := strings.Cut(strings.TrimPrefix(cp.URL, "https://"), ":")
	if !ok {
		t.Fatalf("the API server's address %q", cp.URL)
	}
	var drivers atomic.Int64
	customize := func(pod *corev1.Pod) {
		// No kube-scheduler: the test spreads the driver pods over the
		// kubelets. Host network: the gossip port the pod declares would
		// be a host port, one driver a node; the driver binds loopback.
		pod.Spec.NodeName = nodes[int(drivers.Add(1))%len(nodes)].Name
		pod.Spec.HostNetwork = true
		c := &pod.Spec.Containers[0]
		c.Ports, c.ImagePullPolicy = nil, corev1.PullNever
		c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: apiHost}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: apiPort})
		c.Command = append(c.Command, "--kubernetes-pod-template=/etc/gorovod/pod.yaml", "--leave-notice=4s", "--progress=never")
	}
	type scheduler struct {
		rounds atomic.Int64
		cancel context.CancelFunc
		done   chan error
	}
	startScheduler := func(identity string) *scheduler {
		kc, err := kubernetes.NewForConfig(schedCfg)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := dynamic.NewForConfig(schedCfg)
		if err != nil {
			t.Fatal(err)
		}
		s := &scheduler{done: make(chan error, 1)}
		cfg := service.DefaultConfig()
		cfg.Identity, cfg.Interval, cfg.CustomizeDriver = identity, 3*time.Second, customize
		cfg.LeaderElection.Enabled = true
		cfg.LeaderElection.LeaseDuration, cfg.LeaderElection.RenewDeadline, cfg.LeaderElection.RetryPeriod = 6*time.Second, 4*time.Second, time.Second
		cfg.OnRound = func(err error) {
			if err == nil {
				s.rounds.Add(1)
			}
		}
		svc, err := service.New(cfg, kc, dc)
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithCancel(ctx)
		s.cancel = scancel
		go func() { s.done <- svc.Run(sctx) }()
		return s
	}
	stopScheduler := func(s *scheduler) {
		s.cancel()
		if err := <-s.done; err != nil {
			t.Errorf("the scheduler: %v", err)
		}
	}

	// The allocations as they change.
	hist := &allocationHistory{sizes: map[string][]int{}, spans: map[string][]allocationSpan{}, jobs: map[string]*api.GorovodJob{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			if l, err := jobs.List(watchCtx, metav1.ListOptions{}); err == nil {
				var js []*api.GorovodJob
				for i := range l.Items {
					if j, err := api.FromUnstructured(&l.Items[i]); err == nil {
						js = append(js, j)
					}
				}
				hist.observe(js)
			}
			select {
			case <-watchCtx.Done():
				return
			case <-time.After(200 * time.Millisecond): // polling the API server, as kubectl get -w's fallback does
			}
		}
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	// Each job's workers' lines, from the CRI logs of both nodes.
	followCtx, stopFollow := context.WithCancel(ctx)
	var following sync.WaitGroup
	defer func() {
		stopFollow()
		following.Wait()
	}()
	follow := func(j *e2eJob) {
		j.h = &runJobHarness{cmd: &exec.Cmd{}, pids: map[int]int{}, notify: make(chan struct{}, 1), exited: make(chan error, 1)}
		for _, n := range nodes {
			logs := &podLogs{dir: n.LogDir, job: j.name, read: map[string]int64{}, partial: map[string]string{}}
			following.Go(func() {
				logs.follow(followCtx, j.h)
				logs.poll(j.h) // the lines written last
			})
		}
	}
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(cp.AdminToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	submit := func(j *e2eJob) {
		t.Helper()
		manifest := filepath.Join(dir, j.name+".yaml")
		// 2 ms a sample, 24 a step: 48 ms a step at 1 worker.
		if err := os.WriteFile(manifest, fmt.Appendf(nil, `apiVersion: gorovod.io/v1alpha1
kind: GorovodJob
metadata:
  name: %s
spec:
  image: gorovod.local/synthetic:test
  driverImage: %s
  command: [/bin/synthetic, --steps, "%d", --json, --samples, "%d", --batch, "24", --model-size, "20000", --compute, 2ms]
  env:
  - {name: GOROVOD_LISTEN_ADDR, value: "127.0.0.1:0"}
  - {name: GOROVOD_GOSSIP_ADDR, value: 127.0.0.1}
  minWorkers: 1
  maxWorkers: 4
  batch: {initial: 24}
`, j.name, driverImage, j.steps, j.samples), 0o600); err != nil {
			t.Fatal(err)
		}
		follow(j)
		out, err := exec.CommandContext(ctx, binary, "submit", "--kubeconfig", kubeconfig, "--namespace", ns, manifest).CombinedOutput()
		if err != nil {
			t.Fatalf("gorovod submit %s: %v: %s", j.name, err, out)
		}
	}
	trained := func(j *e2eJob, steps int64) {
		t.Helper()
		j.h.waitFor(t, fmt.Sprintf("%s past step %d", j.name, steps), 4*time.Minute, func(l []trainerLine) bool { return maxStep(l) > steps })
	}
	all := []*e2eJob{{name: "first", steps: 2500, samples: 1200}, {name: "second", steps: 1500, samples: 1200}, {name: "third", steps: 1000, samples: 960}}
	defer func() {
		if !t.Failed() {
			return
		}
		for _, j := range all {
			t.Logf("%s: allocation sizes %v, status %+v", j.name, hist.sizes[j.name], hist.job(j.name))
			for _, n := range nodes {
				matches, _ := filepath.Glob(filepath.Join(n.LogDir, ns+"_"+j.name+"-driver_*", service.DriverContainer, "*.log"))
				for _, m := range matches {
					b, _ := os.ReadFile(m)
					t.Logf("%s's driver on %s (last 6 KiB):\n%s", j.name, n.Name, b[max(0, len(b)-6<<10):])
				}
			}
		}
	}()

	sched := startScheduler("sched-1")
	submit(all[0])
	trained(all[0], 50)
	submit(all[1])
	trained(all[1], 50)
	submit(all[2])
	trained(all[2], 50)

	// The scheduler restarts: the new one keeps the jobs' allocations.
	before := map[string][]string{}
	for _, j := range all {
		if gj := hist.job(j.name); gj != nil && gj.Status.Phase == api.PhaseRunning {
			before[j.name] = gj.Status.Allocation
		}
	}
	stopScheduler(sched)
	sched = startScheduler("sched-2")
	poll(t, "the new scheduler's first round", time.Minute, func() bool { return sched.rounds.Load() >= 1 })
	for name, alloc := range before {
		gj := hist.job(name)
		// A job may have ended meanwhile; one running keeps its allocation.
		if u, err := jobs.Get(ctx, name, metav1.GetOptions{}); err == nil {
			if cur, err := api.FromUnstructured(u); err == nil {
				gj = cur
			}
		}
		if gj.Status.Phase == api.PhaseRunning && !slices.Equal(gj.Status.Allocation, alloc) {
			t.Errorf("%s's allocation %v became %v across the scheduler's restart", name, alloc, gj.Status.Allocation)
		}
	}

	poll(t, "every job ended", 6*time.Minute, func() bool {
		for _, j := range all {
			if gj := hist.job(j.name); gj == nil || !gj.Status.Phase.Ended() {
				return false
			}
		}
		return true
	})
	stopScheduler(sched)
	stopFollow()
	following.Wait()

	// A grow takes a pod's start (a second or two here), plus, on a slot
	// still held by a leaving worker, that worker's leave notice (4 s); the
	// driver writes its status every 3 s.
	const followWithin = 30 * time.Second
	changed := false
	for _, j := range all {
		if gj := hist.job(j.name); gj.Status.Phase != api.PhaseSucceeded {
			t.Fatalf("%s: %+v", j.name, gj.Status)
		}
		hist.mu.Lock()
		sizes := slices.Clone(hist.sizes[j.name])
		hist.mu.Unlock()
		j.h.mu.Lock()
		var worlds []int
		for _, l := range j.h.lines {
			if !slices.Contains(worlds, l.Size) {
				worlds = append(worlds, l.Size)
			}
		}
		t.Logf("%s: allocation sizes %v; world sizes trained at %v; allocations held %s", j.name, sizes, worlds, hist.describe(j.name))
		// Workers join a growing world as their pods start, so a world
		// may pass through sizes between two allocations; it never holds
		// more workers than the job was allocated, and it reaches every
		// size the job's allocation had.
		for _, w := range worlds {
			if w > slices.Max(sizes) {
				t.Errorf("%s trained at %d workers, more than its allocation ever had (%v)", j.name, w, sizes)
			}
		}
		for _, n := range sizes {
			if !slices.Contains(worlds, n) {
				t.Errorf("%s never trained at %d workers, a size its allocation had (%v): the driver did not follow", j.name, n, sizes)
			}
		}
		// Each allocation that held long enough for its workers' pods to
		// start (or to leave) was reached: the driver follows every
		// change, not only the first ones.
		for _, s := range hist.unfollowed(j.name, followWithin) {
			t.Errorf("%s was allocated %d workers for %v, but its world never had %d: the driver did not follow",
				j.name, s.size, s.to.Sub(s.from).Round(time.Second), s.size)
		}
		if len(sizes) > 1 {
			changed = true
			if len(worlds) < 2 {
				t.Errorf("%s's allocation went %v but it trained only at %v: the driver did not follow", j.name, sizes, worlds)
			}
		}
		checkElasticInvariantsSteps(t, j.h.lines, j.samples, int64(j.steps))
		j.h.mu.Unlock()
	}
	if !changed {
		t.Errorf("no job's allocation changed as the jobs arrived and finished")
	}
}
