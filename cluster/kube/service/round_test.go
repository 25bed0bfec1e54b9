package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

const testNS = "team"

// fixture is a service on client-go's fake clientsets, whose rounds read
// the fakes directly (the informers are tested against a real API server).
type fixture struct {
	t    testing.TB
	kube *kubefake.Clientset
	dyn  *dynfake.FakeDynamicClient
	s    *Service
	now  time.Time
	uids int
}

func newFixture(t testing.TB, policy string, nodes ...*corev1.Node) *fixture {
	t.Helper()
	f := &fixture{t: t, kube: kubefake.NewClientset(),
		dyn: dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{api.GroupVersionResource(): api.ListKind}),
		now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	for _, n := range nodes {
		f.addNode(n)
	}
	f.s = f.newService("replica-a", policy)
	return f
}

func (f *fixture) newService(identity, policy string) *Service {
	f.t.Helper()
	cfg := DefaultConfig()
	cfg.Identity, cfg.Policy = identity, policy
	cfg.Now = func() time.Time { return f.now }
	s, err := New(cfg, f.kube, f.dyn)
	if err != nil {
		f.t.Fatal(err)
	}
	s.beginTerm(nil)
	return s
}

// clientSource reads the fakes.
type clientSource struct{ f *fixture }

func (c clientSource) Jobs() ([]*unstructured.Unstructured, error) {
	l, err := c.f.dyn.Resource(api.GroupVersionResource()).Namespace("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

func (c clientSource) Nodes() ([]*corev1.Node, error) {
	l, err := c.f.kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Node, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

func (c clientSource) Pods() ([]*corev1.Pod, error) {
	l, err := c.f.kube.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*corev1.Pod
	for i := range l.Items {
		if p := &l.Items[i]; p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, p)
		}
	}
	return out, nil
}

func (c clientSource) DriverPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	p, err := c.f.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return p, err
}

// round runs a round a minute after the last one.
func (f *fixture) round() {
	f.t.Helper()
	f.now = f.now.Add(time.Minute)
	if err := f.s.round(context.Background(), clientSource{f}); err != nil {
		f.t.Fatalf("round: %v", err)
	}
}

// labelNode is a Ready node whose slots come from its label.
func labelNode(name string, slots int) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{SlotsLabel: fmt.Sprint(slots)}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

func (f *fixture) addNode(n *corev1.Node) {
	f.t.Helper()
	if _, err := f.kube.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) editNode(name string, edit func(*corev1.Node)) {
	f.t.Helper()
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	edit(n)
	if _, err := f.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func spec(minW, maxW, prio int32) api.Spec {
	return api.Spec{Image: "gorovod-examples:test", Command: []string{"synthetic"}, MinWorkers: minW, MaxWorkers: maxW, Priority: prio}
}

// gpuSpec is spec with a GPU for each worker: a job for GPU nodes.
func gpuSpec(minW, maxW, prio int32) api.Spec {
	s := spec(minW, maxW, prio)
	s.Resources.Limits = corev1.ResourceList{GPUResource: resource.MustParse("1")}
	return s
}

// submit creates a job now, as the API server would (UID, generation, time).
func (f *fixture) submit(name string, s api.Spec) {
	f.t.Helper()
	f.uids++
	j := &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Generation: 1,
		UID: types.UID(fmt.Sprintf("uid-%d", f.uids)), CreationTimestamp: metav1.NewTime(f.now)}, Spec: s}
	u, err := api.ToUnstructured(j)
	if err != nil {
		f.t.Fatal(err)
	}
	f.create(u)
}

func (f *fixture) create(u *unstructured.Unstructured) {
	f.t.Helper()
	if _, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) job(name string) *api.GorovodJob {
	f.t.Helper()
	u, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	j, err := api.FromUnstructured(u)
	if err != nil {
		f.t.Fatal(err)
	}
	return j
}

// endDriver makes a job's driver pod end with an exit status, as its kubelet
// would report it.
func (f *fixture) endDriver(job string, exit int32) {
	f.t.Helper()
	p, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), DriverPodName(job), metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p.Status.Phase = corev1.PodSucceeded
	if exit != 0 {
		p.Status.Phase = corev1.PodFailed
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: DriverContainer,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error", Message: "loss is NaN"}}}}
	if _, err := f.kube.CoreV1().Pods(testNS).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// reportGoodput acts as a job's driver: a fitted model, measured at up to
// profiled workers.
func (f *fixture) reportGoodput(job string, profiled int32) {
	f.t.Helper()
	j := f.job(job)
	j.Status.Goodput = &api.GoodputStatus{Model: goodput.Model{Perf: goodput.PerfParams{AlphaC: 0.05, BetaC: 0.01, AlphaN: 0.05, BetaN: 0.02, Gamma: 1.5},
		Grad: goodput.GradParams{Sqr: 1, Var: 10}, InitBatch: 64}, MaxProfiledWorkers: profiled, FittedAt: metav1.NewTime(f.now)}
	u, err := api.ToUnstructured(j)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// checkFits fails the test where a node holds more workers than its slots,
// or a running job is outside its bounds.
func (f *fixture) checkFits(jobs ...string) {
	f.t.Helper()
	nodes, _ := clientSource{f}.Nodes()
	used := map[string]int{}
	for _, name := range jobs {
		j := f.job(name)
		for _, n := range j.Status.Allocation {
			used[n]++
		}
		if k := int32(len(j.Status.Allocation)); j.Status.Phase == api.PhaseRunning && k > 0 &&
			(k < j.Spec.MinWorkers || (j.Spec.MaxWorkers > 0 && k > j.Spec.MaxWorkers)) {
			f.t.Errorf("%s has %d workers, outside [%d, %d]", name, k, j.Spec.MinWorkers, j.Spec.MaxWorkers)
		}
	}
	slots := map[string]int{}
	for _, n := range nodes {
		slots[n.Name] = NodeSlots(n)
	}
	for n, k := range used {
		if k > slots[n] {
			f.t.Errorf("node %s holds %d workers, has %d slots", n, k, slots[n])
		}
	}
}

func TestJobsArriveAndEnd(t *testing.T) {
	f := newFixture(t, "pollux", labelNode("n1", 2), labelNode("n2", 2))
	f.submit("a", spec(1, 4, 0))
	f.round()
	a := f.job("a")
	if a.Status.Phase != api.PhaseRunning || len(a.Status.Allocation) < 1 || a.Status.Driver != "a-driver" ||
		a.Status.StartTime == nil || a.Status.SubmitTime == nil || a.Status.ScheduledBy != "replica-a" || a.Status.ObservedGeneration != 1 {
		t.Fatalf("a after its first round: %+v", a.Status)
	}
	// The driver pod, as the driver and the garbage collector need it.
	pod, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), "a-driver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.ValueFrom.FieldRef.FieldPath
	}
	if c.Name != "driver" || c.Image != "gorovod-examples:test" || !slices.Equal(c.Command, []string{"gorovod", "run", "--gorovodjob=a"}) ||
		pod.Spec.ServiceAccountName != "gorovod-driver" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != a.UID || pod.OwnerReferences[0].Kind != "GorovodJob" ||
		env["GOROVOD_POD_NAME"] != "metadata.name" || env["GOROVOD_POD_NAMESPACE"] != "metadata.namespace" ||
		env["GOROVOD_POD_UID"] != "metadata.uid" || env["GOROVOD_POD_IP"] != "status.podIP" || pod.Labels[kube.LabelRole] != "driver" {
		t.Fatalf("driver pod: %+v", pod)
	}
	if _, err := f.kube.CoreV1().ServiceAccounts(testNS).Get(context.Background(), DriverServiceAccount, metav1.GetOptions{}); err != nil {
		t.Fatalf("the driver's service account: %v", err)
	}
	rb, err := f.kube.RbacV1().RoleBindings(testNS).Get(context.Background(), DriverRoleBinding, metav1.GetOptions{})
	if err != nil || rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != DriverClusterRole || rb.Subjects[0].Name != DriverServiceAccount {
		t.Fatalf("the driver's role binding: %+v, %v", rb, err)
	}
	// Its disruption budget: no eviction of the driver pod, owned by the job.
	pdb, err := f.kube.PolicyV1().PodDisruptionBudgets(testNS).Get(context.Background(), DriverBudgetName("a"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the driver's disruption budget: %v", err)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 ||
		pdb.Spec.MaxUnavailable != nil || len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].UID != a.UID {
		t.Fatalf("the driver's disruption budget: %+v (selector %v)", pdb, err)
	}
	// Another job's worker pods are not under it.
	if sel.Matches(labels.Set{kube.LabelJob: "a", kube.LabelRole: kube.RoleWorker}) || sel.Matches(labels.Set{kube.LabelJob: "b", kube.LabelRole: RoleDriver}) {
		t.Fatalf("the driver's disruption budget selects more than the driver: %v", sel)
	}

	// The driver measures a scaling job: Pollux may give it the cluster.
	f.reportGoodput("a", 2)
	f.round()
	f.checkFits("a")
	// b arrives: it is admitted, and a shrinks for it.
	f.submit("b", spec(2, 4, 0))
	f.round()
	a, b := f.job("a"), f.job("b")
	if b.Status.Phase != api.PhaseRunning || len(b.Status.Allocation) < 2 || len(a.Status.Allocation)+len(b.Status.Allocation) > 4 {
		t.Fatalf("after b arrived: a %v, b %+v", a.Status.Allocation, b.Status)
	}
	f.checkFits("a", "b")
	// c needs 2: it waits while a and b hold their minimums (1 and 2).
	f.submit("c", spec(2, 0, 0))
	f.round()
	if c := f.job("c"); c.Status.Phase != api.PhasePending || c.Status.Allocation != nil || !strings.Contains(c.Status.Message, "waiting for 2") {
		t.Fatalf("c: %+v", c.Status)
	}
	if _, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), "c-driver", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a waiting job has a driver pod: %v", err)
	}
	// a's driver exits 0: a has succeeded, and its slots go to c in the same round.
	f.endDriver("a", 0)
	f.round()
	a, b, cj := f.job("a"), f.job("b"), f.job("c")
	if a.Status.Phase != api.PhaseSucceeded || a.Status.Allocation != nil || a.Status.CompletionTime == nil {
		t.Fatalf("a after its driver exited 0: %+v", a.Status)
	}
	if cj.Status.Phase != api.PhaseRunning || len(cj.Status.Allocation) < 2 {
		t.Fatalf("c after a ended: %+v (b %v)", cj.Status, b.Status.Allocation)
	}
	f.checkFits("b", "c")
	// b's driver fails: b has failed, with the reason.
	f.endDriver("b", 3)
	f.round()
	b = f.job("b")
	if b.Status.Phase != api.PhaseFailed || b.Status.Allocation != nil || !strings.Contains(b.Status.Message, "exited with status 3: Error: loss is NaN") {
		t.Fatalf("b after its driver failed: %+v", b.Status)
	}
	// A deleted driver pod ends its job too.
	if err := f.kube.CoreV1().Pods(testNS).Delete(context.Background(), "c-driver", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.round()
	if c := f.job("c"); c.Status.Phase != api.PhaseFailed || !strings.Contains(c.Status.Message, "c-driver was deleted") {
		t.Fatalf("c after its driver pod was deleted: %+v", c.Status)
	}
	if a := f.job("a"); a.Status.AttainedWorkerSeconds < 60 {
		t.Errorf("a held workers for minutes, attained %d worker-seconds", a.Status.AttainedWorkerSeconds)
	}
}

