package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// gorovodJobCluster is a control plane with the GorovodJob resource and a
// namespace where the driver acts as the service account gorovod-driver,
// with what the scheduler service gives it: the ClusterRole gorovod-driver of
// deploy/kubernetes/gorovod.yaml (the worker pods, their Secret and Service,
// get and watch of gorovodjobs, patch of gorovodjobs/status), bound in the
// namespace — nothing else.
type gorovodJobCluster struct {
	cp         *testkube.ControlPlane
	admin      kubernetes.Interface
	jobs       dynamic.ResourceInterface // the namespace's GorovodJobs, as admin
	ns         string
	kubeconfig string // the driver's service account's
}

func newGorovodJobCluster(ctx context.Context, t *testing.T, cp *testkube.ControlPlane, ns string) *gorovodJobCluster {
	t.Helper()
	admin := cp.AdminClient(ctx, t, ns)
	// gorovod.yaml's install (the CRD and the driver's ClusterRole among
	// it); the service account gorovod-driver and its binding to the
	// ClusterRole, as the scheduler service makes them in a job's namespace.
	dyn := e2e.InstallGorovod(ctx, t, cp)
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "gorovod-driver"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gorovod-driver-gorovodjobs"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "gorovod-driver", Namespace: ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gorovod-driver"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "gorovod-driver", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(tok.Status.Token)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &gorovodJobCluster{cp: cp, admin: admin, jobs: dyn.Resource(api.GroupVersionResource()).Namespace(ns), ns: ns, kubeconfig: kubeconfig}
	// The CRD is served once a GorovodJob can be listed.
	for {
		if _, err := c.jobs.List(ctx, metav1.ListOptions{}); err == nil {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatal("the GorovodJob resource is not served")
		case <-time.After(100 * time.Millisecond): // polling the API server, as kubectl wait does
		}
	}
}

// submit creates a GorovodJob.
func (c *gorovodJobCluster) submit(ctx context.Context, t *testing.T, name string, spec api.Spec) {
	t.Helper()
	u, err := api.ToUnstructured(&api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.jobs.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// allocate writes status.allocation as the scheduler does.
func (c *gorovodJobCluster) allocate(ctx context.Context, t *testing.T, name string, nodes ...string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": api.PhaseRunning, "allocation": nodes, "driver": name + "-driver"}})
	if _, err := c.jobs.Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

func (c *gorovodJobCluster) job(ctx context.Context, t *testing.T, name string) *api.GorovodJob {
	t.Helper()
	u, err := c.jobs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gj, err := api.FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	return gj
}

// workerPods are the job's worker pods not being deleted, as node → pod
// names.
func (c *gorovodJobCluster) workerPods(ctx context.Context, t *testing.T, job string) map[string][]string {
	t.Helper()
	pods, err := c.admin.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job + "," + kube.LabelRole + "=" + kube.RoleWorker})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p.Name)
		}
	}
	return out
}

