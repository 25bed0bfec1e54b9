package service

import (
	"context"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// applyManifest applies deploy/kubernetes/gorovod.yaml (testkube.ApplyManifest).
func applyManifest(ctx context.Context, t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	if err := testkube.ApplyManifest(ctx, dyn, "../../../deploy/kubernetes/gorovod.yaml"); err != nil {
		t.Fatal(err)
	}
}

// fakeNodes registers nodes through the API, with slots from their label,
// and keeps them Ready by renewing their node leases as a kubelet would
// (the controller manager marks a silent node's readiness Unknown).
func fakeNodes(ctx context.Context, t *testing.T, admin kubernetes.Interface, slots int, names ...string) {
	t.Helper()
	for _, name := range names {
		n := labelNode(name, slots)
		n.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The controller manager edits a new node too (taints): retry.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Status.Conditions = n.Status.Conditions
			_, err = admin.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	renew := func() {
		for _, name := range names {
			now := metav1.NewMicroTime(time.Now())
			l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				secs := int32(40)
				l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &now}}
				_, _ = admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, l, metav1.CreateOptions{})
				continue
			}
			if err == nil {
				l.Spec.RenewTime = &now
				_, _ = admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{})
			}
		}
	}
	renew()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				renew()
			}
		}
	}()
	t.Cleanup(func() { <-done })
}

// write is a change of a job's scheduler fields, seen in the watch.
type write struct {
	rv   int64
	job  string
	by   string
	node []string
}

// leaseHolder is the Lease's holder from a revision on.
type leaseHolder struct {
	rv     int64
	holder string
}

// recorder watches the Lease and the jobs from one revision on and keeps
// every change of holder and every write of the scheduler's fields. The
// API server's resource versions are etcd's revisions, one sequence for
// every resource of the cluster, so the two are ordered against each other.
type recorder struct {
	mu      sync.Mutex
	writes  []write
	holders []leaseHolder
	done    chan struct{}
}

func record(ctx context.Context, t *testing.T, admin kubernetes.Interface, dyn dynamic.Interface, jobNS string) *recorder {
	t.Helper()
	r := &recorder{done: make(chan struct{})}
	leases, err := admin.CoordinationV1().Leases("gorovod-system").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=gorovod-scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := dyn.Resource(api.GroupVersionResource()).Namespace(jobNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := func(o metav1.Object) int64 {
		v, err := strconv.ParseInt(o.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Errorf("resource version %q: %v", o.GetResourceVersion(), err)
		}
		return v
	}
	last := map[types.UID]api.Status{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ev := range leases.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			h := ""
			if l.Spec.HolderIdentity != nil {
				h = *l.Spec.HolderIdentity
			}
			r.mu.Lock()
			r.holders = append(r.holders, leaseHolder{rv(l), h})
			r.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for ev := range jobs.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			j, err := api.FromUnstructured(u)
			if err != nil {
				t.Error(err)
				continue
			}
			now := schedulerFields(j.Status)
			if prev := last[j.UID]; !sameFields(prev, now) || prev.ScheduledBy != now.ScheduledBy {
				r.mu.Lock()
				r.writes = append(r.writes, write{rv(u), j.Name, now.ScheduledBy, now.Allocation})
				r.mu.Unlock()
			}
			last[j.UID] = now
		}
	}()
	go func() {
		<-ctx.Done()
		leases.Stop()
		jobs.Stop()
		wg.Wait()
		close(r.done)
	}()
	return r
}

// check fails the test where a write came from a replica that did not hold
// the Lease at that revision, and returns the writers seen.
func (r *recorder) check(t *testing.T) map[string]int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range violations(r.writes, r.holders) {
		t.Error(v)
	}
	by := map[string]int{}
	for _, w := range r.writes {
		if w.by != "" {
			by[w.by]++
		}
	}
	return by
}

// violations lists the writes (in revision order) made by a replica other
// than the Lease's holder at the write's revision (holders in revision
// order); a write without a writer is the job as submitted.
func violations(writes []write, holders []leaseHolder) []string {
	var out []string
	for _, w := range writes {
		if w.by == "" {
			continue
		}
		holder := ""
		for _, h := range holders {
			if h.rv < w.rv {
				holder = h.holder
			}
		}
		if holder != w.by {
			out = append(out, fmt.Sprintf("%s wrote %s (%v) at revision %d while the Lease was %q's", w.by, w.job, w.node, w.rv, holder))
		}
	}
	return out
}