// TestNodeLeaves: a node cordoned, not Ready, without slots or deleted has
// its workers taken away in the next round.
func TestNodeLeaves(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(f *fixture, node string)
	}{
		{"cordoned", func(f *fixture, n string) { f.editNode(n, func(n *corev1.Node) { n.Spec.Unschedulable = true }) }},
		{"not ready", func(f *fixture, n string) {
			f.editNode(n, func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
		}},
		{"label removed", func(f *fixture, n string) { f.editNode(n, func(n *corev1.Node) { delete(n.Labels, SlotsLabel) }) }},
		{"deleted", func(f *fixture, n string) {
			if err := f.kube.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil {
				f.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "pollux", labelNode("n1", 2), labelNode("n2", 2), labelNode("n3", 2))
			f.submit("a", spec(1, 2, 0))
			f.submit("b", spec(2, 2, 0))
			f.round()
			a := f.job("a")
			if len(a.Status.Allocation) == 0 {
				t.Fatalf("a: %+v", a.Status)
			}
			gone := a.Status.Allocation[0]
			before := f.job("b").Status.Allocation
			tc.leave(f, gone)
			f.round()
			for _, name := range []string{"a", "b"} {
				j := f.job(name)
				if j.Status.Phase != api.PhaseRunning || int32(len(j.Status.Allocation)) < j.Spec.MinWorkers || slices.Contains(j.Status.Allocation, gone) {
					t.Errorf("%s after %s left: %+v", name, gone, j.Status)
				}
			}
			if b := f.job("b"); !slices.Contains(before, gone) && !slices.Equal(b.Status.Allocation, before) {
				t.Errorf("b was moved (%v → %v) though its nodes stayed", before, b.Status.Allocation)
			}
			if a := f.job("a"); a.Status.Reallocations != 1 {
				t.Errorf("a's reallocations: %d, want 1", a.Status.Reallocations)
			}
			f.checkFits("a", "b")
		})
	}
}

// TestAdmission: a job starts only with its minimum; waiting jobs are
// admitted by priority, then by submission.
func TestAdmission(t *testing.T) {
	for _, policy := range Policies {
		t.Run(policy, func(t *testing.T) {
			f := newFixture(t, policy, labelNode("n1", 2), labelNode("n2", 2))
			f.submit("running", spec(2, 2, 0))
			f.round()
			f.submit("huge", spec(5, 0, 9)) // never fits 4 slots
			f.submit("low", spec(2, 2, 0))
			f.now = f.now.Add(time.Second)
			f.submit("high", spec(2, 2, 5))
			f.submit("later", spec(2, 2, 0))
			f.round()
			want := map[string]api.Phase{"running": api.PhaseRunning, "huge": api.PhasePending, "high": api.PhaseRunning, "low": api.PhasePending, "later": api.PhasePending}
			for name, phase := range want {
				if j := f.job(name); j.Status.Phase != phase {
					t.Errorf("%s: %s (%v, %q), want %s", name, j.Status.Phase, j.Status.Allocation, j.Status.Message, phase)
				}
			}
			f.checkFits("running", "huge", "low", "high", "later")
			// high ends: low, submitted before later, goes next.
			f.endDriver("high", 0)
			f.round()
			if low, later := f.job("low"), f.job("later"); low.Status.Phase != api.PhaseRunning || later.Status.Phase != api.PhasePending {
				t.Errorf("after high ended: low %s, later %s", low.Status.Phase, later.Status.Phase)
			}
		})
	}
}

// TestRestartContinues: a new scheduler (a restart, or another replica)
// continues from the recorded allocations: it writes nothing where nothing
// changed, and reallocates nothing.
func TestRestartContinues(t *testing.T) {
	f := newFixture(t, "pollux", labelNode("n1", 2), labelNode("n2", 2))
	f.submit("a", spec(1, 2, 0))
	f.submit("b", spec(1, 2, 0))
	f.round()
	f.reportGoodput("a", 2)
	f.reportGoodput("b", 2)
	for range 3 {
		f.round()
	}
	before := map[string]api.Status{"a": f.job("a").Status, "b": f.job("b").Status}
	f.s = f.newService("replica-b", "pollux")
	f.dyn.ClearActions()
	for range 3 {
		f.round()
	}
	for _, a := range f.dyn.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("the new scheduler wrote: %v", a)
		}
	}
	for name, st := range before {
		now := f.job(name).Status
		if !slices.Equal(now.Allocation, st.Allocation) || now.Reallocations != st.Reallocations || now.ScheduledBy != "replica-a" {
			t.Errorf("%s: %v (%d reallocations) → %v (%d)", name, st.Allocation, st.Reallocations, now.Allocation, now.Reallocations)
		}
	}
	// It does schedule: a new job is its.
	f.submit("c", spec(1, 1, 0))
	f.endDriver("a", 0)
	f.round()
	if c := f.job("c"); c.Status.Phase != api.PhaseRunning || c.Status.ScheduledBy != "replica-b" {
		t.Errorf("c: %+v", c.Status)
	}
}

