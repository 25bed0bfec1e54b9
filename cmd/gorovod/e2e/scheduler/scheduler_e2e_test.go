package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// e2eJob is one GorovodJob of TestSchedulerAndDriversOnKubelets.
type e2eJob struct {
	name           string
	steps, samples int
	spec           string             // more of its spec: YAML lines, indented as spec's fields
	submitArgs     []string           // more arguments of its `gorovod submit`
	h              *e2e.RunJobHarness // its workers' trainer lines (no process)
	// minWorkers and maxWorkers bound its workers (default 1 and 4).
	minWorkers, maxWorkers int
	// fashionMNIST: its workers run the Fashion-MNIST example
	// (spec.batch.initial 64) instead of the synthetic trainer (steps and
	// samples).
	fashionMNIST bool
	trainer      []string  // more arguments of its trainer
	submitted    time.Time // when its `gorovod submit` returned
}

// allocationHistory records each job's status.allocation as it changes,
// and whether the world size its driver reports reached each.
type allocationHistory struct {
	mu    sync.Mutex
	sizes map[string][]int           // job → allocation sizes in order, repeats dropped
	nodes map[string]map[string]bool // job → the nodes its allocations named
	// allocs are each job's allocations in order, repeats dropped.
	allocs map[string][][]string
	spans  map[string][]allocationSpan
	jobs   map[string]*api.GorovodJob
	// ended is when each job was first seen in an ended phase.
	ended map[string]time.Time
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
		if _, ok := a.ended[j.Name]; !ok && j.Status.Phase.Ended() {
			a.ended[j.Name] = now
		}
		for _, n := range j.Status.Allocation {
			if a.nodes[j.Name] == nil {
				a.nodes[j.Name] = map[string]bool{}
			}
			a.nodes[j.Name][n] = true
		}
		if k := len(a.allocs[j.Name]); len(j.Status.Allocation) > 0 && (k == 0 || !slices.Equal(a.allocs[j.Name][k-1], j.Status.Allocation)) {
			a.allocs[j.Name] = append(a.allocs[j.Name], slices.Clone(j.Status.Allocation))
		}
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

// lastUnreached is the size of the job's last allocation when the job's
// world never reached it and it held less than within before the job ended.
func (a *allocationHistory) lastUnreached(name string, within time.Duration) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	spans := a.spans[name]
	if len(spans) == 0 {
		return 0, false
	}
	s := spans[len(spans)-1]
	if s.reached || s.to.IsZero() || s.to.Sub(s.from) >= within {
		return 0, false
	}
	return s.size, true
}

func (a *allocationHistory) job(name string) *api.GorovodJob {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.jobs[name]
}

// e2eCluster is the cluster of the scheduler's end-to-end tests: a control
// plane with gorovod.yaml installed, two real kubelets (each with its own
// containerd) of two gorovod.io/slot each, the namespace e2e-jobs, and what
// the tests do with it.
type e2eCluster struct {
	ctx   context.Context
	nodes []*testkube.Node
	admin kubernetes.Interface
	jobs  dynamic.ResourceInterface // the namespace's GorovodJobs, as admin
	ns    string
	hist  *allocationHistory
	// driverNode, if set, is where the drivers' pods go (else they
	// alternate between the nodes). Set it before the scheduler starts, or
	// with placeDrivers while it runs.
	driverNode   *testkube.Node
	driverNodeMu sync.Mutex
	// drivers places the driver pods; schedKubeconfig is the scheduler's
	// kubeconfig (its service account's token).
	drivers         e2eDriverPlacement
	schedKubeconfig string
	// startScheduler starts a scheduler service (in process, as the
	// service account gorovod.yaml gives it); stopScheduler stops it.
	startScheduler func(identity string) *e2eScheduler
	stopScheduler  func(*e2eScheduler)
	// submit writes a GorovodJob's manifest and submits it with `gorovod
	// submit`, following its workers' lines in the nodes' CRI logs.
	submit func(*e2eJob)
	// trained waits for a job's workers to train past a step.
	trained func(j *e2eJob, steps int64)
	// stopFollowing stops following the workers' lines, once their
	// last lines are read.
	stopFollowing func()
}

// e2eDriverPlacement is where the end-to-end tests' driver pods run and
// how they reach the API server.
type e2eDriverPlacement struct {
	// Nodes are the kubelets' nodes: the drivers alternate between them.
	Nodes []string
	// APIHost and APIPort are the API server's loopback address.
	APIHost, APIPort string
	// GossipPort, if set, is the drivers' --kubernetes-gossip-port: a
	// port free on this machine rather than the default 7946, which a
	// driver binds at its pod IP where its node has an address.
	GossipPort string
	// GossipPortEach gives each driver pod a free port of its own
	// instead: the nodes' pods share their node's address here, where
	// on a pod network each pod has its own IP, so that two drivers on
	// one node would otherwise want the same address.
	GossipPortEach bool
}

// customizer is the scheduler's Config.CustomizeDriver for the tests'
// cluster: the driver pods alternate between the nodes, or go to
// override() where that names one.
func (p e2eDriverPlacement) customizer(override func() string) func(*corev1.Pod) {
	var drivers atomic.Int64
	return func(pod *corev1.Pod) {
		// No kube-scheduler: the test spreads the driver pods over the
		// kubelets. Host network: the gossip port the pod declares would
		// be a host port, one driver a node; the driver binds its pod IP
		// where its node has an address of its own, else loopback.
		pod.Spec.NodeName = p.Nodes[int(drivers.Add(1))%len(p.Nodes)]
		if n := override(); n != "" {
			pod.Spec.NodeName = n
		}
		pod.Spec.HostNetwork = true
		c := &pod.Spec.Containers[0]
		c.Ports, c.ImagePullPolicy = nil, corev1.PullNever
		c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: p.APIHost}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: p.APIPort})
		c.Command = append(c.Command, "--kubernetes-pod-template=/etc/gorovod/pod.yaml", "--leave-notice=4s", "--progress=never")
		port := p.GossipPort
		if p.GossipPortEach {
			// A port free now, and bound a second or two later by a
			// process in the pod: another process may take it
			// meanwhile, which the driver reports as its error.
			if ports, err := testdaemon.FreePorts(1); err == nil {
				port = strconv.Itoa(ports[0])
			}
		}
		if port != "" {
			c.Command = append(c.Command, "--kubernetes-gossip-port="+port)
		}
	}
}