// replica is one scheduler replica the test runs.
type replica struct {
	svc    *Service
	rounds atomic.Int64 // rounds run as the leader, without error
	cancel context.CancelFunc
	done   chan error
}

func startReplica(ctx context.Context, t *testing.T, restCfg *rest.Config, identity string, edit func(*Config)) *replica {
	t.Helper()
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Identity, cfg.Interval = identity, 3*time.Second
	cfg.LeaderElection.Enabled = true
	cfg.LeaderElection.LeaseDuration, cfg.LeaderElection.RenewDeadline, cfg.LeaderElection.RetryPeriod = 6*time.Second, 4*time.Second, time.Second
	if edit != nil {
		edit(&cfg)
	}
	r := &replica{done: make(chan error, 1)}
	cfg.OnRound = func(err error) {
		if err == nil {
			r.rounds.Add(1)
		}
	}
	svc, err := New(cfg, kube, dyn)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r.svc, r.cancel = svc, cancel
	go func() { r.done <- svc.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("replica %s: %v", identity, err)
		}
	})
	return r
}

// stop stops a replica and waits for it.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Errorf("replica %s: %v", r.svc.Identity(), err)
	}
	r.done <- nil // for the cleanup
}

// e2e is a control plane with gorovod.yaml applied, a namespace for jobs and
// nodes of two slots registered through the API.
type e2e struct {
	t        *testing.T
	ctx      context.Context
	cp       *testkube.ControlPlane
	admin    kubernetes.Interface
	adminDyn dynamic.Interface
	jobs     dynamic.ResourceInterface
	ns       string
	// token is the scheduler's service account's.
	token string
}