// TestBadObjects: a job whose spec fails validation, or whose object does
// not convert, fails with the reason; the others are scheduled.
func TestBadObjects(t *testing.T) {
	f := newFixture(t, "pollux", labelNode("n1", 2))
	f.submit("good", spec(1, 2, 0))
	f.submit("no-workers", spec(0, 2, 0))
	f.submit("inverted", spec(3, 2, 0))
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gorovod.io/v1alpha1", "kind": "GorovodJob",
		"metadata": map[string]any{"name": "garbled", "namespace": testNS, "uid": "uid-garbled"},
		"spec":     map[string]any{"image": "x", "command": []any{"t"}, "minWorkers": "three"}}}
	f.create(bad)
	f.round()
	for name, msg := range map[string]string{"no-workers": "spec.minWorkers", "inverted": "spec.maxWorkers", "garbled": "does not match the GorovodJob schema"} {
		j, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		phase, _, _ := unstructured.NestedString(j.Object, "status", "phase")
		got, _, _ := unstructured.NestedString(j.Object, "status", "message")
		if phase != string(api.PhaseFailed) || !strings.Contains(got, msg) {
			t.Errorf("%s: phase %q message %q, want Failed naming %s", name, phase, got, msg)
		}
	}
	if g := f.job("good"); g.Status.Phase != api.PhaseRunning {
		t.Errorf("good: %+v", g.Status)
	}
	// An edit that breaks a running job's spec fails it and stops its driver.
	g := f.job("good")
	g.Spec.Command, g.Generation = nil, 2
	u, _ := api.ToUnstructured(g)
	if _, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.round()
	if g := f.job("good"); g.Status.Phase != api.PhaseFailed || !strings.Contains(g.Status.Message, "spec.command") || g.Status.ObservedGeneration != 2 {
		t.Errorf("good after a bad edit: %+v", g.Status)
	}
	if _, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), "good-driver", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed job's driver pod: %v", err)
	}
}

// TestNotLeading: a replica that lost the lease writes nothing.
func TestNotLeading(t *testing.T) {
	f := newFixture(t, "pollux", labelNode("n1", 2))
	f.submit("a", spec(1, 2, 0))
	f.s.beginTerm(func() bool { return false })
	f.dyn.ClearActions()
	f.kube.ClearActions()
	err := f.s.round(context.Background(), clientSource{f})
	if !errors.Is(err, errNotLeading) {
		t.Fatalf("round: %v, want errNotLeading", err)
	}
	for _, a := range slices.Concat(f.dyn.Actions(), f.kube.Actions()) {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			t.Errorf("a replica not leading did %s %s", v, a.GetResource().Resource)
		}
	}
}

func TestNodeSlots(t *testing.T) {
	q := resource.MustParse
	for _, tc := range []struct {
		name string
		node func(*corev1.Node)
		want int
	}{
		{"label", func(*corev1.Node) {}, 3},
		{"slot resource over label", func(n *corev1.Node) { n.Status.Allocatable = corev1.ResourceList{SlotResource: q("5")} }, 5},
		{"GPUs over both", func(n *corev1.Node) {
			n.Status.Allocatable = corev1.ResourceList{SlotResource: q("5"), GPUResource: q("8")}
		}, 8},
		{"no GPUs left: the slot resource", func(n *corev1.Node) {
			n.Status.Allocatable = corev1.ResourceList{SlotResource: q("5"), GPUResource: q("0")}
		}, 5},
		{"bad label", func(n *corev1.Node) { n.Labels[SlotsLabel] = "many" }, 0},
		{"capped", func(n *corev1.Node) { n.Labels[SlotsLabel] = "1000" }, 255},
		{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, 0},
		{"not ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, 0},
		{"no Ready condition", func(n *corev1.Node) { n.Status.Conditions = nil }, 0},
		{"tainted NoSchedule", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
		}, 0},
		{"tainted NoExecute", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "spot", Effect: corev1.TaintEffectNoExecute}}
		}, 0},
		{"tainted PreferNoSchedule: usable", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, 3},
		{"GPU taint tolerated", func(n *corev1.Node) {
			n.Status.Allocatable = corev1.ResourceList{GPUResource: q("4")}
			n.Spec.Taints = []corev1.Taint{{Key: string(GPUResource), Value: "present", Effect: corev1.TaintEffectNoSchedule}}
		}, 4},
		{"slot taint tolerated, another not", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: string(SlotResource), Effect: corev1.TaintEffectNoSchedule},
				{Key: "team", Value: "b", Effect: corev1.TaintEffectNoSchedule}}
		}, 0},
		{"cordon's taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := labelNode("n", 3)
			tc.node(n)
			if got := NodeSlots(n); got != tc.want {
				t.Errorf("NodeSlots = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"policy", func(c *Config) { c.Policy = "fifo" }, "unknown policy"},
		{"interval", func(c *Config) { c.Interval = -time.Second }, "negative"},
		{"lease", func(c *Config) { c.LeaderElection.RenewDeadline = time.Minute }, "lease duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.edit(&cfg)
			_, err := New(cfg, kubefake.NewClientset(), nil)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestViolations checks the check TestAgainstAPIServer makes of every write
// against the Lease's holder.
func TestViolations(t *testing.T) {
	holders := []leaseHolder{{10, "a"}, {12, "a"}, {20, ""}, {21, "b"}}
	for _, tc := range []struct {
		name   string
		writes []write
		bad    int
	}{
		{"the holder writes", []write{{rv: 11, by: "a"}, {rv: 13, by: "a"}, {rv: 22, by: "b"}}, 0},
		{"submissions are no writes", []write{{rv: 5}, {rv: 15}}, 0},
		{"before any lease", []write{{rv: 9, by: "a"}}, 1},
		{"the old leader after the release", []write{{rv: 21, by: "a"}, {rv: 22, by: "a"}}, 2},
		{"the new leader too early", []write{{rv: 19, by: "b"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if v := violations(tc.writes, holders); len(v) != tc.bad {
				t.Errorf("violations: %q, want %d", v, tc.bad)
			}
		})
	}
}

// BenchmarkRound is one Pollux round of the service (reading the jobs and
// nodes, the policy, the repair, the placement, and the writes of the
// allocations that changed) over 16 nodes of 4 slots and 20 running jobs
// with fitted goodput models, on the fake clientsets.
func BenchmarkRound(b *testing.B) {
	var nodes []*corev1.Node
	for i := range 16 {
		nodes = append(nodes, labelNode(fmt.Sprintf("n%02d", i), 4))
	}
	f := newFixture(b, "pollux", nodes...)
	for i := range 20 {
		f.submit(fmt.Sprintf("j%02d", i), spec(1, 8, 0))
	}
	f.round()
	for i := range 20 {
		f.reportGoodput(fmt.Sprintf("j%02d", i), 4)
	}
	f.round()
	b.ReportAllocs()
	for b.Loop() {
		if err := f.s.round(context.Background(), clientSource{f}); err != nil {
			b.Fatal(err)
		}
	}
}

// otherPod is a pod not of a GorovodJob, bound to node, with one container
// requesting req (and, when limitOnly, giving it as a limit only).
func otherPod(ns, name, node string, req corev1.ResourceList, limitOnly bool) *corev1.Pod {
	c := corev1.Container{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{Requests: req}}
	if limitOnly {
		c.Resources = corev1.ResourceRequirements{Limits: req}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{c}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func TestFreeSlots(t *testing.T) {
	q := resource.MustParse
	gpuNode := func(n *corev1.Node) {
		n.Status.Allocatable = corev1.ResourceList{GPUResource: q("4"), corev1.ResourceCPU: q("16")}
	}
	slotNode := func(n *corev1.Node) {
		n.Status.Allocatable = corev1.ResourceList{SlotResource: q("4"), corev1.ResourceCPU: q("16")}
	}
	cpuNode := func(n *corev1.Node) { n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: q("8")} } // label: 4 slots
	ours := func(p *corev1.Pod) *corev1.Pod {
		p.Labels = map[string]string{kube.LabelJob: "mnist"}
		return p
	}
	for _, tc := range []struct {
		name string
		node func(*corev1.Node)
		pods []*corev1.Pod
		want int
	}{
		{"GPU node, nothing else", gpuNode, nil, 4},
		{"GPU node less another pod's GPUs", gpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{GPUResource: q("3")}, false)}, 1},
		{"GPU limit only counts as the request", gpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{GPUResource: q("2")}, true)}, 2},
		{"GPU node: CPU requests do not take GPUs", gpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("15")}, false)}, 4},
		{"GPU node full, never below 0", gpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{GPUResource: q("3")}, false),
			otherPod("x", "r", "n", corev1.ResourceList{GPUResource: q("3")}, false)}, 0},
		{"our job's pods are not subtracted", gpuNode, []*corev1.Pod{ours(otherPod(testNS, "mnist-worker-0", "n", corev1.ResourceList{GPUResource: q("3")}, false))}, 4},
		{"a same-named job's pods of another namespace are", gpuNode, []*corev1.Pod{ours(otherPod("x", "mnist-worker-0", "n", corev1.ResourceList{GPUResource: q("3")}, false))}, 1},
		{"pods of other nodes are not", gpuNode, []*corev1.Pod{otherPod("x", "p", "m", corev1.ResourceList{GPUResource: q("3")}, false)}, 4},
		{"ended pods are not", gpuNode, []*corev1.Pod{func() *corev1.Pod {
			p := otherPod("x", "p", "n", corev1.ResourceList{GPUResource: q("3")}, false)
			p.Status.Phase = corev1.PodSucceeded
			return p
		}()}, 4},
		{"slot node less another pod's slots", slotNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{SlotResource: q("1")}, false)}, 3},
		{"label node: CPU in proportion", cpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("3")}, false)}, 2},
		{"label node: a little CPU costs a slot", cpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("100m")}, false)}, 3},
		{"label node: CPU of two pods", cpuNode, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("2")}, false),
			otherPod("y", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("4")}, false)}, 1},
		{"label node without allocatable CPU: label as is", func(*corev1.Node) {}, []*corev1.Pod{otherPod("x", "p", "n", corev1.ResourceList{corev1.ResourceCPU: q("3")}, false)}, 4},
		{"init container's larger request", gpuNode, []*corev1.Pod{func() *corev1.Pod {
			p := otherPod("x", "p", "n", corev1.ResourceList{GPUResource: q("1")}, false)
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{GPUResource: q("3")}}}}
			return p
		}()}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := labelNode("n", 4)
			tc.node(n)
			others := OthersRequests(tc.pods, oursIn(map[string]bool{testNS + "/mnist": true}))
			if got := FreeSlots(n, others["n"]); got != tc.want {
				t.Errorf("FreeSlots = %d, want %d (others %v)", got, tc.want, others)
			}
		})
	}
}