// TestGorovodJobDriverPlacement runs `gorovod run --gorovodjob` (the real
// binary, as the driver's service account with only the contract's rights)
// against a real API server whose nodes are registered through the API and
// run nothing: the test plays the scheduler (status.allocation) and the
// kubelets (it removes the pods the driver deleted). The driver creates one
// worker pod per entry of the allocation on the node named, asking for one
// gorovod.io/slot, with the spec's environment, minimum and probe timeout
// (GOROVOD_MIN_WORKERS, GOROVOD_PROBE_TIMEOUT), which status.adoption
// records; a node taken out of the allocation loses its workers;
// deleting the GorovodJob ends the driver, which deletes its pods.
func TestGorovodJobDriverPlacement(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newGorovodJobCluster(ctx, t, cp, "jobs")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if _, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.submit(ctx, t, "placed", api.Spec{Image: "gorovod.local/synthetic:test", Command: []string{"/bin/synthetic", "--steps", "100"},
		MinWorkers: 1, MaxWorkers: 4, Env: []corev1.EnvVar{{Name: "TRAINER_FLAG", Value: "x"}}, ProbeTimeout: &metav1.Duration{Duration: 3 * time.Second}})

	cmd := exec.CommandContext(ctx, e2e.Binary, "run", "--gorovodjob", "placed", "--kubeconfig", c.kubeconfig,
		"--kubernetes-namespace", c.ns, "--leave-notice", "1s", "--progress", "never")
	e2e.DumpOnCancel(cmd)
	h := e2e.StartHarness(t, cmd)
	h.WaitLog(t, "the driver waiting for an allocation", time.Minute, regexp.MustCompile(`waiting for the scheduler's allocation \(at least 1 workers\)`))
	if pods := c.workerPods(ctx, t, "placed"); len(pods) != 0 {
		t.Fatalf("worker pods before any allocation: %v", pods)
	}

	// The kubelets' part: a pod deleted is gone (no kubelet runs them).
	stopKubelets := make(chan struct{})
	kubeletsDone := make(chan struct{})
	go func() {
		defer close(kubeletsDone)
		zero := int64(0)
		for {
			pods, err := c.admin.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, p := range pods.Items {
					if p.DeletionTimestamp != nil {
						_ = c.admin.CoreV1().Pods(c.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
					}
				}
			}
			select {
			case <-stopKubelets:
				return
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() {
		close(stopKubelets)
		<-kubeletsDone
	}()

	c.allocate(ctx, t, "placed", "node-a", "node-b", "node-a")
	want := map[string]int{"node-a": 2, "node-b": 1}
	counts := func() map[string]int {
		out := map[string]int{}
		for n, ps := range c.workerPods(ctx, t, "placed") {
			out[n] = len(ps)
		}
		return out
	}
	e2e.Poll(t, "a pod per allocated worker, on its node", time.Minute, func() bool { return fmt.Sprint(counts()) == fmt.Sprint(want) })
	pods, err := c.admin.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=placed"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		tc := p.Spec.Containers[0]
		if q := tc.Resources.Limits["gorovod.io/slot"]; q.Cmp(resource.MustParse("1")) != 0 {
			t.Errorf("pod %s asks for %v, want one gorovod.io/slot", p.Name, tc.Resources.Limits)
		}
		if tc.Image != "gorovod.local/synthetic:test" || strings.Join(tc.Command, " ") != "/bin/synthetic --steps 100" {
			t.Errorf("pod %s runs %s %v", p.Name, tc.Image, tc.Command)
		}
		for _, want := range []corev1.EnvVar{{Name: "TRAINER_FLAG", Value: "x"}, {Name: envconfig.EnvMinWorkers, Value: "1"}, {Name: envconfig.EnvProbeTimeout, Value: "3s"}} {
			if !slices.ContainsFunc(tc.Env, func(e corev1.EnvVar) bool { return e.Name == want.Name && e.Value == want.Value }) {
				t.Errorf("pod %s lacks %s=%s of the spec: %v", p.Name, want.Name, want.Value, tc.Env)
			}
		}
	}
	// A replacement driver gives its workers what these were given.
	e2e.Poll(t, "status.adoption", time.Minute, func() bool { return c.job(ctx, t, "placed").Status.Adoption != nil })
	if a := c.job(ctx, t, "placed").Status.Adoption; a.MinWorkers != 1 || a.ProbeTimeout == nil || a.ProbeTimeout.Duration != 3*time.Second {
		t.Errorf("status.adoption %+v; want minWorkers 1, probeTimeout 3s", a)
	}

	// node-a leaves the allocation: its workers are stopped, node-b's stays.
	c.allocate(ctx, t, "placed", "node-b")
	e2e.Poll(t, "node-a's workers gone", time.Minute, func() bool { return fmt.Sprint(counts()) == fmt.Sprint(map[string]int{"node-b": 1}) })
	h.WaitLog(t, "the driver saying node-a left", 30*time.Second, regexp.MustCompile(`host "node-a/\d" left the job`))

	// Deleting the GorovodJob ends the driver and its pods.
	if err := c.jobs.Delete(ctx, "placed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.Exited:
		if err == nil || !strings.Contains(h.LogText(), "the gorovodjob was deleted: the job is stopped") {
			t.Fatalf("the driver after its GorovodJob's deletion: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the driver did not end after its GorovodJob's deletion:\n%s", h.LogText())
	}
	e2e.Poll(t, "the job's pods gone", time.Minute, func() bool { return len(c.workerPods(ctx, t, "placed")) == 0 })
	if _, err := c.admin.CoreV1().Services(c.ns).Get(ctx, "placed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the job's Service after the driver: %v", err)
	}
}

// TestGorovodJobOnKubelet runs a GorovodJob's driver (`gorovod run
// --gorovodjob`, the real binary, as the driver's service account) with its
// workers in pods on a real kubelet (containerd, runc, the synthetic trainer
// in an image built here). The test plays the scheduler: it allocates the
// node twice, then three times — the job grows live, its first two workers
// training on without a restart — then drains one worker through the
// eviction API as `kubectl drain` does: the worker leaves gracefully, the
// job carries on with two and starts no worker on the node while the
// allocation still names it three times; the allocation is then cut to two
// (the same two workers go on) and to one (the job shrinks live). The
// driver writes the world size, step and fitted goodput model into the
// status; the job finishes with the workers agreeing on the parameters at
// every step and every sample of each data epoch trained on once. The node
// has an address of its own and the job sets none: the workers listen at
// their pods' IP, the node's address.
func TestGorovodJobOnKubelet(t *testing.T) {
	// 2 ms a sample, 24 a step: 48 ms a step at 1 worker, 16 ms at 3; the
	// resizes take a few hundred steps, the rest at 1 worker under 2 minutes.
	const steps, samples = 3000, 1200
	const notice = 4 * time.Second
	cp, node := withKubelet(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := newGorovodJobCluster(ctx, t, cp, "gorovod-jobs")
	e2e.AdvertiseSlots(ctx, t, c.admin, node.Name, 4)

	// No scheduler and no CNI plugin here (package testkube): the pods use
	// the node's network. The node has an address of its own (127.0.0.2),
	// its pods' status.podIP, which the workers bind (the job sets no
	// address). The driver runs on this host outside any pod (no
	// GOROVOD_POD_IP) and listens on loopback, its default, where the
	// workers, on this host's network, reach it.
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
	c.submit(ctx, t, "e2e", api.Spec{Image: e2e.TrainerImage,
		Command: []string{"/bin/synthetic", "--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "24",
			"--model-size", "20000", "--compute", "2ms"},
		MinWorkers: 1, MaxWorkers: 3, Batch: api.BatchBounds{Initial: 24}})
	c.allocate(ctx, t, "e2e", node.Name, node.Name)

	runCtx, stopRun := context.WithTimeout(ctx, 7*time.Minute)
	defer stopRun()
	cmd := exec.CommandContext(runCtx, e2e.Binary, "run", "--gorovodjob", "e2e", "--kubeconfig", c.kubeconfig,
		"--kubernetes-namespace", c.ns, "--kubernetes-pod-template", template, "--json", "--progress", "never",
		"--leave-notice", notice.String())
	e2e.DumpOnCancel(cmd)
	h := e2e.StartHarness(t, cmd)
	stopLogs := followPodLogs(ctx, h, node.LogDir)
	defer stopLogs()
	h.LogTailOnFailure(t, "the driver's log")
	// membersAt are the workers that trained in a world of size after step
	// (e2e.WaitFor's conditions get the lines under the harness's lock).
	membersAt := func(lines []e2e.TrainerLine, step int64, size int) []int {
		var ws []int
		for _, l := range lines {
			if l.Step > step && l.Size == size && !slices.Contains(ws, l.Worker) {
				ws = append(ws, l.Worker)
			}
		}
		slices.Sort(ws)
		return ws
	}
	workersAt := func(step int64, size int) []int {
		h.Mu.Lock()
		defer h.Mu.Unlock()
		return membersAt(h.Lines, step, size)
	}

	h.WaitFor(t, "a world of 2", 3*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == 2 && e2e.MaxStep(l) > 20 })
	if pods := c.workerPods(ctx, t, "e2e"); len(pods[node.Name]) != 2 || len(pods) != 1 {
		t.Fatalf("worker pods %v, want 2 on %s", pods, node.Name)
	}
	t.Logf("at 2 workers: %s", e2e.WorkersAtPodIPs(ctx, t, c.admin, c.ns, "e2e", false, 30*time.Second))

	// Grow: the scheduler gives the job a third worker on the node.
	at := h.Step()
	c.allocate(ctx, t, "e2e", node.Name, node.Name, node.Name)
	h.WaitFor(t, "a world of 3", 3*time.Minute, e2e.SizeAfter(at, 3))
	h.WaitFor(t, "every member of the world of 3 training", time.Minute, func(l []e2e.TrainerLine) bool { return len(membersAt(l, at, 3)) == 3 })
	if ws := workersAt(at, 3); !slices.Contains(ws, 0) || !slices.Contains(ws, 1) {
		t.Fatalf("the world of 3 is workers %v: the first two did not train on", ws)
	}

	// Drain: worker 1's pod is evicted (a DisruptionTarget, then SIGTERM).
	at = h.Step()
	t0 := time.Now()
	if err := c.admin.CoreV1().Pods(c.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "e2e-worker-1", Namespace: c.ns}}); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "a world of 2 after the eviction", 2*time.Minute, e2e.SizeAfter(at, 2))
	h.WaitLog(t, "the driver holding the node", 30*time.Second, regexp.MustCompile(`worker pod e2e-worker-1 on node \S+ was preempted`))
	t.Logf("worker 1 evicted at step %d; the world of 2 formed %v later", at, time.Since(t0).Round(time.Millisecond))
	// It carries on at 2, with no new worker on the node, for 100 steps.
	after := h.Step()
	h.WaitFor(t, "100 steps at 2 after the eviction", 2*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) > after+100 })
	if ws := workersAt(after, 3); len(ws) != 0 {
		t.Fatalf("workers %v in a world of 3 after the eviction", ws)
	}
	if pods := c.workerPods(ctx, t, "e2e"); len(pods[node.Name]) != 2 {
		t.Fatalf("worker pods %v after the eviction, want the 2 left", pods)
	}

	// The scheduler takes the worker away (2), then another (1): the same
	// two go on, then one.
	c.allocate(ctx, t, "e2e", node.Name, node.Name)
	at = h.Step()
	c.allocate(ctx, t, "e2e", node.Name)
	h.WaitFor(t, "a world of 1", 2*time.Minute, e2e.SizeAfter(at, 1))

	// The driver's status: world size, step, a fitted goodput model.
	e2e.Poll(t, "the driver's status", time.Minute, func() bool {
		gj := c.job(ctx, t, "e2e")
		return gj.Status.WorldSize == 1 && gj.Status.Step > at && gj.Status.Goodput != nil
	})
	gj := c.job(ctx, t, "e2e")
	// The world of 3 lasts only until the eviction (a dozen steps or so):
	// whether it had enough steady steps to be measured depends on timing,
	// the worlds of 2 always do.
	if g := gj.Status.Goodput; g.MaxProfiledWorkers < 2 || g.MaxProfiledWorkers > 3 || g.Model.InitBatch != 24 || !(g.Model.Perf.AlphaC > 0 || g.Model.Perf.BetaC > 0) {
		t.Errorf("the goodput status %+v: want a model fitted at 2 or 3 workers", g)
	}
	if gj.Status.Phase != api.PhaseRunning || len(gj.Status.Allocation) != 1 {
		t.Errorf("the scheduler's status was overwritten: %+v", gj.Status)
	}

	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run --gorovodjob: %v", err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the job did not finish")
	}
	stopLogs()
	h.Mu.Lock()
	defer h.Mu.Unlock()
	if !regexp.MustCompile(`\d+ workers finished, 0 lost, 0 failed`).MatchString(h.Log.String()) {
		t.Errorf("not every worker finished or left by itself")
	}
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}
