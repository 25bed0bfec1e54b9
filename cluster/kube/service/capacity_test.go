package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// TestCapacityAndDriverBudgetAgainstAPIServer runs the scheduler as the
// service account of deploy/kubernetes/gorovod.yaml against a real
// kube-apiserver and controller manager, on two nodes registered through the
// API: another namespace's pod bound to n1 takes one of its two
// gorovod.io/slot, and n2 is tainted, so a job of two workers waits; the
// taint removed, it runs on n2. The job's driver pod, once running, cannot
// be evicted (the eviction API, which kubectl drain calls, answers 429 for
// its PodDisruptionBudget) while a pod without one can; once the driver has
// ended, it can be.
func TestCapacityAndDriverBudgetAgainstAPIServer(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newE2E(ctx, t, cp, "team", "n1", "n2")
	q := resource.MustParse
	slot := func(n string) string {
		return fmt.Sprintf(`{"status":{"capacity":{%q:%q},"allocatable":{%q:%q}}}`, SlotResource, n, SlotResource, n)
	}
	if _, err := e.admin.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(slot("2")), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	taint := func(taints []corev1.Taint) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := e.admin.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = taints
			_, err = e.admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	taint([]corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}})
	if err := cp.Namespace(ctx, e.admin, "other"); err != nil {
		t.Fatal(err)
	}
	other := otherPod("other", "db", "n1", corev1.ResourceList{SlotResource: q("1")}, false)
	other.Spec.Containers[0].Resources.Limits = other.Spec.Containers[0].Resources.Requests // extended resources: limit = request
	if _, err := e.admin.CoreV1().Pods("other").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	startReplica(ctx, t, cp.ConfigFor(e.token), "sched-a", func(c *Config) { c.Policy, c.Interval = "tiresias", 2*time.Second })
	e.submit("a", 2, 2)
	alloc := func(job string, want ...string) func(map[string]*api.GorovodJob) error {
		return func(m map[string]*api.GorovodJob) error {
			if err := running(job)(m); err != nil {
				return err
			}
			got := slices.Sorted(slices.Values(m[job].Status.Allocation))
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s's allocation %v, want %v", job, got, want)
			}
			return nil
		}
	}
	// a needs 2: n1 has one slot left, n2 is tainted.
	e.until("a waits", time.Minute, func(m map[string]*api.GorovodJob) error {
		if a := m["a"]; a == nil || a.Status.Phase != api.PhasePending || !strings.Contains(a.Status.Message, "waiting for 2 free slots") {
			return fmt.Errorf("a is not waiting for 2 slots: %+v", a)
		}
		return nil
	})
	taint(nil)
	e.until("a on n2 once its taint is gone", time.Minute, alloc("a", "n2", "n2"))

	// The driver's budget, as the scheduler created it.
	pdb, err := e.admin.PolicyV1().PodDisruptionBudgets("team").Get(ctx, DriverBudgetName("a"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].Kind != api.Kind {
		t.Fatalf("the driver's budget: %+v", pdb)
	}
	// The driver pod runs (the test plays its kubelet: a Pending pod may be
	// evicted whatever its budget).
	setPhase := func(ns, name string, phase corev1.PodPhase) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := e.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status.Phase = phase
			ready := corev1.ConditionTrue
			if phase != corev1.PodRunning {
				ready = corev1.ConditionFalse
			}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}
			_, err = e.admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	setPhase("team", DriverPodName("a"), corev1.PodRunning)
	// The controller manager's disruption controller counts it.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	var last error
	if err := testdaemon.WaitFor(wctx, 200*time.Millisecond, func() error {
		p, err := e.admin.PolicyV1().PodDisruptionBudgets("team").Get(wctx, DriverBudgetName("a"), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := p.Status; s.ObservedGeneration != p.Generation || s.CurrentHealthy != 1 || s.DesiredHealthy != 1 || s.DisruptionsAllowed != 0 {
			last = fmt.Errorf("budget status %+v", s)
			return last
		}
		return nil
	}); err != nil {
		t.Fatalf("%v (last: %v)", err, last)
	}
	evict := func(ns, name string) error {
		return e.admin.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
	}
	if err := evict("team", DriverPodName("a")); !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
		t.Fatalf("evicting the running driver: %v, want 429 for its disruption budget", err)
	}
	if _, err := e.admin.CoreV1().Pods("team").Get(ctx, DriverPodName("a"), metav1.GetOptions{}); err != nil {
		t.Fatalf("the driver after a refused eviction: %v", err)
	}
	// A running pod without a budget is evicted.
	setPhase("other", "db", corev1.PodRunning)
	if err := evict("other", "db"); err != nil {
		t.Fatalf("evicting a pod without a budget: %v", err)
	}
	// An ended driver's eviction is no longer refused.
	setPhase("team", DriverPodName("a"), corev1.PodSucceeded)
	if err := evict("team", DriverPodName("a")); err != nil {
		t.Fatalf("evicting the ended driver: %v", err)
	}
}