// A round gives the jobs only what other pods leave of the nodes, and no
// node that is tainted against the workers.
func TestRoundNetOfOtherPods(t *testing.T) {
	q := resource.MustParse
	gpu := func(name string, gpus string) *corev1.Node {
		n := labelNode(name, 0)
		delete(n.Labels, SlotsLabel)
		n.Status.Allocatable = corev1.ResourceList{GPUResource: q(gpus)}
		return n
	}
	tainted := gpu("n3", "4")
	tainted.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "inference", Effect: corev1.TaintEffectNoSchedule}}
	f := newFixture(t, "tiresias", gpu("n1", "4"), gpu("n2", "4"), tainted)
	// Another team's pod holds 3 of n1's GPUs.
	if _, err := f.kube.CoreV1().Pods("other").Create(context.Background(),
		otherPod("other", "inference", "n1", corev1.ResourceList{GPUResource: q("3")}, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.submit("a", gpuSpec(5, 5, 0))
	f.round()
	a := f.job("a")
	count := map[string]int{}
	for _, n := range a.Status.Allocation {
		count[n]++
	}
	if a.Status.Phase != api.PhaseRunning || len(a.Status.Allocation) != 5 || count["n1"] != 1 || count["n2"] != 4 || count["n3"] != 0 {
		t.Fatalf("a's allocation %v (want 1 on n1, 4 on n2, none on the tainted n3)", a.Status.Allocation)
	}
	// The job's own pods (its driver, its workers) take nothing from it.
	for _, p := range []*corev1.Pod{
		otherPod(testNS, "a-worker-0", "n2", corev1.ResourceList{GPUResource: q("1")}, false),
		otherPod(testNS, "a-worker-1", "n1", corev1.ResourceList{GPUResource: q("1")}, false),
	} {
		p.Labels = map[string]string{kube.LabelJob: "a", kube.LabelRole: kube.RoleWorker}
		if _, err := f.kube.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// b needs 3: none are free while the other pod runs.
	f.submit("b", gpuSpec(3, 3, 0))
	f.round()
	if b := f.job("b"); b.Status.Phase != api.PhasePending || len(b.Status.Allocation) != 0 {
		t.Fatalf("b while the other pod holds n1: %+v", b.Status)
	}
	if a := f.job("a"); len(a.Status.Allocation) != 5 {
		t.Fatalf("a's allocation changed: %v", a.Status.Allocation)
	}
	// The other pod ends: its GPUs are b's at the next round.
	if err := f.kube.CoreV1().Pods("other").Delete(context.Background(), "inference", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.round()
	if b := f.job("b"); b.Status.Phase != api.PhaseRunning || !slices.Equal(b.Status.Allocation, []string{"n1", "n1", "n1"}) {
		t.Fatalf("b after the other pod ended: %+v (want 3 on n1)", b.Status)
	}
}

// A disruption budget of the driver's name that is not the job's stops the
// driver's start, with the reason in the job's message.
func TestDriverBudgetNotTheJobs(t *testing.T) {
	f := newFixture(t, "pollux", labelNode("n1", 2))
	one := intstr.FromInt32(1)
	if _, err := f.kube.PolicyV1().PodDisruptionBudgets(testNS).Create(context.Background(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: DriverBudgetName("a"), Namespace: testNS},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.submit("a", spec(1, 2, 0))
	f.round()
	a := f.job("a")
	if a.Status.Phase != api.PhasePending || !strings.Contains(a.Status.Message, "is not this job's") {
		t.Fatalf("a: %+v", a.Status)
	}
	if _, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), DriverPodName("a"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a driver pod without its budget: %v", err)
	}
}

// endPod makes driver pod name end with an exit status, as its kubelet
// would report it.
func (f *fixture) endPod(name string, exit int32) {
	f.t.Helper()
	p, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: DriverContainer,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error"}}}}
	if _, err := f.kube.CoreV1().Pods(testNS).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// recordAdoption acts as a job's driver writing status.adoption.
func (f *fixture) recordAdoption(job string, a *api.Adoption) {
	f.t.Helper()
	j := f.job(job)
	j.Status.Adoption = a
	u, err := api.ToUnstructured(j)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.dyn.Resource(api.GroupVersionResource()).Namespace(testNS).UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestDriverReplaced: a running job's driver that was killed (137), left on
// SIGTERM (143) or whose pod was deleted is replaced by a driver pod that
// gets the job secret from the Secret status.adoption names, up to
// MaxDriverRestarts; a driver that ended its job (status.adoption ended, or
// an exit status of its own), or one with no record, ends the job as before.
func TestDriverReplaced(t *testing.T) {
	adoption := &api.Adoption{JobID: "job-1", Seeds: []string{"198.18.0.5:7946"}, SecretName: "r-secret-0123456789", MinWorkers: 1}
	tolerate := []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "vision", Effect: corev1.TaintEffectNoSchedule}}
	for _, tc := range []struct {
		name   string
		record *api.Adoption
		end    func(f *fixture, driver string)
		want   api.Phase // Running: replaced
		msg    string
	}{
		{"killed", adoption, func(f *fixture, d string) { f.endPod(d, 137) }, api.PhaseRunning, ""},
		{"left on SIGTERM", adoption, func(f *fixture, d string) { f.endPod(d, 143) }, api.PhaseRunning, ""},
		{"pod deleted", adoption, func(f *fixture, d string) {
			if err := f.kube.CoreV1().Pods(testNS).Delete(context.Background(), d, metav1.DeleteOptions{}); err != nil {
				f.t.Fatal(err)
			}
		}, api.PhaseRunning, ""},
		{"failed by itself", adoption, func(f *fixture, d string) { f.endPod(d, 1) }, api.PhaseFailed, "exited with status 1"},
		{"killed without a record", nil, func(f *fixture, d string) { f.endPod(d, 137) }, api.PhaseFailed, "exited with status 137"},
		{"killed, the record naming another job's Secret", &api.Adoption{JobID: "job-1", Seeds: []string{"198.18.0.5:7946"}, SecretName: "r-secret-x-secret-0123456789"},
			func(f *fixture, d string) { f.endPod(d, 137) }, api.PhaseFailed, "exited with status 137"},
		{"killed after the job ended", &api.Adoption{JobID: "job-1", Seeds: []string{"198.18.0.5:7946"}, SecretName: "r-secret-0123456789", Ended: true},
			func(f *fixture, d string) { f.endPod(d, 137) }, api.PhaseFailed, "exited with status 137"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "pollux", labelNode("n1", 2))
			s := spec(1, 2, 0)
			s.Tolerations = tolerate
			f.submit("r", s)
			f.round()
			if tc.record != nil {
				f.recordAdoption("r", tc.record)
			}
			// A worker pod of r (owned by the job, as its driver makes
			// them) and one labelled r but not the job's (a plain
			// --kubernetes job of the same name).
			for name, owner := range map[string]types.UID{"r-worker-0": f.job("r").UID, "r-worker-1": "0ther"} {
				job := "r"
				if _, err := f.kube.CoreV1().Pods(testNS).Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS,
					Labels:          map[string]string{kube.LabelJob: job, kube.LabelRole: kube.RoleWorker},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: api.Group + "/" + api.Version, Kind: api.Kind, Name: job, UID: owner}}}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			tc.end(f, "r-driver")
			f.round()
			r := f.job("r")
			if r.Status.Phase != tc.want || !strings.Contains(r.Status.Message, tc.msg) {
				t.Fatalf("after the driver's end: %+v", r.Status)
			}
			if tc.want != api.PhaseRunning {
				if r.Status.DriverRestarts != 0 {
					t.Fatalf("not replaced, but driverRestarts %d", r.Status.DriverRestarts)
				}
				// The ended job's worker pods go; another's stay.
				for _, name := range []string{"r-worker-0", "r-worker-1"} {
					_, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
					if gone := apierrors.IsNotFound(err); gone != (name == "r-worker-0") {
						t.Fatalf("%s after the job ended: %v", name, err)
					}
				}
				return
			}
			for _, name := range []string{"r-worker-0", "r-worker-1"} {
				if _, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
					t.Fatalf("%s after the driver was replaced: %v", name, err)
				}
			}
			if r.Status.Driver != "r-driver-1" || r.Status.DriverRestarts != 1 || len(r.Status.Allocation) == 0 {
				t.Fatalf("after the replacement: %+v", r.Status)
			}
			pod, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), "r-driver-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ref *corev1.SecretKeySelector
			for _, e := range pod.Spec.Containers[0].Env {
				if e.Name == "GOROVOD_SECRET" {
					if e.Value != "" || e.ValueFrom == nil {
						t.Fatalf("the secret in the pod spec: %+v", e)
					}
					ref = e.ValueFrom.SecretKeyRef
				}
			}
			if ref == nil || ref.Name != adoption.SecretName || ref.Key != "GOROVOD_SECRET" ||
				!slices.Equal(pod.Spec.Containers[0].Command, []string{"gorovod", "run", "--gorovodjob=r"}) ||
				len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != r.UID || pod.Labels[kube.LabelRole] != RoleDriver ||
				!slices.Equal(pod.Spec.Tolerations, tolerate) {
				t.Fatalf("replacement driver pod: %+v", pod)
			}
			// It runs: nothing changes.
			f.round()
			if r := f.job("r"); r.Status.Driver != "r-driver-1" || r.Status.DriverRestarts != 1 {
				t.Fatalf("a round with the replacement running: %+v", r.Status)
			}
			// Up to MaxDriverRestarts (3), then the job fails.
			for n := int32(2); n <= 4; n++ {
				f.endPod(r.Status.Driver, 137)
				f.round()
				r = f.job("r")
				if n <= 3 && (r.Status.Driver != fmt.Sprintf("r-driver-%d", n) || r.Status.DriverRestarts != n || r.Status.Phase != api.PhaseRunning) {
					t.Fatalf("replacement %d: %+v", n, r.Status)
				}
			}
			if r.Status.Phase != api.PhaseFailed || r.Status.DriverRestarts != 3 || !strings.Contains(r.Status.Message, "r-driver-3 exited with status 137") {
				t.Fatalf("a fourth kill: %+v", r.Status)
			}
		})
	}
}