// e2eServiceConfig is the scheduler service's Config in the end-to-end
// tests: rounds every 3 s, leader election with short leases.
func e2eServiceConfig(identity string, customize func(*corev1.Pod)) service.Config {
	cfg := service.DefaultConfig()
	cfg.Identity, cfg.Interval, cfg.CustomizeDriver = identity, 3*time.Second, customize
	cfg.LeaderElection.Enabled = true
	cfg.LeaderElection.LeaseDuration, cfg.LeaderElection.RenewDeadline, cfg.LeaderElection.RetryPeriod = 6*time.Second, 4*time.Second, time.Second
	return cfg
}

// e2eScheduler is a scheduler service the test started.
type e2eScheduler struct {
	rounds atomic.Int64
	cancel context.CancelFunc
	done   chan error
}

// placeDrivers puts the driver pods the scheduler makes from now on on
// node n.
func (e *e2eCluster) placeDrivers(n *testkube.Node) {
	e.driverNodeMu.Lock()
	defer e.driverNodeMu.Unlock()
	e.driverNode = n
}

// driverLogs are the job's driver's log lines (from the nodes' CRI logs).
func (e *e2eCluster) driverLogs(job string) map[string][]byte {
	out := map[string][]byte{}
	for _, n := range e.nodes {
		matches, _ := filepath.Glob(filepath.Join(n.LogDir, e.ns+"_"+job+"-driver*_*", service.DriverContainer, "*.log"))
		for _, m := range matches {
			if b, err := os.ReadFile(m); err == nil {
				out[n.Name] = append(out[n.Name], b...)
			}
		}
	}
	return out
}

// logFailure logs the jobs' allocations, statuses and drivers' logs when
// the test failed.
func (e *e2eCluster) logFailure(t *testing.T, jobs []*e2eJob) {
	if !t.Failed() {
		return
	}
	for _, j := range jobs {
		e.hist.mu.Lock()
		sizes := slices.Clone(e.hist.sizes[j.name])
		e.hist.mu.Unlock()
		t.Logf("%s: allocation sizes %v, status %+v", j.name, sizes, e.hist.job(j.name))
		for node, b := range e.driverLogs(j.name) {
			t.Logf("%s's driver on %s (last 6 KiB):\n%s", j.name, node, b[max(0, len(b)-6<<10):])
		}
	}
}