// TestClusterChangesCallForRounds runs the scheduler with an hour between
// its timed rounds against a real kube-apiserver: a pod of another namespace
// bound to the node of a running job of two workers, taking one of the
// node's two gorovod.io/slot, moves one of the workers to the other node,
// and a cordon of the node moves the other, each within a minute (the rounds the changes call for); a burst of
// pods bound to a node runs no more rounds than MinRoundGap allows.
func TestClusterChangesCallForRounds(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newE2E(ctx, t, cp, "team", "n1", "n2")
	q := resource.MustParse
	for _, n := range []string{"n1", "n2"} {
		patch := fmt.Sprintf(`{"status":{"capacity":{%q:"2"},"allocatable":{%q:"2"}}}`, SlotResource, SlotResource)
		if _, err := e.admin.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.Namespace(ctx, e.admin, "other"); err != nil {
		t.Fatal(err)
	}
	const gap = time.Second
	r := startReplica(ctx, t, cp.ConfigFor(e.token), "sched-a", func(c *Config) {
		c.Policy, c.Interval, c.EventDelay, c.MinRoundGap = "tiresias", time.Hour, 100*time.Millisecond, gap
	})
	e.submit("a", 2, 2)
	// allocated waits for a to run on two slots, at most most of them on
	// node, and returns its allocation.
	allocated := func(what, node string, most int) []string {
		t.Helper()
		var al []string
		e.until(what, time.Minute, func(m map[string]*api.GorovodJob) error {
			if err := running("a")(m); err != nil {
				return err
			}
			al = m["a"].Status.Allocation
			on := 0
			for _, n := range al {
				if n == node {
					on++
				}
			}
			if len(al) != 2 || on > most {
				return fmt.Errorf("a's allocation %v, want 2 slots, at most %d of %q", al, most, node)
			}
			return nil
		})
		return al
	}
	first := allocated("a runs", "", 0)[0]
	// Another namespace's pod takes one of first's two slots: one of a's
	// workers moves (a keeps one on first: its state lives there).
	other := otherPod("other", "db", first, corev1.ResourceList{SlotResource: q("1")}, false)
	other.Spec.Containers[0].Resources.Limits = other.Spec.Containers[0].Resources.Requests // extended resources: limit = request
	if _, err := e.admin.CoreV1().Pods("other").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	allocated("a gives up a slot of the node another pod took it of", first, 1)
	if err := e.admin.CoreV1().Pods("other").Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// first cordoned, a leaves it.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := e.admin.CoreV1().Nodes().Get(ctx, first, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Unschedulable = true
		_, err = e.admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	allocated("a leaves the cordoned node", first, 0)

	// A burst of other pods bound to a node, each a change that calls for
	// a round: the rounds keep MinRoundGap between them.
	before, began := r.rounds.Load(), time.Now()
	// Changes for three gaps (at most 300 pods): without the gap the rounds
	// would follow each other EventDelay apart.
	for i := 0; i < 300 && time.Since(began) < 3*gap; i++ {
		p := otherPod("other", fmt.Sprintf("burst-%d", i), first, corev1.ResourceList{corev1.ResourceCPU: q("10m")}, false)
		if _, err := e.admin.CoreV1().Pods("other").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for a round to end after the burst (the rounds counted are
	// those that ended between began and now).
	created := r.rounds.Load()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	var after int64
	if err := testdaemon.WaitFor(wctx, 50*time.Millisecond, func() error {
		if after = r.rounds.Load(); after == created {
			return fmt.Errorf("no round since the burst ended")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(began)
	// Rounds start at least gap apart (from the previous one's end), so in
	// elapsed at most elapsed/gap + 1 of them end.
	if n, most := after-before, int64(elapsed/gap)+1; n > most {
		t.Fatalf("%d rounds in %v of a burst of changes, want at most %d (MinRoundGap %v)", n, elapsed, most, gap)
	}
}