func TestDriverKilled(t *testing.T) {
	ended := func(phase corev1.PodPhase, code int32) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if code >= 0 {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: DriverContainer,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}}
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"deleted", nil, true},
		{"SIGKILL", ended(corev1.PodFailed, 137), true},
		{"SIGTERM", ended(corev1.PodFailed, 143), true},
		{"node lost", ended(corev1.PodFailed, -1), true},
		{"succeeded", ended(corev1.PodSucceeded, 0), false},
		{"failed its job", ended(corev1.PodFailed, 1), false},
		{"bad flags", ended(corev1.PodFailed, 2), false},
	} {
		if got := driverKilled(tc.pod); got != tc.want {
			t.Errorf("%s: driverKilled %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNodeSelection: a job whose spec keeps it on some nodes is allocated
// only those, whatever the policy; one that no node matches, or whose nodes
// have no room for its minimum, waits with the reason in its status; its
// driver pod carries its node selection.
// placed is what a test of placement wants of a job after each round.
type placed struct {
	phase   api.Phase
	nodes   []string // the nodes it may be given (Running)
	message string   // in its status (Pending)
}

// placeRounds submits jobs in name order and runs 3 rounds, checking after
// each that every job is as want says; a running job reports a goodput
// model after the first, so that it may grow. It returns the jobs' names.
func (f *fixture) placeRounds(jobs map[string]api.Spec, want map[string]placed) []string {
	f.t.Helper()
	names := slices.Sorted(maps.Keys(jobs))
	for _, name := range names {
		f.submit(name, jobs[name])
	}
	for round := range 3 {
		f.round()
		f.checkFits(names...)
		for _, name := range names {
			j, w := f.job(name), want[name]
			if j.Status.Phase != w.phase {
				f.t.Fatalf("round %d: %s is %s (%v, %q), want %s", round, name, j.Status.Phase, j.Status.Allocation, j.Status.Message, w.phase)
			}
			for _, n := range j.Status.Allocation {
				if !slices.Contains(w.nodes, n) {
					f.t.Fatalf("round %d: %s allocated %v, outside its nodes %v", round, name, j.Status.Allocation, w.nodes)
				}
			}
			if w.phase == api.PhasePending && !strings.Contains(j.Status.Message, w.message) {
				f.t.Fatalf("round %d: %s's message %q, want one with %q", round, name, j.Status.Message, w.message)
			}
			if w.phase == api.PhaseRunning && round == 0 {
				f.reportGoodput(name, 4) // then it may grow
			}
		}
	}
	return names
}

func TestNodeSelection(t *testing.T) {
	pool := func(name string, slots int, labels ...string) *corev1.Node {
		n := labelNode(name, slots)
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	pinned := func(minW, maxW int32, selector map[string]string, required *corev1.NodeSelector) api.Spec {
		s := spec(minW, maxW, 0)
		s.NodeSelector, s.RequiredNodeAffinity = selector, required
		return s
	}
	notInA := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a"}}}}}}
	for _, tc := range []struct {
		name string
		jobs map[string]api.Spec // submitted in name order
		want map[string]placed
		// The policies it holds for (nil: all).
		policies []string
	}{
		{"match", map[string]api.Spec{"j": pinned(1, 4, map[string]string{"pool": "a"}, nil)},
			map[string]placed{"j": {phase: api.PhaseRunning, nodes: []string{"n1"}}}, nil},
		{"several labels", map[string]api.Spec{"j": pinned(1, 4, map[string]string{"pool": "b", "zone": "z1"}, nil)},
			map[string]placed{"j": {phase: api.PhaseRunning, nodes: []string{"n3"}}}, nil},
		{"required node affinity", map[string]api.Spec{"j": pinned(1, 6, nil, notInA)},
			map[string]placed{"j": {phase: api.PhaseRunning, nodes: []string{"n2", "n3"}}}, nil},
		{"no match", map[string]api.Spec{"j": pinned(1, 4, map[string]string{"pool": "c"}, nil), "k": spec(1, 2, 0)},
			map[string]placed{"j": {phase: api.PhasePending, message: "no node matches spec.nodeSelector"}, "k": {phase: api.PhaseRunning, nodes: []string{"n1", "n2", "n3"}}}, nil},
		{"matching nodes too small", map[string]api.Spec{"j": pinned(3, 4, map[string]string{"pool": "a"}, nil)},
			map[string]placed{"j": {phase: api.PhasePending, message: "waiting for 3 free slots (spec.minWorkers) on the 1 nodes matching spec.nodeSelector and spec.requiredNodeAffinity (2 free there)"}}, nil},
		{"two jobs for one node's slots", map[string]api.Spec{"j": pinned(2, 2, map[string]string{"pool": "a"}, nil), "k": pinned(2, 2, map[string]string{"pool": "a"}, nil), "l": spec(1, 1, 0)},
			map[string]placed{"j": {phase: api.PhaseRunning, nodes: []string{"n1"}}, "k": {phase: api.PhasePending, message: "(0 free there)"},
				"l": {phase: api.PhaseRunning, nodes: []string{"n1", "n2", "n3"}}}, nil},
		// The policy's packing puts a on n1, j on n2 (not its node) and
		// k on n3: k's placement must not be kept before j, the earlier,
		// is given n3, the only node it may use.
		{"a later job's placement on an earlier one's only node", map[string]api.Spec{"a": spec(2, 2, 0), "j": pinned(2, 2, map[string]string{"zone": "z1"}, nil), "k": pinned(2, 2, map[string]string{"pool": "b"}, nil)},
			map[string]placed{"a": {phase: api.PhaseRunning, nodes: []string{"n1", "n2", "n3"}}, "j": {phase: api.PhaseRunning, nodes: []string{"n3"}},
				"k": {phase: api.PhaseRunning, nodes: []string{"n2", "n3"}}}, nil},
	} {
		policies := tc.policies
		if policies == nil {
			policies = Policies
		}
		for _, policy := range policies {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				f := newFixture(t, policy, pool("n1", 2, "pool", "a"), pool("n2", 2, "pool", "b"), pool("n3", 2, "pool", "b", "zone", "z1"))
				names := f.placeRounds(tc.jobs, tc.want)
				for _, name := range names {
					pod, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), DriverPodName(name), metav1.GetOptions{})
					if tc.want[name].phase == api.PhasePending {
						if !apierrors.IsNotFound(err) {
							t.Errorf("%s waits, but has a driver pod (%v)", name, err)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					s := tc.jobs[name]
					if !maps.Equal(pod.Spec.NodeSelector, s.NodeSelector) {
						t.Errorf("%s's driver pod has nodeSelector %v, want %v", name, pod.Spec.NodeSelector, s.NodeSelector)
					}
					var required *corev1.NodeSelector
					if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
						required = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
					}
					if !reflect.DeepEqual(required, s.RequiredNodeAffinity) {
						t.Errorf("%s's driver pod has required node affinity %v, want %v", name, required, s.RequiredNodeAffinity)
					}
				}
			})
		}
	}
}

// TestRunningJobsNodesRelabelled: a running job whose nodes' labels change
// so that the nodes matching its spec can no longer hold its minimum keeps
// its minimum on the nodes it holds (as Kubernetes leaves a running pod on
// a node whose labels changed: IgnoredDuringExecution), its matching nodes'
// workers first; it gets no worker it did not have on a node that does not
// match, does not grow, and its message says why. Once its nodes match
// again it is placed on them as before.
func TestRunningJobsNodesRelabelled(t *testing.T) {
	relabel := func(f *fixture, pool string, nodes ...string) {
		for _, n := range nodes {
			f.editNode(n, func(n *corev1.Node) { n.Labels["pool"] = pool })
		}
	}
	for _, tc := range []struct {
		name     string
		relabel  []string // the nodes of pool a moved to pool b
		matching []string // the nodes that match j after
		message  string
	}{
		{"one of its two nodes", []string{"n2"}, []string{"n1"},
			"the 1 nodes matching spec.nodeSelector and spec.requiredNodeAffinity hold 2 slots, below spec.minWorkers 3: keeping 3 workers on its nodes until they can"},
		{"every node", []string{"n1", "n2"}, nil,
			"no node matches spec.nodeSelector and spec.requiredNodeAffinity any more: keeping 3 workers on its nodes until one can hold spec.minWorkers 3"},
	} {
		for _, policy := range Policies {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				node := func(name, pool string) *corev1.Node {
					n := labelNode(name, 2)
					n.Labels["pool"] = pool
					return n
				}
				f := newFixture(t, policy, node("n1", "a"), node("n2", "a"), node("n3", "b"))
				j := spec(3, 4, 0)
				j.NodeSelector = map[string]string{"pool": "a"}
				f.submit("j", j)
				f.submit("k", spec(1, 4, 0))
				f.round()
				f.reportGoodput("j", 4)
				f.reportGoodput("k", 4)
				f.round()
				before := f.job("j").Status.Allocation
				if st := f.job("j").Status; st.Phase != api.PhaseRunning || len(before) < 3 {
					t.Fatalf("j before: %+v", st)
				}
				relabel(f, "b", tc.relabel...)
				for round := range 3 {
					f.round()
					f.checkFits("j", "k")
					st := f.job("j").Status
					if st.Phase != api.PhaseRunning || len(st.Allocation) != 3 {
						t.Fatalf("round %d after the relabelling: j is %s with %v (before %v), want Running with its minimum, 3", round, st.Phase, st.Allocation, before)
					}
					for _, n := range st.Allocation {
						if had, has := count(before, n), count(st.Allocation, n); !slices.Contains(tc.matching, n) && has > had {
							t.Fatalf("round %d: j has %d workers on %s, which no longer matches (it had %d): %v → %v", round, has, n, had, before, st.Allocation)
						}
					}
					for _, n := range tc.matching {
						if count(st.Allocation, n) < min(count(before, n), 3) {
							t.Errorf("round %d: j left matching node %s: %v → %v", round, n, before, st.Allocation)
						}
					}
					if st.Message != tc.message {
						t.Errorf("round %d: j's message %q, want %q", round, st.Message, tc.message)
					}
				}
				relabel(f, "a", tc.relabel...)
				f.round()
				f.round()
				f.checkFits("j", "k")
				st := f.job("j").Status
				if st.Phase != api.PhaseRunning || len(st.Allocation) < 3 || st.Message != "" {
					t.Fatalf("once its nodes match again: j is %s with %v, %q", st.Phase, st.Allocation, st.Message)
				}
				for _, n := range st.Allocation {
					if n == "n3" {
						t.Fatalf("once its nodes match again: j on n3: %v", st.Allocation)
					}
				}
			})
		}
	}
}