// checkJobs checks what every job of the end-to-end tests must show at its
// end: it succeeded; it trained at every size its allocation had and never
// at more; every allocation that held followWithin reached its size in the
// world the driver reports; its workers agreed on the parameters at every
// step and trained on every sample of each data epoch once. It says
// whether some job's allocation changed.
func (e *e2eCluster) checkJobs(t *testing.T, jobs []*e2eJob) (changed bool) {
	t.Helper()
	// A grow takes a pod's start (a second or two here), plus, on a slot
	// still held by a leaving worker, that worker's leave notice (4 s); the
	// driver writes its status every 3 s.
	const followWithin = 30 * time.Second
	hist := e.hist
	for _, j := range jobs {
		if gj := hist.job(j.name); gj.Status.Phase != api.PhaseSucceeded {
			t.Fatalf("%s: %+v", j.name, gj.Status)
		}
		hist.mu.Lock()
		sizes := slices.Clone(hist.sizes[j.name])
		hist.mu.Unlock()
		j.h.Mu.Lock()
		var worlds []int
		for _, l := range j.h.Lines {
			// Size 0: the Fashion-MNIST trainer's epoch and final records.
			if l.Size > 0 && !slices.Contains(worlds, l.Size) {
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
		// The job's last allocation may come as its training ends (a round
		// that another job's end called for): one it held less than
		// followWithin without reaching it is not a size it must have
		// trained at. Those it held longer are checked below.
		needed := sizes
		if late, ok := hist.lastUnreached(j.name, followWithin); ok && len(needed) > 0 && needed[len(needed)-1] == late {
			needed = needed[:len(needed)-1]
			t.Logf("%s: its last allocation (%d workers) came as it ended and was not followed", j.name, late)
		}
		for _, n := range needed {
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
			// An allocation that came as the job ended is not one it
			// must have followed (needed, above, leaves it out).
			if len(worlds) < 2 && len(slices.Compact(slices.Clone(needed))) > 1 {
				t.Errorf("%s's allocation went %v but it trained only at %v: the driver did not follow", j.name, sizes, worlds)
			}
		}
		if j.fashionMNIST {
			if msg, ok := e2e.Disagreement(j.h.Lines); !ok {
				t.Errorf("%s: %s", j.name, msg)
			}
		} else {
			e2e.CheckElasticInvariantsSteps(t, j.h.Lines, j.samples, int64(j.steps))
		}
		j.h.Mu.Unlock()
	}
	return changed
}

// newE2EClusterWith is the cluster of the end-to-end tests (e2eCluster) on
// nodes without addresses (loopbackNodes), where every pod is at 127.0.0.1,
// which hides where a pod binds, with more images on the nodes. Tests of
// where workers and drivers run and talk use newE2EClusterPodIPs.
func newE2EClusterWith(t *testing.T, timeout time.Duration, images []testkube.Image) *e2eCluster {
	t.Helper()
	return newE2EClusterOf(t, timeout, images, loopbackNodes)
}

// newE2EClusterPodIPs is the cluster of the end-to-end tests with nodes of
// addresses of their own (testkube's NodeConfig.Reachable: 127.0.0.2 and
// 127.0.0.3), which their host-network pods get as status.podIP: the
// drivers and the workers bind their pod IPs (GOROVOD_POD_IP), as on a pod
// network, so that a pod on the other node has another IP. The jobs' spec
// sets no address for the workers: they take the ones cluster/kube derives
// from the pod IP. Each driver pod gets a gossip port of its own
// (e2eDriverPlacement's GossipPortEach).
func newE2EClusterPodIPs(t *testing.T, timeout time.Duration) *e2eCluster {
	t.Helper()
	return newE2EClusterOf(t, timeout, nil, podIPNodes)
}

// e2eNodes are the kinds of node of the end-to-end tests' clusters.
type e2eNodes int

const (
	// loopbackNodes have no address: every pod is at 127.0.0.1, and the
	// jobs' workers are told to bind it (GOROVOD_LISTEN_ADDR,
	// GOROVOD_GOSSIP_ADDR), as their pod IP is empty.
	loopbackNodes e2eNodes = iota
	// podIPNodes have addresses of their own (newE2EClusterPodIPs).
	podIPNodes
	// podIPNodesOnePort are podIPNodes whose driver pods all get the same
	// gossip port (e2eDriverPlacement's GossipPort), as the drivers of a
	// real cluster all get 7946 at their pod IPs: for tests with one
	// driver at a time, whose replacement at the same node is at the
	// address of the driver it replaced.
	podIPNodesOnePort
)

// newE2EClusterOf is the cluster of the end-to-end tests with more images
// on the nodes, on nodes of the kind given.
func newE2EClusterOf(t *testing.T, timeout time.Duration, images []testkube.Image, kind e2eNodes) *e2eCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("runs jobs on real kubelets; skipped with -short")
	}
	podIPs := kind != loopbackNodes
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skipf("no Kubernetes node here: %s", why)
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	dir := t.TempDir()
	driver := testkube.BuildStatic(t, "github.com/gorovod/gorovod/cmd/gorovod")
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
		Reachable:    podIPs,
		PauseRef:     e2e.PauseImage,
		Images: append(append(e2e.TrainerImages(t), images...),
			// The driver writes its workers' environment under /tmp.
			testkube.Image{Ref: driverImage, Files: map[string]string{"usr/local/bin/gorovod": driver, "etc/gorovod/pod.yaml": template, "tmp/pod.yaml": template},
				Entrypoint: []string{"/usr/local/bin/gorovod"}}),
	}
	nodes := []*testkube.Node{cp.NewNode(t, nodeCfg), cp.NewNode(t, nodeCfg)}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	adminDyn := e2e.InstallGorovod(ctx, t, cp)
	const ns = "e2e-jobs"
	admin := cp.AdminClient(ctx, t, ns)
	if err := cp.WaitForServiceAccount(ctx, admin, "gorovod-system"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		e2e.AdvertiseSlots(ctx, t, admin, n.Name, 2)
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
	e := &e2eCluster{ctx: ctx, nodes: nodes, admin: admin, ns: ns, schedKubeconfig: cp.Kubeconfig(tok.Status.Token)}
	e.drivers = e2eDriverPlacement{APIHost: apiHost, APIPort: apiPort}
	e.drivers.GossipPortEach = kind == podIPNodes
	if kind == podIPNodesOnePort {
		ports, err := testdaemon.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		e.drivers.GossipPort = strconv.Itoa(ports[0])
	}
	for _, n := range nodes {
		e.drivers.Nodes = append(e.drivers.Nodes, n.Name)
	}
	customize := e.drivers.customizer(func() string {
		e.driverNodeMu.Lock()
		defer e.driverNodeMu.Unlock()
		if e.driverNode != nil {
			return e.driverNode.Name
		}
		return ""
	})
	e.startScheduler = func(identity string) *e2eScheduler {
		kc, err := kubernetes.NewForConfig(schedCfg)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := dynamic.NewForConfig(schedCfg)
		if err != nil {
			t.Fatal(err)
		}
		s := &e2eScheduler{done: make(chan error, 1)}
		cfg := e2eServiceConfig(identity, customize)
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
	e.stopScheduler = func(s *e2eScheduler) {
		s.cancel()
		if err := <-s.done; err != nil {
			t.Errorf("the scheduler: %v", err)
		}
	}

	// The allocations as they change.
	hist := &allocationHistory{sizes: map[string][]int{}, nodes: map[string]map[string]bool{}, allocs: map[string][][]string{}, spans: map[string][]allocationSpan{}, jobs: map[string]*api.GorovodJob{}, ended: map[string]time.Time{}}
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
	t.Cleanup(func() {
		stopWatch()
		<-watchDone
	})

	// Each job's workers' lines, from the CRI logs of both nodes.
	followCtx, stopFollow := context.WithCancel(ctx)
	var following sync.WaitGroup
	e.stopFollowing = func() {
		stopFollow()
		following.Wait()
	}
	t.Cleanup(e.stopFollowing)
	follow := func(j *e2eJob) {
		j.h = &e2e.RunJobHarness{Cmd: &exec.Cmd{}, Pids: map[int]int{}, Notify: make(chan struct{}, 1), Exited: make(chan error, 1)}
		for _, n := range nodes {
			logs := &e2e.PodLogs{Dir: n.LogDir, Job: j.name, Read: map[string]int64{}, Partial: map[string]string{}}
			following.Go(func() {
				logs.Follow(followCtx, j.h)
				logs.Poll(j.h) // the lines written last
			})
		}
	}
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(cp.AdminToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	e.submit = func(j *e2eJob) {
		t.Helper()
		manifest := filepath.Join(dir, j.name+".yaml")
		// 2 ms a sample, 24 a step: 48 ms a step at 1 worker.
		image, batch := e2e.TrainerImage, 24
		command := fmt.Sprintf(`[/bin/synthetic, --steps, "%d", --json, --samples, "%d", --batch, "24", --model-size, "20000", --compute, 2ms`, j.steps, j.samples)
		if j.fashionMNIST {
			image, batch = fashionMNISTImage, 64
			command = `[/bin/fashion-mnist, --json, --log-every, "0", --batch-size, "64"`
		}
		for _, a := range j.trainer {
			command += fmt.Sprintf(", %q", a)
		}
		command += "]"
		minWorkers, maxWorkers := cmp.Or(j.minWorkers, 1), cmp.Or(j.maxWorkers, 4)
		// The workers bind loopback where the pods have no IP (the nodes
		// have no address: loopbackNodes); else they take cluster/kube's
		// default, their pod IP.
		env := `
  env:
  - {name: GOROVOD_LISTEN_ADDR, value: "127.0.0.1:0"}
  - {name: GOROVOD_GOSSIP_ADDR, value: 127.0.0.1}`
		if podIPs {
			env = ""
		}
		if err := os.WriteFile(manifest, fmt.Appendf(nil, `apiVersion: gorovod.io/v1alpha1
kind: GorovodJob
metadata:
  name: %s
spec:
  image: %s
  driverImage: %s
  command: %s%s
  minWorkers: %d
  maxWorkers: %d
  batch: {initial: %d}
%s
`, j.name, image, driverImage, command, env, minWorkers, maxWorkers, batch, j.spec), 0o600); err != nil {
			t.Fatal(err)
		}
		follow(j)
		args := append([]string{"submit", "--kubeconfig", kubeconfig, "--namespace", ns}, j.submitArgs...)
		out, err := exec.CommandContext(ctx, e2e.Binary, append(args, manifest)...).CombinedOutput()
		if err != nil {
			t.Fatalf("gorovod submit %s: %v: %s", j.name, err, out)
		}
		j.submitted = time.Now()
	}
	e.trained = func(j *e2eJob, steps int64) {
		t.Helper()
		j.h.WaitFor(t, fmt.Sprintf("%s past step %d", j.name, steps), 4*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) > steps })
	}
	e.jobs, e.hist = jobs, hist
	return e
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
// The nodes have addresses of their own (newE2EClusterPodIPs), which their
// pods get as status.podIP: the jobs set no address, and while the three
// jobs train each one's workers listen at their pods' IPs and its driver's
// seed is at its pod's IP.
func TestSchedulerAndDriversOnKubelets(t *testing.T) {
	e := newE2EClusterPodIPs(t, 12*time.Minute)
	ctx, jobs, hist := e.ctx, e.jobs, e.hist
	startScheduler, stopScheduler, submit, trained := e.startScheduler, e.stopScheduler, e.submit, e.trained
	all := []*e2eJob{{name: "first", steps: 2500, samples: 1200}, {name: "second", steps: 1500, samples: 1200}, {name: "third", steps: 1000, samples: 960}}
	defer e.logFailure(t, all)

	sched := startScheduler("sched-1")
	submit(all[0])
	trained(all[0], 50)
	submit(all[1])
	trained(all[1], 50)
	submit(all[2])
	trained(all[2], 50)
	// Each job's workers are at their pods' IPs, their nodes' addresses,
	// and its driver's seed (status.adoption.seeds) at its pod's IP.
	for _, j := range all {
		gj := hist.job(j.name)
		if gj == nil || gj.Status.Phase != api.PhaseRunning {
			continue
		}
		t.Logf("%s: %s", j.name, e.workersAtPodIPs(t, j.name, false, 30*time.Second))
		var seed string
		e2e.Poll(t, j.name+"'s driver's seed at its pod IP", 30*time.Second, func() bool {
			gj := hist.job(j.name)
			pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, gj.Status.Driver, metav1.GetOptions{})
			if err != nil || gj.Status.Adoption == nil || len(gj.Status.Adoption.Seeds) == 0 {
				return false
			}
			seed = gj.Status.Adoption.Seeds[0]
			host, _, _ := strings.Cut(seed, ":")
			return pod.Status.PodIP == pod.Spec.NodeName && host == pod.Status.PodIP
		})
		t.Logf("%s's driver %s: seed %s", j.name, gj.Status.Driver, seed)
	}

	// The scheduler restarts. The new one goes on from what the old one
	// recorded: each running job keeps its driver (the same pod, not
	// restarted) and its start, and its count of reallocations goes on
	// from the recorded one. Its first rounds may move a job: its policy
	// starts a new search, which holds the recorded allocations and
	// replaces them only by a better one, while the jobs' goodput models
	// go on changing (TestRestartContinues, in cluster/kube/service,
	// shows that a new scheduler over unchanged jobs moves none).
	current := func(name string) *api.GorovodJob {
		u, err := jobs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		gj, err := api.FromUnstructured(u)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return gj
	}
	driverUID := func(gj *api.GorovodJob) types.UID {
		pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, gj.Status.Driver, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return pod.UID
	}
	stopScheduler(sched)
	before := map[string]*api.GorovodJob{}
	beforeDriver := map[string]types.UID{}
	for _, j := range all {
		if gj := current(j.name); gj.Status.Phase == api.PhaseRunning {
			before[j.name], beforeDriver[j.name] = gj, driverUID(gj)
		}
	}
	sched = startScheduler("sched-2")
	e2e.Poll(t, "the new scheduler's first round", time.Minute, func() bool { return sched.rounds.Load() >= 1 })
	for name, was := range before {
		now := current(name)
		rounds := sched.rounds.Load() // read after the job: no round of the new scheduler is missed
		if now.Status.Phase != api.PhaseRunning {
			continue // it ended meanwhile
		}
		if now.Status.Driver != was.Status.Driver || driverUID(now) != beforeDriver[name] || now.Status.DriverRestarts != was.Status.DriverRestarts ||
			!now.Status.StartTime.Equal(was.Status.StartTime) {
			t.Errorf("%s's driver %s (pod %s, %d restarts, started %v) became %s (pod %s, %d restarts, started %v) across the scheduler's restart", name,
				was.Status.Driver, beforeDriver[name], was.Status.DriverRestarts, was.Status.StartTime, now.Status.Driver, driverUID(now), now.Status.DriverRestarts, now.Status.StartTime)
		}
		moved := !slices.Equal(now.Status.Allocation, was.Status.Allocation)
		if added := int64(now.Status.Reallocations) - int64(was.Status.Reallocations); added < 0 || added > rounds || (moved && added == 0) {
			t.Errorf("%s had %d reallocations; after %d rounds of the new scheduler it has %d, with its allocation %v now %v",
				name, was.Status.Reallocations, rounds, now.Status.Reallocations, was.Status.Allocation, now.Status.Allocation)
		}
		if moved {
			t.Logf("%s's allocation %v became %v in the new scheduler's first %d rounds", name, was.Status.Allocation, now.Status.Allocation, rounds)
		}
	}

	e2e.Poll(t, "every job ended", 6*time.Minute, func() bool {
		for _, j := range all {
			if gj := hist.job(j.name); gj == nil || !gj.Status.Phase.Ended() {
				return false
			}
		}
		return true
	})
	stopScheduler(sched)
	e.stopFollowing()
	if !e.checkJobs(t, all) {
		t.Errorf("no job's allocation changed as the jobs arrived and finished")
	}
}