// newE2E sets up an e2e with namespace ns for jobs and the nodes named
// (two slots each).
func newE2E(ctx context.Context, t *testing.T, cp *testkube.ControlPlane, ns string, nodes ...string) *e2e {
	t.Helper()
	adminDyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	applyManifest(ctx, t, adminDyn)
	admin := cp.AdminClient(ctx, t, ns)
	if err := cp.WaitForServiceAccount(ctx, admin, "gorovod-system"); err != nil {
		t.Fatal(err)
	}
	fakeNodes(ctx, t, admin, 2, nodes...)
	tok, err := admin.CoreV1().ServiceAccounts("gorovod-system").CreateToken(ctx, "gorovod-scheduler",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &e2e{t: t, ctx: ctx, cp: cp, admin: admin, adminDyn: adminDyn,
		jobs: adminDyn.Resource(api.GroupVersionResource()).Namespace(ns), ns: ns, token: tok.Status.Token}
}

func (e *e2e) submit(name string, minW, maxW int32) {
	e.t.Helper()
	j := &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: api.Spec{Image: "gorovod-examples:test", Command: []string{"synthetic"}, MinWorkers: minW, MaxWorkers: maxW}}
	u, err := api.ToUnstructured(j)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.jobs.Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *e2e) get(name string) *api.GorovodJob {
	e.t.Helper()
	u, err := e.jobs.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	j, err := api.FromUnstructured(u)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

// until waits for the jobs to satisfy cond (and checks their placement).
func (e *e2e) until(what string, limit time.Duration, cond func(map[string]*api.GorovodJob) error) {
	e.t.Helper()
	wctx, wcancel := context.WithTimeout(e.ctx, limit)
	defer wcancel()
	if err := testdaemon.WaitFor(wctx, 200*time.Millisecond, func() error {
		l, err := e.jobs.List(wctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		m := map[string]*api.GorovodJob{}
		for i := range l.Items {
			j, err := api.FromUnstructured(&l.Items[i])
			if err != nil {
				return err
			}
			m[j.Name] = j
		}
		if err := cond(m); err != nil {
			return err
		}
		return checkPlacement(m)
	}); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// holder waits for the scheduler's Lease to be identity's.
func (e *e2e) holder(identity string) {
	e.t.Helper()
	if err := testdaemon.WaitFor(e.ctx, 100*time.Millisecond, func() error {
		l, err := e.admin.CoordinationV1().Leases("gorovod-system").Get(e.ctx, "gorovod-scheduler", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != identity {
			return fmt.Errorf("the lease is not %s's: %+v", identity, l.Spec)
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// running is a condition: the jobs run with at least their minimums.
func running(names ...string) func(map[string]*api.GorovodJob) error {
	return func(m map[string]*api.GorovodJob) error {
		for _, n := range names {
			if j := m[n]; j == nil || j.Status.Phase != api.PhaseRunning || len(j.Status.Allocation) < int(j.Spec.MinWorkers) {
				return fmt.Errorf("%s is not running: %+v", n, j)
			}
		}
		return nil
	}
}

// TestAgainstAPIServer runs two scheduler replicas with leader election
// against a real kube-apiserver and controller manager, as the service
// account of deploy/kubernetes/gorovod.yaml (whose objects the test applies):
// three jobs arrive at different times on two nodes of two slots registered
// through the API (their pods do not run: the test plays their drivers and
// kubelet); allocations change as they arrive and end; the leader is stopped
// and the other replica takes over within the lease duration, continuing from
// the recorded allocations; a cordoned node's workers move; deleting a job
// deletes its driver pod; and no write ever comes from a replica that did not
// hold the Lease at the time.
func TestAgainstAPIServer(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const ns = "ml"
	e := newE2E(ctx, t, cp, ns, "n1", "n2")
	admin, adminDyn, jobs, submit, get, until := e.admin, e.adminDyn, e.jobs, e.submit, e.get, e.until
	recCtx, stopRecording := context.WithCancel(ctx)
	rec := record(recCtx, t, admin, adminDyn, ns)

	// Each replica's metrics, as `gorovod scheduler --metrics-addr` serves them.
	metricsOf := map[string]*Metrics{}
	withMetrics := func(c *Config) {
		m, err := NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		c.Metrics, metricsOf[c.Identity] = m, m
	}
	a := startReplica(ctx, t, cp.ConfigFor(e.token), "sched-a", withMetrics)
	b := startReplica(ctx, t, cp.ConfigFor(e.token), "sched-b", withMetrics)
	submit("first", 1, 4)
	until("first runs", time.Minute, running("first"))
	// Play first's driver, as its own service account (which the scheduler
	// bound in ml): it reports its world size; the scheduler's fields stay.
	driverTok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, DriverServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	driverDyn, err := dynamic.NewForConfig(cp.ConfigFor(driverTok.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	before := get("first").Status
	if _, err := driverDyn.Resource(api.GroupVersionResource()).Namespace(ns).Patch(ctx, "first", types.MergePatchType,
		fmt.Appendf(nil, `{"status":{"worldSize":%d,"step":10}}`, len(before.Allocation)), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("the driver's status patch: %v", err)
	}
	if _, err := driverDyn.Resource(api.GroupVersionResource()).Namespace(ns).Patch(ctx, "first", types.MergePatchType,
		[]byte(`{"spec":{"maxWorkers":1}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the driver patched its job's spec: %v", err)
	}
	if after := get("first").Status; after.WorldSize != int32(len(before.Allocation)) || !slices.Equal(after.Allocation, before.Allocation) {
		t.Fatalf("after the driver's patch: %+v", after)
	}

	submit("second", 2, 2)
	until("second runs beside first", time.Minute, running("first", "second"))

	// Stop the leader; the other takes over within the lease duration.
	leader, other := a, b
	if l, err := admin.CoordinationV1().Leases("gorovod-system").Get(ctx, "gorovod-scheduler", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if *l.Spec.HolderIdentity == "sched-b" {
		leader, other = b, a
	}
	held := map[string]api.Status{"first": get("first").Status, "second": get("second").Status}
	stopped := time.Now()
	// The leader's metrics say it leads and what its last round left; the
	// other's say it does not lead and ran no round.
	until("the leader's metrics", time.Minute, func(map[string]*api.GorovodJob) error {
		if n := testutil.ToFloat64(metricsOf[leader.svc.Identity()].jobs.WithLabelValues("Running")); n != 2 {
			return fmt.Errorf("%v running jobs", n)
		}
		return nil
	})
	lm, om := metricsOf[leader.svc.Identity()], metricsOf[other.svc.Identity()]
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"the leader's gorovod_scheduler_leader", testutil.ToFloat64(lm.leader), 1},
		{"the other's gorovod_scheduler_leader", testutil.ToFloat64(om.leader), 0},
		{"the other's ok rounds", testutil.ToFloat64(om.rounds.WithLabelValues("ok")), 0},
		{"the leader's slots", testutil.ToFloat64(lm.slots), 4},
		{"the leader's allocated slots", testutil.ToFloat64(lm.allocated), float64(len(get("first").Status.Allocation) + len(get("second").Status.Allocation))},
		{"the leader's pending jobs", testutil.ToFloat64(lm.jobs.WithLabelValues("Pending")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if n := testutil.ToFloat64(lm.rounds.WithLabelValues("ok")); n < 2 || testutil.CollectAndCount(lm.roundTime) != 1 {
		t.Errorf("the leader's ok rounds: %v", n)
	}
	leader.stop(t)
	if v := testutil.ToFloat64(lm.leader); v != 0 {
		t.Errorf("a stopped replica's gorovod_scheduler_leader: %v", v)
	}
	e.holder(other.svc.Identity())
	took := time.Since(stopped)
	t.Logf("%s took over %v after %s stopped", other.svc.Identity(), took.Round(time.Millisecond), leader.svc.Identity())
	if took > other.svc.cfg.LeaderElection.LeaseDuration {
		t.Errorf("the takeover took %v, more than the lease duration", took)
	}
	// The new leader continues: two rounds of its own move nothing.
	since := other.rounds.Load()
	if err := testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
		if n := other.rounds.Load() - since; n < 2 {
			return fmt.Errorf("%d rounds by the new leader", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for name, st := range held {
		now := get(name).Status
		if !slices.Equal(now.Allocation, st.Allocation) || now.Reallocations != st.Reallocations || now.ScheduledBy != st.ScheduledBy {
			t.Errorf("%s was changed by the takeover: %v by %s → %v by %s", name, st.Allocation, st.ScheduledBy, now.Allocation, now.ScheduledBy)
		}
	}
	submit("third", 1, 2)
	until("third is seen by the new leader", time.Minute, func(m map[string]*api.GorovodJob) error {
		if j := m["third"]; j == nil || j.Status.ScheduledBy != other.svc.Identity() {
			return fmt.Errorf("third: %+v", j)
		}
		return nil
	})
	// first's driver exits 0 (the test plays its kubelet): it succeeds,
	// and third runs on its slots.
	pod, err := admin.CoreV1().Pods(ns).Get(ctx, DriverPodName("first"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodSucceeded
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("first succeeds, third runs", time.Minute, func(m map[string]*api.GorovodJob) error {
		if j := m["first"]; j.Status.Phase != api.PhaseSucceeded || j.Status.Allocation != nil {
			return fmt.Errorf("first: %+v", j.Status)
		}
		return running("second", "third")(m)
	})
	// Cordon n1: its workers move to n2 or wait.
	n1, err := admin.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1.Spec.Unschedulable = true
	if _, err := admin.CoreV1().Nodes().Update(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("nothing on the cordoned n1", time.Minute, func(m map[string]*api.GorovodJob) error {
		for _, j := range m {
			if slices.Contains(j.Status.Allocation, "n1") {
				return fmt.Errorf("%s is on n1: %v", j.Name, j.Status.Allocation)
			}
		}
		return nil
	})
	// Deleting a job deletes its driver pod (the garbage collector, through
	// the owner reference).
	if err := jobs.Delete(ctx, "second", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testdaemon.WaitFor(ctx, 200*time.Millisecond, func() error {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, DriverPodName("second"), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("second's driver pod is still there: %v", err)
	}); err != nil {
		t.Fatal(err)
	}
	stopRecording()
	<-rec.done
	by := rec.check(t)
	t.Logf("writes by replica: %v; lease holders: %d records", by, len(rec.holders))
	if by[leader.svc.Identity()] == 0 || by[other.svc.Identity()] == 0 {
		t.Errorf("both replicas should have led and written: %v", by)
	}
}

// checkPlacement fails where a node holds more workers than its two slots.
func checkPlacement(m map[string]*api.GorovodJob) error {
	used := map[string]int{}
	for _, j := range m {
		for _, n := range j.Status.Allocation {
			used[n]++
		}
	}
	for n, k := range used {
		if k > 2 {
			return fmt.Errorf("node %s holds %d workers of 2 slots", n, k)
		}
	}
	return nil
}