func count(nodes []string, n string) int {
	k := 0
	for _, m := range nodes {
		if m == n {
			k++
		}
	}
	return k
}

// TestNodePreference: a job's spec.preferredNodeAffinity places its workers
// on the nodes of highest summed weight among those it may use, whatever
// the policy; full preferred nodes leave it the others; it never gets a node
// its selection excludes; its driver pod carries the preferences.
func TestNodePreference(t *testing.T) {
	node := func(name string, labels ...string) *corev1.Node {
		n := labelNode(name, 2)
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	prefer := func(weight int32, key, value string) corev1.PreferredSchedulingTerm {
		return corev1.PreferredSchedulingTerm{Weight: weight, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}
	}
	job := func(selector map[string]string, terms ...corev1.PreferredSchedulingTerm) api.Spec {
		s := spec(2, 2, 0)
		s.NodeSelector, s.PreferredNodeAffinity = selector, terms
		return s
	}
	for _, tc := range []struct {
		name string
		jobs map[string]api.Spec // submitted in name order
		want map[string][]string // each job's allocation
	}{
		{"one preferred node", map[string]api.Spec{"j": job(nil, prefer(50, "zone", "z1"))},
			map[string][]string{"j": {"n3", "n3"}}},
		{"the larger summed weight", map[string]api.Spec{"j": job(nil, prefer(30, "pool", "a"), prefer(20, "pool", "b"), prefer(15, "zone", "z1"))},
			map[string][]string{"j": {"n3", "n3"}}},
		{"preferred, but not selected", map[string]api.Spec{"j": job(map[string]string{"pool": "b"}, prefer(100, "pool", "a"), prefer(1, "zone", "z2"))},
			map[string][]string{"j": {"n2", "n2"}}},
		{"the preferred node taken: the next", map[string]api.Spec{
			"a": job(map[string]string{"zone": "z1"}),
			"j": job(nil, prefer(50, "zone", "z1"), prefer(10, "zone", "z2"))},
			map[string][]string{"a": {"n3", "n3"}, "j": {"n2", "n2"}}},
	} {
		for _, policy := range Policies {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				f := newFixture(t, policy, node("n1", "pool", "a"), node("n2", "pool", "b", "zone", "z2"), node("n3", "pool", "b", "zone", "z1"))
				names := slices.Sorted(maps.Keys(tc.jobs))
				for _, name := range names {
					f.submit(name, tc.jobs[name])
				}
				for round := range 2 {
					f.round()
					f.checkFits(names...)
					for _, name := range names {
						j := f.job(name)
						if j.Status.Phase != api.PhaseRunning || !slices.Equal(j.Status.Allocation, tc.want[name]) {
							t.Fatalf("round %d: %s is %s with %v (%q), want Running with %v", round, name, j.Status.Phase, j.Status.Allocation, j.Status.Message, tc.want[name])
						}
					}
				}
				for _, name := range names {
					pod, err := f.kube.CoreV1().Pods(testNS).Get(context.Background(), DriverPodName(name), metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					var preferred []corev1.PreferredSchedulingTerm
					if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
						preferred = a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
					}
					if want := tc.jobs[name].PreferredNodeAffinity; !reflect.DeepEqual(preferred, want) {
						t.Errorf("%s's driver pod prefers %+v, want %+v", name, preferred, want)
					}
				}
			})
		}
	}
}