// TestNodeDrainedUnderScheduler drains a node, as `kubectl drain` does,
// while the scheduler runs a job with workers on it: on the cluster of
// TestSchedulerAndDriversOnKubelets, one GorovodJob (its driver pod on the
// other node) is given workers on both nodes; the node is cordoned, then
// each of its pods is evicted through the eviction API. The scheduler takes
// the cordoned node out of the job's allocation, the job's workers there
// leave gracefully (none is lost or fails), no worker pod starts on the
// node afterwards, the job trains on at the other node's size, and it
// finishes with its workers agreeing on the parameters at every step and
// training on every sample of each data epoch once. The nodes have
// addresses of their own (newE2EClusterPodIPs) and the job sets none: before
// the drain, its workers listen at their pods' IPs, and a worker on one
// node is connected to a worker on the other at that node's address.
func TestNodeDrainedUnderScheduler(t *testing.T) {
	e := newE2EClusterPodIPs(t, 8*time.Minute)
	ctx := e.ctx
	drained, kept := e.nodes[0], e.nodes[1]
	e.driverNode = kept // kubectl drain would evict a driver's pod too: the job would end with it
	j := &e2eJob{name: "drained", steps: 2500, samples: 1200}
	all := []*e2eJob{j}
	defer e.logFailure(t, all)
	sched := e.startScheduler("sched-1")
	e.submit(j)

	// Workers on both nodes: the job alone is given the 4 slots once its
	// model has been measured.
	workerPods := func(node string) []corev1.Pod {
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + j.name + "," + kube.LabelRole + "=" + kube.RoleWorker,
			FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	e2e.Poll(t, "the job training with workers on both nodes", 4*time.Minute, func() bool {
		gj := e.hist.job(j.name)
		if gj == nil || gj.Status.Phase != api.PhaseRunning || !slices.Contains(gj.Status.Allocation, drained.Name) ||
			!slices.Contains(gj.Status.Allocation, kept.Name) || int(gj.Status.WorldSize) != len(gj.Status.Allocation) {
			return false
		}
		return slices.ContainsFunc(workerPods(drained.Name), func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	})
	e.trained(j, j.h.Step()+20)
	t.Logf("before the drain: %s", e.workersAtPodIPs(t, j.name, true, 30*time.Second))

	// kubectl drain: cordon, then evict every pod of the node.
	at := j.h.Step()
	t0 := time.Now()
	if _, err := e.admin.CoreV1().Nodes().Patch(ctx, drained.Name, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var evicted []string
	for _, p := range workerPods(drained.Name) {
		err := e.admin.CoreV1().Pods(e.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: e.ns}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("evicting %s: %v", p.Name, err)
		}
		evicted = append(evicted, p.Name)
	}
	e2e.Poll(t, "the drained node's pods gone", 2*time.Minute, func() bool { return len(workerPods(drained.Name)) == 0 })
	t.Logf("drained %s at step %d (pods %v): its pods gone %v later", drained.Name, at, evicted, time.Since(t0).Round(time.Millisecond))
	e2e.Poll(t, "the scheduler moving the job off the cordoned node", time.Minute, func() bool {
		gj := e.hist.job(j.name)
		return !slices.Contains(gj.Status.Allocation, drained.Name)
	})
	// The job trains on at the kept node's workers only, with no new pod
	// on the drained node.
	after := j.h.Step()
	e.trained(j, after+100)
	if ps := workerPods(drained.Name); len(ps) != 0 {
		t.Errorf("worker pods on the drained node after the drain: %v", ps)
	}
	j.h.Mu.Lock()
	for _, l := range j.h.Lines {
		if l.Step > after && l.Size > 2 {
			t.Errorf("step %d trained by %d workers after the drain: the kept node has 2 slots", l.Step, l.Size)
			break
		}
	}
	j.h.Mu.Unlock()

	e2e.Poll(t, "the job ended", 5*time.Minute, func() bool {
		gj := e.hist.job(j.name)
		return gj != nil && gj.Status.Phase.Ended()
	})
	e.stopScheduler(sched)
	e.stopFollowing()
	e.checkJobs(t, all)
	logs := e.driverLogs(j.name)[kept.Name]
	if !regexp.MustCompile(`\d+ workers finished, 0 lost, 0 failed`).Match(logs) {
		t.Errorf("not every worker finished or left by itself; the driver's log ends:\n%s", logs[max(0, len(logs)-4<<10):])
	}
}

// TestNodeSelectorUnderScheduler pins jobs to nodes with spec.nodeSelector,
// on the cluster of TestSchedulerAndDriversOnKubelets with its two nodes
// labelled example.com/pool=a and =b: a job selecting pool b (submitted
// with `gorovod submit`) is allocated only b's node, its worker pods and its
// driver pod carry the selector and run there, and it succeeds; a job
// selecting pool c, which no node has, stays Pending with the reason in its
// status while the cluster has free slots. The nodes have addresses of their
// own (newE2EClusterPodIPs): the pinned job's workers listen at their pods'
// IPs, b's address.
func TestNodeSelectorUnderScheduler(t *testing.T) {
	e := newE2EClusterPodIPs(t, 6*time.Minute)
	ctx := e.ctx
	other, chosen := e.nodes[0], e.nodes[1]
	for n, pool := range map[*testkube.Node]string{other: "a", chosen: "b"} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"example.com/pool":%q}}}`, pool)
		if _, err := e.admin.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No kube-scheduler here: the test binds the driver pod, which carries
	// the selector too (the kubelet of a node without the label would
	// refuse it).
	e.driverNode = chosen
	pinned := &e2eJob{name: "pinned", steps: 800, samples: 480, spec: "  nodeSelector: {example.com/pool: b}"}
	nowhere := &e2eJob{name: "nowhere", steps: 100, samples: 480, spec: "  nodeSelector: {example.com/pool: c}"}
	defer e.logFailure(t, []*e2eJob{pinned})
	sched := e.startScheduler("sched-1")
	e.submit(pinned)
	e.submit(nowhere)
	e.trained(pinned, 50)
	pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + pinned.name})
	if err != nil {
		t.Fatal(err)
	}
	workers := 0
	for _, p := range pods.Items {
		if p.Labels[kube.LabelRole] == kube.RoleWorker {
			workers++
		}
		if p.Spec.NodeName != chosen.Name || p.Spec.NodeSelector["example.com/pool"] != "b" {
			t.Errorf("pod %s on node %s with nodeSelector %v, want node %s (pool b)", p.Name, p.Spec.NodeName, p.Spec.NodeSelector, chosen.Name)
		}
	}
	if workers == 0 {
		t.Errorf("no worker pod of %s while it trains: %d pods", pinned.name, len(pods.Items))
	}
	t.Logf("%s: %s", pinned.name, e.workersAtPodIPs(t, pinned.name, false, 30*time.Second))
	e2e.Poll(t, "the pinned job ended", 4*time.Minute, func() bool {
		gj := e.hist.job(pinned.name)
		return gj != nil && gj.Status.Phase.Ended()
	})
	e.stopScheduler(sched)
	e.stopFollowing()
	e.checkJobs(t, []*e2eJob{pinned})
	e.hist.mu.Lock()
	named := slices.Sorted(maps.Keys(e.hist.nodes[pinned.name]))
	e.hist.mu.Unlock()
	if !slices.Equal(named, []string{chosen.Name}) {
		t.Errorf("%s's allocations named nodes %v, want only %s", pinned.name, named, chosen.Name)
	}
	// Two slots of the other node were free all along: nowhere waited
	// for a node that matches, not for room.
	gj := e.hist.job(nowhere.name)
	if gj == nil || gj.Status.Phase != api.PhasePending || len(gj.Status.Allocation) != 0 || !strings.Contains(gj.Status.Message, "no node matches spec.nodeSelector") {
		t.Errorf("the job no node matches: %+v, want Pending with the reason", gj)
	}
}

// TestSlotKindsUnderScheduler: one of the two real kubelets is a GPU node
// as the API server sees one — nvidia.com/gpu advertised in its status, as
// the NVIDIA device plugin would (there is no GPU here), and no
// gorovod.io/slot — and the other advertises gorovod.io/slot. A job
// submitted with --gpu (spec.resources asks for a GPU) is allocated the GPU
// node only, its worker
// pods asking for nvidia.com/gpu and running there (the kubelet admits them
// within the advertised GPUs); a job that asks for none is allocated the
// other node only. Both train to the end. The kubelet would admit either
// job's pods on the other node (it drops a request of an extended resource
// its node lacks): the scheduler alone keeps them apart.
func TestSlotKindsUnderScheduler(t *testing.T) {
	e := newE2EClusterPodIPs(t, 6*time.Minute)
	ctx := e.ctx
	gpuNode, slotNode := e.nodes[0], e.nodes[1]
	if _, err := e.admin.CoreV1().Nodes().Patch(ctx, gpuNode.Name, types.MergePatchType,
		[]byte(`{"status":{"capacity":{"gorovod.io/slot":null,"nvidia.com/gpu":"2"}}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	e2e.Poll(t, "the GPU node's GPUs allocatable, its slots gone", time.Minute, func() bool {
		n, err := e.admin.CoreV1().Nodes().Get(ctx, gpuNode.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		gpus := n.Status.Allocatable[service.GPUResource]
		_, slots := n.Status.Allocatable[service.SlotResource]
		return gpus.Value() == 2 && !slots && service.KindOf(n) == service.GPUSlots
	})
	gpu := &e2eJob{name: "gpu", steps: 600, samples: 480, submitArgs: []string{"--gpu"}}
	cpu := &e2eJob{name: "cpu", steps: 600, samples: 480}
	all := []*e2eJob{gpu, cpu}
	defer e.logFailure(t, all)
	sched := e.startScheduler("sched-1")
	e.submit(gpu)
	e.submit(cpu)
	for _, j := range all {
		e.trained(j, 50)
	}
	for _, tc := range []struct {
		job  *e2eJob
		node string
		asks corev1.ResourceName
	}{{gpu, gpuNode.Name, service.GPUResource}, {cpu, slotNode.Name, service.SlotResource}} {
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + tc.job.name + "," + kube.LabelRole + "=" + kube.RoleWorker})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			t.Errorf("no worker pod of %s while it trains", tc.job.name)
		}
		for _, p := range pods.Items {
			limits := p.Spec.Containers[0].Resources.Limits
			if q := limits[tc.asks]; p.Spec.NodeName != tc.node || q.Value() != 1 {
				t.Errorf("%s's worker pod %s on node %s asks for %v, want node %s and one %s", tc.job.name, p.Name, p.Spec.NodeName, limits, tc.node, tc.asks)
			}
		}
	}
	e2e.Poll(t, "both jobs ended", 4*time.Minute, func() bool {
		for _, j := range all {
			if gj := e.hist.job(j.name); gj == nil || !gj.Status.Phase.Ended() {
				return false
			}
		}
		return true
	})
	e.stopScheduler(sched)
	e.stopFollowing()
	e.checkJobs(t, all)
	for _, tc := range []struct {
		job  *e2eJob
		node string
	}{{gpu, gpuNode.Name}, {cpu, slotNode.Name}} {
		e.hist.mu.Lock()
		named := slices.Sorted(maps.Keys(e.hist.nodes[tc.job.name]))
		e.hist.mu.Unlock()
		if !slices.Equal(named, []string{tc.node}) {
			t.Errorf("%s's allocations named nodes %v, want only %s", tc.job.name, named, tc.node)
		}
	}
}