// TestMaxWorkersPerNode: a job's spec.maxWorkersPerNode reaches the policy
// and the placement: whatever the policy, no node holds more of the job's
// workers than the cap; a job whose minimum its nodes cannot hold at the cap
// waits, and one whose nodes are taken waits for them, their messages
// saying why; a running job that loses a node so keeps its workers within
// the cap.
func TestMaxWorkersPerNode(t *testing.T) {
	node := func(name string, labels ...string) *corev1.Node {
		n := labelNode(name, 2)
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	capped := func(minW, maxW, perNode int32, selector map[string]string) api.Spec {
		s := spec(minW, maxW, 0)
		s.MaxWorkersPerNode, s.NodeSelector = perNode, selector
		return s
	}
	poolB := map[string]string{"pool": "b"}
	type want struct {
		phase   api.Phase
		workers int    // Running: how many
		message string // the whole message
	}
	for _, tc := range []struct {
		name string
		// first is submitted and placed before the others (a round).
		first, jobs map[string]api.Spec
		want        map[string]want
		// leave is a node cordoned after the jobs run; then want after.
		leave string
		after map[string]want
	}{
		{name: "one per node", jobs: map[string]api.Spec{"j": capped(3, 3, 1, nil)},
			want: map[string]want{"j": {phase: api.PhaseRunning, workers: 3}}},
		{name: "one per node, growing", jobs: map[string]api.Spec{"j": capped(2, 6, 1, nil)},
			want: map[string]want{"j": {phase: api.PhaseRunning}}},
		{name: "one per matching node", jobs: map[string]api.Spec{"j": capped(2, 4, 1, poolB)},
			want: map[string]want{"j": {phase: api.PhaseRunning, workers: 2}}},
		{name: "a minimum the nodes cannot hold at the cap", jobs: map[string]api.Spec{"j": capped(4, 4, 1, nil), "k": spec(1, 2, 0)},
			want: map[string]want{"j": {phase: api.PhasePending,
				message: "spec.minWorkers 4 at spec.maxWorkersPerNode 1 needs at least 4 nodes; the 3 nodes with free slots hold 3 of its workers: waiting for more"},
				"k": {phase: api.PhaseRunning}}},
		{name: "a minimum the matching nodes cannot hold at the cap", jobs: map[string]api.Spec{"j": capped(3, 3, 1, poolB)},
			want: map[string]want{"j": {phase: api.PhasePending,
				message: "spec.minWorkers 3 at spec.maxWorkersPerNode 1 needs at least 3 nodes; the 2 nodes matching spec.nodeSelector and spec.requiredNodeAffinity with free slots hold 2 of its workers: waiting for more"}}},
		{name: "the nodes taken", first: map[string]api.Spec{"a": capped(4, 4, 0, poolB)}, jobs: map[string]api.Spec{"j": capped(2, 2, 1, nil)},
			want: map[string]want{"a": {phase: api.PhaseRunning, workers: 4}, "j": {phase: api.PhasePending,
				message: "waiting for 2 free slots (spec.minWorkers), at most 1 a node (spec.maxWorkersPerNode), on the nodes (1 free there at that cap)"}}},
		{name: "a node leaves", jobs: map[string]api.Spec{"j": capped(3, 3, 1, nil)},
			want: map[string]want{"j": {phase: api.PhaseRunning, workers: 3}}, leave: "n3",
			after: map[string]want{"j": {phase: api.PhaseRunning, workers: 2,
				message: "the cluster's nodes hold 2 slots at spec.maxWorkersPerNode 1, below spec.minWorkers 3: keeping 2 workers on its nodes until they can"}}},
	} {
		for _, policy := range Policies {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				f := newFixture(t, policy, node("n1", "pool", "a"), node("n2", "pool", "b"), node("n3", "pool", "b"))
				specs := map[string]api.Spec{}
				for _, batch := range []map[string]api.Spec{tc.first, tc.jobs} {
					if batch == nil {
						continue
					}
					for _, name := range slices.Sorted(maps.Keys(batch)) {
						f.submit(name, batch[name])
						specs[name] = batch[name]
					}
					f.round()
				}
				names := slices.Sorted(maps.Keys(specs))
				check := func(round int, wants map[string]want) {
					t.Helper()
					if tc.after == nil || round < 3 {
						// After a node leaves, a job may hold fewer
						// than its minimum (what is left of it).
						f.checkFits(names...)
					}
					for _, name := range names {
						j, w := f.job(name), wants[name]
						if j.Status.Phase != w.phase {
							t.Fatalf("round %d: %s is %s (%v, %q), want %s", round, name, j.Status.Phase, j.Status.Allocation, j.Status.Message, w.phase)
						}
						if perNode := int(specs[name].MaxWorkersPerNode); perNode > 0 {
							for _, n := range j.Status.Allocation {
								if count(j.Status.Allocation, n) > perNode {
									t.Fatalf("round %d: %s has %v, more than %d on %s", round, name, j.Status.Allocation, perNode, n)
								}
							}
						}
						if w.workers > 0 && len(j.Status.Allocation) != w.workers {
							t.Fatalf("round %d: %s has %v, want %d workers", round, name, j.Status.Allocation, w.workers)
						}
						if w.phase == api.PhasePending && len(j.Status.Allocation) > 0 {
							t.Fatalf("round %d: %s waits with %v", round, name, j.Status.Allocation)
						}
						if j.Status.Message != w.message {
							t.Fatalf("round %d: %s's message %q, want %q", round, name, j.Status.Message, w.message)
						}
						if w.phase == api.PhaseRunning && round == 0 {
							f.reportGoodput(name, 4) // then it may grow
						}
					}
				}
				for round := range 3 {
					if round > 0 {
						f.round()
					}
					check(round, tc.want)
				}
				if tc.leave == "" {
					return
				}
				f.editNode(tc.leave, func(n *corev1.Node) { n.Spec.Unschedulable = true })
				for round := range 2 {
					f.round()
					check(3+round, tc.after)
				}
			})
		}
	}
}