// TestNodePreferenceUnderScheduler: on the cluster of
// TestNodeSelectorUnderScheduler, with both nodes in pool a, a job that may
// use pools a and b (spec.requiredNodeAffinity) and has no preference gets
// its first workers on one node (the policy's choice between equal nodes),
// where their pods run; it is deleted, the other node is relabelled to pool
// b, and the scheduler is restarted, so that its policy starts from the
// same state. The same job submitted again with `gorovod submit
// --prefer-node example.com/pool=b:50` (spec.preferredNodeAffinity) gets
// its first workers on the other node, and is allocated b's node first and
// while its allocation fits there (2 slots): the preference decides (without
// it, the job lands where it did the first time).
// Its worker pods carry the preference. Midway both nodes are relabelled to
// pool c, which the job's required affinity excludes: as for a running Pod
// (IgnoredDuringExecution), the job keeps its minimum (1 worker) on a node
// it holds, with a message saying so, trains on and succeeds. The nodes
// have addresses of their own (newE2EClusterPodIPs): the preferring job's
// workers listen at their pods' IPs.
func TestNodePreferenceUnderScheduler(t *testing.T) {
	e := newE2EClusterPodIPs(t, 6*time.Minute)
	ctx := e.ctx
	label := func(n *testkube.Node, pool string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{"example.com/pool":%q}}}`, pool)
		if _, err := e.admin.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	workerPods := func(job string) []corev1.Pod {
		t.Helper()
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job + "," + kube.LabelRole + "=" + kube.RoleWorker})
		if err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	// firstWorkerRuns waits for the job's first allocation and a worker
	// pod of it running on the allocation's first node, and returns that
	// node.
	firstWorkerRuns := func(job string) *testkube.Node {
		t.Helper()
		var node string
		e2e.Poll(t, job+"'s first worker running where it was allocated", 2*time.Minute, func() bool {
			e.hist.mu.Lock()
			allocs := e.hist.allocs[job]
			e.hist.mu.Unlock()
			if len(allocs) == 0 {
				return false
			}
			node = allocs[0][0]
			return slices.ContainsFunc(workerPods(job), func(p corev1.Pod) bool {
				return p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning
			})
		})
		for _, n := range e.nodes {
			if n.Name == node {
				return n
			}
		}
		t.Fatalf("%s was allocated node %s, not one of the test's", job, node)
		return nil
	}
	const required = `  requiredNodeAffinity:
    nodeSelectorTerms: [{matchExpressions: [{key: example.com/pool, operator: In, values: [a, b]}]}]`
	label(e.nodes[0], "a")
	label(e.nodes[1], "a")
	sched := e.startScheduler("sched-1")
	indifferent := &e2eJob{name: "indifferent", steps: 1200, samples: 480, spec: required}
	defer e.logFailure(t, []*e2eJob{indifferent})
	e.submit(indifferent)
	other := firstWorkerRuns(indifferent.name)
	chosen := e.nodes[0]
	if chosen == other {
		chosen = e.nodes[1]
	}
	// Free its slot before the same job comes with the preference, so
	// that both nodes are equal again but for the preference.
	if err := e.jobs.Delete(ctx, indifferent.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Poll(t, indifferent.name+"'s pods gone", 2*time.Minute, func() bool { return len(workerPods(indifferent.name)) == 0 })
	// A new scheduler: its policy starts afresh (Pollux's search from its
	// seed), as the first one did, so that the same job on the same free
	// nodes would be placed as before; the preference is what differs.
	e.stopScheduler(sched)
	label(chosen, "b")
	e.driverNode = chosen
	sched = e.startScheduler("sched-2")
	j := &e2eJob{name: "preferring", steps: 1200, samples: 480, spec: required, submitArgs: []string{"--prefer-node", "example.com/pool=b:50"}}
	defer e.logFailure(t, []*e2eJob{j})
	e.submit(j)
	first := firstWorkerRuns(j.name)
	t.Logf("the job's first workers ran on %s without the preference, on %s with it (b: %s)", other.Name, first.Name, chosen.Name)
	if first != chosen {
		t.Errorf("with the preference for %s, %s's first workers ran on %s, where they ran without the preference", chosen.Name, j.name, first.Name)
	}
	e.trained(j, 50)
	t.Logf("%s: %s", j.name, e.workersAtPodIPs(t, j.name, false, 30*time.Second))
	for _, p := range workerPods(j.name) {
		if a := p.Spec.Affinity; a == nil || a.NodeAffinity == nil || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Errorf("worker pod %s has affinity %+v, want the job's preference", p.Name, p.Spec.Affinity)
		}
	}
	// Relabel both nodes out of the job's required affinity.
	e.hist.mu.Lock()
	placed := len(e.hist.allocs[j.name]) // the allocations placed by the preference
	e.hist.mu.Unlock()
	label(other, "c")
	label(chosen, "c")
	e2e.Poll(t, "the job kept its minimum on its nodes", time.Minute, func() bool {
		gj := e.hist.job(j.name)
		return gj != nil && len(gj.Status.Allocation) == 1 && strings.Contains(gj.Status.Message, "no node matches spec.nodeSelector and spec.requiredNodeAffinity any more")
	})
	e2e.Poll(t, "the job ended", 4*time.Minute, func() bool {
		gj := e.hist.job(j.name)
		return gj != nil && gj.Status.Phase.Ended()
	})
	e.stopScheduler(sched)
	e.stopFollowing()
	e.checkJobs(t, []*e2eJob{j})
	e.hist.mu.Lock()
	allocs := slices.Clone(e.hist.allocs[j.name])
	e.hist.mu.Unlock()
	t.Logf("%s's allocations: %v", j.name, allocs)
	for _, a := range allocs[:placed] {
		if len(a) <= 2 && slices.ContainsFunc(a, func(n string) bool { return n != chosen.Name }) {
			t.Errorf("allocation %v: %d workers, which the preferred node %s holds, placed elsewhere", a, len(a), chosen.Name)
		}
	}
}

// TestMaxWorkersPerNodeUnderScheduler spreads a job's workers with
// spec.maxWorkersPerNode, on the cluster of TestSchedulerAndDriversOnKubelets
// (2 nodes of 2 slots): a job of 1 to 4 workers submitted with `gorovod
// submit --max-workers-per-node 1` is allocated at most one slot a node, so
// it grows to 2 workers, one on each node's kubelet (its pods' nodes as the
// API server reports them), trains at no world larger than 2, and succeeds.
// Then, its pods gone, the same job without the cap grows past one worker a
// node (two worker pods running on one node, a world of more than 2): the
// cap, not the job or the cluster, is what held the first to 2. The nodes
// have addresses of their own (newE2EClusterPodIPs): the capped job's two
// workers, one a node, listen at their pods' IPs and one is connected to
// the other at the other node's address.
func TestMaxWorkersPerNodeUnderScheduler(t *testing.T) {
	e := newE2EClusterPodIPs(t, 10*time.Minute)
	ctx := e.ctx
	capped := &e2eJob{name: "capped", steps: 1500, samples: 480, submitArgs: []string{"--max-workers-per-node", "1"}}
	uncapped := &e2eJob{name: "uncapped", steps: 2000, samples: 480}
	all := []*e2eJob{capped, uncapped}
	defer e.logFailure(t, all)

	// The jobs' worker pods as the API server reports them, sampled while
	// the test runs: the most live ones (not ended, not being deleted: a
	// leaving worker's pod is no worker of the node any more) on one node
	// at once, and the nodes they ran on.
	var spread struct {
		sync.Mutex
		most  map[string]int             // job → most live worker pods on one node
		nodes map[string]map[string]bool // job → nodes of its running worker pods
	}
	spread.most, spread.nodes = map[string]int{}, map[string]map[string]bool{}
	livePods := func(job string) (map[string]int, map[string]int) {
		t.Helper()
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job + "," + kube.LabelRole + "=" + kube.RoleWorker})
		if err != nil {
			return nil, nil
		}
		live, running := map[string]int{}, map[string]int{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			live[p.Spec.NodeName]++
			if p.Status.Phase == corev1.PodRunning {
				running[p.Spec.NodeName]++
			}
		}
		return live, running
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			for _, j := range all {
				live, running := livePods(j.name)
				spread.Lock()
				for n, k := range live {
					spread.most[j.name] = max(spread.most[j.name], k)
					if running[n] > 0 {
						if spread.nodes[j.name] == nil {
							spread.nodes[j.name] = map[string]bool{}
						}
						spread.nodes[j.name][n] = true
					}
				}
				spread.Unlock()
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-time.After(200 * time.Millisecond): // polling the API server, as kubectl get -w's fallback does
			}
		}
	})
	stopSpread := func() {
		stopSampling()
		sampling.Wait()
	}
	t.Cleanup(stopSpread)
	// grown waits for the job to train at more than `beyond` workers, as
	// many as its allocation, with its worker pods running.
	grown := func(j *e2eJob, beyond int, more func(running map[string]int) bool) {
		t.Helper()
		e2e.Poll(t, fmt.Sprintf("%s training at more than %d workers", j.name, beyond), 4*time.Minute, func() bool {
			gj := e.hist.job(j.name)
			if gj == nil || gj.Status.Phase != api.PhaseRunning || len(gj.Status.Allocation) <= beyond || int(gj.Status.WorldSize) != len(gj.Status.Allocation) {
				return false
			}
			_, running := livePods(j.name)
			return more(running)
		})
	}
	ended := func(j *e2eJob) {
		t.Helper()
		e2e.Poll(t, j.name+" ended", 5*time.Minute, func() bool {
			gj := e.hist.job(j.name)
			return gj != nil && gj.Status.Phase.Ended()
		})
	}

	sched := e.startScheduler("sched-1")
	e.submit(capped)
	// Alone on 4 slots, the job is given more than one worker once its
	// model has been measured; with the cap, one on each node.
	grown(capped, 1, func(running map[string]int) bool { return len(running) == len(e.nodes) })
	t.Logf("%s: %s", capped.name, e.workersAtPodIPs(t, capped.name, true, 30*time.Second))
	// It trains on at 2 to its end: the scheduler's rounds meanwhile give
	// it no more.
	ended(capped)
	e2e.Poll(t, capped.name+"'s worker pods gone", 2*time.Minute, func() bool {
		live, running := livePods(capped.name)
		return len(live) == 0 && len(running) == 0
	})

	e.submit(uncapped)
	grown(uncapped, len(e.nodes), func(running map[string]int) bool {
		return slices.ContainsFunc(slices.Collect(maps.Values(running)), func(k int) bool { return k > 1 })
	})
	ended(uncapped)
	e.stopScheduler(sched)
	e.stopFollowing()
	stopSpread()
	e.checkJobs(t, all)

	e.hist.mu.Lock()
	allocs := map[string][][]string{capped.name: slices.Clone(e.hist.allocs[capped.name]), uncapped.name: slices.Clone(e.hist.allocs[uncapped.name])}
	e.hist.mu.Unlock()
	worlds := map[string]int{}
	for _, j := range all {
		j.h.Mu.Lock()
		for _, l := range j.h.Lines {
			worlds[j.name] = max(worlds[j.name], l.Size)
		}
		j.h.Mu.Unlock()
	}
	spread.Lock()
	defer spread.Unlock()
	t.Logf("%s: allocations %v, at most %d live worker pods on a node, running on %v, largest world %d",
		capped.name, allocs[capped.name], spread.most[capped.name], slices.Sorted(maps.Keys(spread.nodes[capped.name])), worlds[capped.name])
	t.Logf("%s: allocations %v, at most %d live worker pods on a node, largest world %d",
		uncapped.name, allocs[uncapped.name], spread.most[uncapped.name], worlds[uncapped.name])
	for _, a := range allocs[capped.name] {
		if len(slices.Compact(slices.Sorted(slices.Values(a)))) != len(a) {
			t.Errorf("%s was allocated %v: more than one slot of a node at --max-workers-per-node 1", capped.name, a)
		}
	}
	if spread.most[capped.name] != 1 {
		t.Errorf("%s had %d live worker pods on one node at once, want 1 at --max-workers-per-node 1", capped.name, spread.most[capped.name])
	}
	if len(spread.nodes[capped.name]) != len(e.nodes) {
		t.Errorf("%s's worker pods ran on %v, want one on each of the %d nodes", capped.name, spread.nodes[capped.name], len(e.nodes))
	}
	if worlds[capped.name] != len(e.nodes) {
		t.Errorf("%s trained at worlds of up to %d workers, want up to %d (one a node)", capped.name, worlds[capped.name], len(e.nodes))
	}
	if spread.most[uncapped.name] < 2 || worlds[uncapped.name] <= len(e.nodes) {
		t.Errorf("%s, without the cap, had at most %d worker pods on a node and a world of up to %d: it did not grow past one a node",
			uncapped.name, spread.most[uncapped.name], worlds[uncapped.name])
	}
}