// TestDescribe: the policy's view of a job carries its spec's bounds and its
// cap per node.
func TestDescribe(t *testing.T) {
	submitted := metav1.NewTime(time.Unix(1e9, 0))
	for _, tc := range []struct {
		name string
		spec api.Spec
		want scheduler.Job
	}{
		{"no cap", spec(2, 6, 0), scheduler.Job{MinReplicas: 2, MaxReplicas: 6, Replicas: 6}},
		{"a cap per node", func() api.Spec { s := spec(2, 6, 0); s.MaxWorkersPerNode = 3; return s }(),
			scheduler.Job{MinReplicas: 2, MaxReplicas: 6, Replicas: 6, MaxPerNode: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &entry{job: &api.GorovodJob{Spec: tc.spec}, id: "team/j", st: api.Status{SubmitTime: &submitted}}
			got := describe(e, submitted.Add(time.Minute), 4)
			if got.ID != "team/j" || got.MinReplicas != tc.want.MinReplicas || got.MaxReplicas != tc.want.MaxReplicas ||
				got.Replicas != tc.want.Replicas || got.MaxPerNode != tc.want.MaxPerNode {
				t.Fatalf("describe = %+v, want bounds and cap as %+v", got, tc.want)
			}
		})
	}
}

// TestSlotKinds: in a cluster of GPU nodes (nvidia.com/gpu), nodes that
// advertise gorovod.io/slot and nodes whose slots come from their label, a
// job whose spec.resources asks for GPUs is allocated GPU nodes only, and
// any other job the nodes without GPUs only. A kubelet would admit either
// elsewhere (it drops a request of an extended resource its node does not
// have): the GPU job's workers would train without a GPU, and the other
// job's would hold a GPU's slot without using it. A job that no node of
// its kind can hold waits, its message saying why.
func TestSlotKinds(t *testing.T) {
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	resourceNode := func(r corev1.ResourceName) func(string, int, ...string) *corev1.Node {
		return func(name string, slots int, labels ...string) *corev1.Node {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
				Status: corev1.NodeStatus{Conditions: ready, Allocatable: corev1.ResourceList{r: resource.MustParse(fmt.Sprint(slots))}}}
			for i := 0; i+1 < len(labels); i += 2 {
				n.Labels[labels[i]] = labels[i+1]
			}
			return n
		}
	}
	gpuNode, slotNode := resourceNode(GPUResource), resourceNode(SlotResource)
	gpus := func(minW, maxW int32, selector map[string]string) api.Spec {
		s := gpuSpec(minW, maxW, 0)
		s.NodeSelector = selector
		return s
	}
	mixed := []*corev1.Node{gpuNode("g1", 2, "pool", "a"), gpuNode("g2", 2, "pool", "b"), slotNode("s1", 2), labelNode("l1", 2)}
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		jobs  map[string]api.Spec // submitted in name order
		want  map[string]placed
	}{
		{"each kind to its jobs", mixed, map[string]api.Spec{"cpu": spec(1, 4, 0), "gpu": gpus(1, 4, nil)},
			map[string]placed{"cpu": {phase: api.PhaseRunning, nodes: []string{"s1", "l1"}}, "gpu": {phase: api.PhaseRunning, nodes: []string{"g1", "g2"}}}},
		{"a GPU job pinned", mixed, map[string]api.Spec{"gpu": gpus(1, 4, map[string]string{"pool": "b"})},
			map[string]placed{"gpu": {phase: api.PhaseRunning, nodes: []string{"g2"}}}},
		{"a GPU job pinned where no GPU node matches", mixed, map[string]api.Spec{"gpu": gpus(1, 4, map[string]string{"pool": "c"})},
			map[string]placed{"gpu": {phase: api.PhasePending, message: "no GPU node matches spec.nodeSelector and spec.requiredNodeAffinity: waiting for one"}}},
		{"more GPUs than the GPU nodes have", mixed, map[string]api.Spec{"gpu": gpus(5, 5, nil)},
			map[string]placed{"gpu": {phase: api.PhasePending, message: "waiting for 5 free slots (spec.minWorkers) on the 2 GPU nodes (4 free there)"}}},
		{"no GPU node", []*corev1.Node{slotNode("s1", 2), labelNode("l1", 2)}, map[string]api.Spec{"cpu": spec(1, 4, 0), "gpu": gpus(1, 4, nil)},
			map[string]placed{"cpu": {phase: api.PhaseRunning, nodes: []string{"s1", "l1"}},
				"gpu": {phase: api.PhasePending, message: "no node has nvidia.com/gpu (spec.resources asks for GPUs): waiting for one"}}},
		{"GPU nodes only", []*corev1.Node{gpuNode("g1", 2)}, map[string]api.Spec{"cpu": spec(1, 4, 0), "gpu": gpus(1, 4, nil)},
			map[string]placed{"cpu": {phase: api.PhasePending, message: "no node without GPUs has slots (spec.resources asks for no GPU): waiting for one"},
				"gpu": {phase: api.PhaseRunning, nodes: []string{"g1"}}}},
		{"label nodes only", []*corev1.Node{labelNode("l1", 2), labelNode("l2", 2)}, map[string]api.Spec{"cpu": spec(3, 4, 0)},
			map[string]placed{"cpu": {phase: api.PhaseRunning, nodes: []string{"l1", "l2"}}}},
	} {
		for _, policy := range Policies {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				var nodes []*corev1.Node
				for _, n := range tc.nodes {
					nodes = append(nodes, n.DeepCopy())
				}
				f := newFixture(t, policy, nodes...)
				f.placeRounds(tc.jobs, tc.want)
			})
		}
	}
}
