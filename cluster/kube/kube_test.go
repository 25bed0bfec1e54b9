package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
)

const testSecret = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"

// events records what a provisioner reports.
type events struct {
	mu     sync.Mutex
	all    []Event
	update chan struct{}
}

func newEvents() *events { return &events{update: make(chan struct{})} }

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	close(e.update)
	e.update = make(chan struct{})
}

func (e *events) of(kind EventKind) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// wait waits until n events of kind have been reported.
func (e *events) wait(t *testing.T, kind EventKind, n int, timeout time.Duration) []Event {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		update := e.update
		e.mu.Unlock()
		if got := e.of(kind); len(got) >= n {
			return got
		}
		select {
		case <-update:
		case <-deadline.C:
			t.Fatalf("%d %q events after %v, want %d; all: %+v", len(e.of(kind)), kind, timeout, n, e.all)
		}
	}
}

// watchedClientset is a fake clientset that counts the pod watches begun on
// it. An informer lists, then watches, and the fake delivers no event of
// what changed in between: a test that made a pod before a provisioner's
// watch began would wait for its events in vain (seen in CI, under load).
type watchedClientset struct {
	*fake.Clientset
	mu       sync.Mutex
	watches  int           // pod watches begun
	waited   int           // provisioners waitWatching has waited for
	watchNew chan struct{} // closed and replaced when a watch begins
}

func newClientset() *watchedClientset {
	c := &watchedClientset{Clientset: fake.NewClientset(), watchNew: make(chan struct{})}
	c.PrependWatchReactor("pods", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if a, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = a.ListOptions
		}
		w, err := c.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		c.mu.Lock()
		c.watches++
		close(c.watchNew)
		c.watchNew = make(chan struct{})
		c.mu.Unlock()
		return true, w, nil
	})
	return c
}

// waitWatching waits until the provisioner just made with client watches
// pods: one more pod watch than it waited for before.
func waitWatching(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	c, ok := client.(*watchedClientset)
	if !ok {
		return
	}
	c.mu.Lock()
	c.waited++
	want := c.waited
	c.mu.Unlock()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got, changed := c.watches, c.watchNew
		c.mu.Unlock()
		if got >= want {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%d pod watches begun, want %d", got, want)
		}
	}
}

func testConfig(client kubernetes.Interface, ev *events) Config {
	return Config{
		Client: client, Namespace: "ml", Job: "mnist", Image: "gorovod-examples:test", Command: []string{"/synthetic", "--steps", "100"},
		Env:       []corev1.EnvVar{{Name: envconfig.EnvJobID, Value: "job-1"}, {Name: envconfig.EnvSeeds, Value: "mnist-driver.mnist.ml.svc:7946"}},
		SecretEnv: map[string]string{envconfig.EnvSecret: testSecret},
		Owner:     &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "mnist-driver", UID: types.UID("0f0e")},
		Grace:     200 * time.Millisecond, PendingTimeout: time.Minute, OnEvent: ev.add,
	}
}

// newTest is a Provisioner started on cfg, watching, and closed when t
// ends.
func newTest(t *testing.T, cfg Config) *Provisioner {
	t.Helper()
	return startWatching(t, cfg, New)
}

// newTestLauncher is newTest's Launcher.
func newTestLauncher(t *testing.T, cfg Config) *Launcher {
	t.Helper()
	return startWatching(t, cfg, NewLauncher)
}

// startWatching starts what start makes of cfg (New, NewLauncher), waits until
// it watches, and closes it when t ends.
func startWatching[T interface{ Close(context.Context) error }](t *testing.T, cfg Config, start func(context.Context, Config) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	waitWatching(t, cfg.Client)
	return p
}

// setStatus plays the kubelet: it writes a pod's status.
func setStatus(t *testing.T, client kubernetes.Interface, name string, edit func(*corev1.PodStatus)) {
	t.Helper()
	pods := client.CoreV1().Pods("ml")
	pod, err := pods.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(&pod.Status)
	if _, err := pods.UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func running(s *corev1.PodStatus) {
	s.Phase = corev1.PodRunning
	s.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
}

func exited(code int32) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		s.Phase = corev1.PodFailed
		if code == 0 {
			s.Phase = corev1.PodSucceeded
		}
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}}
	}
}

// TestWorkerPod checks what a worker pod is made of: labels, no restarts,
// the secret by reference only, the downward API, its DNS name, its owner.
func TestWorkerPod(t *testing.T) {
	p := newTest(t, testConfig(newClientset(), newEvents()))
	pod := p.WorkerPod(3)
	b, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), testSecret) {
		t.Fatal("the job secret is in the pod spec")
	}
	c := pod.Spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"name", pod.Name == "mnist-worker-3"},
		{"labels", pod.Labels[LabelJob] == "mnist" && pod.Labels[LabelRole] == RoleWorker && pod.Labels[LabelIndex] == "3"},
		{"restartPolicy Never", pod.Spec.RestartPolicy == corev1.RestartPolicyNever},
		{"hostname is the pod name", pod.Spec.Hostname == pod.Name && pod.Spec.Subdomain == "mnist"},
		{"grace", *pod.Spec.TerminationGracePeriodSeconds == 1},
		{"no API token", !*pod.Spec.AutomountServiceAccountToken},
		{"owner", len(pod.OwnerReferences) == 1 && pod.OwnerReferences[0].Name == "mnist-driver"},
		{"secret by reference", env[envconfig.EnvSecret].ValueFrom != nil && env[envconfig.EnvSecret].ValueFrom.SecretKeyRef.Name == p.SecretName() && env[envconfig.EnvSecret].Value == ""},
		{"pod name", env[envconfig.EnvPodName].ValueFrom.FieldRef.FieldPath == "metadata.name"},
		{"pod IP", env[envconfig.EnvPodIP].ValueFrom.FieldRef.FieldPath == "status.podIP"},
		{"binds its pod IP", env[envconfig.EnvListenAddr].Value == "$(GOROVOD_POD_IP):0" && env[envconfig.EnvGossipAddr].Value == "$(GOROVOD_POD_IP)"},
		{"launch index", env[envconfig.EnvLaunchIndex].Value == "3"},
		{"job env", env[envconfig.EnvSeeds].Value == "mnist-driver.mnist.ml.svc:7946"},
		{"command", strings.Join(c.Command, " ") == "/synthetic --steps 100"},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("%s: pod %s", ch.what, b)
		}
	}
	for _, bad := range []string{"", "UPPER", "a_b", strings.Repeat("x", 41)} {
		cfg := testConfig(newClientset(), newEvents())
		cfg.Job = bad
		if _, err := New(context.Background(), cfg); err == nil {
			t.Errorf("job name %q accepted", bad)
		}
	}
}

// TestScaleUpDown: pods, Secret and Service appear; the watch reports each
// pod's creation, start, end and deletion once; Stop deletes a removed
// worker's pod after the grace period; Close removes everything.
func TestScaleUpDown(t *testing.T) {
	client := newClientset()
	ev := newEvents()
	p := newTest(t, testConfig(client, ev))
	ctx := context.Background()
	if err := p.Start(ctx, 3); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, PodCreated, 3, 10*time.Second)
	if _, err := client.CoreV1().Secrets("ml").Get(ctx, p.SecretName(), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("ml").Get(ctx, "mnist", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Fatalf("service %+v, %v", svc, err)
	}
	for i := range 3 {
		setStatus(t, client, fmt.Sprintf("mnist-worker-%d", i), running)
	}
	ev.wait(t, PodRunning, 3, 10*time.Second)

	// Worker 1 exits by itself once removed: Stop deletes its pod at once.
	setStatus(t, client, "mnist-worker-1", exited(0))
	ended := ev.wait(t, PodEnded, 1, 10*time.Second)
	if ended[0].Pod != "mnist-worker-1" || ended[0].Preempted {
		t.Fatalf("ended: %+v", ended)
	}
	t0 := time.Now()
	if err := p.Stop(ctx, heuristics.WorkerInfo{Name: "w1", Host: "mnist-worker-1", PID: 1}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 150*time.Millisecond {
		t.Errorf("Stop of a worker that had exited took %v", took)
	}
	// Worker 2 keeps running: Stop waits the grace period, then deletes it.
	t0 = time.Now()
	if err := p.Stop(ctx, heuristics.WorkerInfo{Name: "w2", Host: "mnist-worker-2", PID: 1}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took < 200*time.Millisecond {
		t.Errorf("Stop deleted a running worker after %v, before the grace period", took)
	}
	deleted := ev.wait(t, PodDeleted, 2, 10*time.Second)
	for _, d := range deleted {
		if d.Preempted {
			t.Errorf("a pod the provisioner deleted counts as preempted: %+v", d)
		}
	}
	// Not a pod of this job.
	if err := p.Stop(ctx, heuristics.WorkerInfo{Name: "x", Host: "laptop", PID: 7}); err != nil {
		t.Fatal(err)
	}
	pods, err := client.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "mnist-worker-0" {
		t.Fatalf("pods left after two stops: %+v %v", pods, err)
	}
	// Growing again continues the numbering.
	if err := p.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-3", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pods, _ = client.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
	svcs, _ := client.CoreV1().Services("ml").List(ctx, metav1.ListOptions{})
	secrets, _ := client.CoreV1().Secrets("ml").List(ctx, metav1.ListOptions{})
	if len(pods.Items)+len(svcs.Items)+len(secrets.Items) != 0 {
		t.Fatalf("left after Close: %d pods, %d services, %d secrets", len(pods.Items), len(svcs.Items), len(secrets.Items))
	}
	for _, kind := range []EventKind{PodCreated, PodRunning, PodDeleted} {
		seen := map[string]int{}
		for _, e := range ev.of(kind) {
			seen[e.Pod]++
			if seen[e.Pod] > 1 {
				t.Errorf("%s reported twice for %s", kind, e.Pod)
			}
		}
	}
}

// TestNeverRunning: a pod that never starts (unschedulable, no image) is
// deleted after PendingTimeout and reported as given up.
func TestNeverRunning(t *testing.T) {
	client := newClientset()
	ev := newEvents()
	cfg := testConfig(client, ev)
	cfg.PendingTimeout = 300 * time.Millisecond
	p := newTest(t, cfg)
	t0 := time.Now()
	if err := p.Start(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	setStatus(t, client, "mnist-worker-0", running)
	gaveUp := ev.wait(t, PodGaveUp, 1, 10*time.Second)
	if gaveUp[0].Pod != "mnist-worker-1" || time.Since(t0) < 300*time.Millisecond {
		t.Fatalf("gave up on %+v after %v", gaveUp, time.Since(t0))
	}
	ev.wait(t, PodDeleted, 1, 10*time.Second)
	ws := p.Workers()
	if len(ws) != 2 || ws[0].Deleted || !ws[1].Deleted {
		t.Fatalf("workers: %+v", ws)
	}
	if len(ev.of(PodGaveUp)) != 1 {
		t.Fatalf("gave up: %+v", ev.of(PodGaveUp))
	}
}

// TestPreemptionStorm: many workers preempted at once, their status written
// several times over, some deleted by someone else: each is reported ended
// exactly once, preempted or not as it should be, and replacements get new
// pods.
func TestPreemptionStorm(t *testing.T) {
	client := newClientset()
	ev := newEvents()
	p := newTest(t, testConfig(client, ev))
	ctx := context.Background()
	const n = 16
	if err := p.Start(ctx, n); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		setStatus(t, client, fmt.Sprintf("mnist-worker-%d", i), running)
	}
	ev.wait(t, PodRunning, n, 10*time.Second)
	// Workers 0-9: SIGTERM (exit 143); 10-11: a disruption condition and
	// SIGKILL (137); 12-13: deleted by someone else; 14-15: finished (0).
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("mnist-worker-%d", i)
			for range 3 {
				switch {
				case i < 10:
					setStatus(t, client, name, exited(143))
				case i < 12:
					setStatus(t, client, name, func(s *corev1.PodStatus) {
						exited(137)(s)
						s.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
					})
				case i < 14:
					_ = client.CoreV1().Pods("ml").Delete(ctx, name, metav1.DeleteOptions{})
					return
				default:
					setStatus(t, client, name, exited(0))
				}
			}
		}()
	}
	wg.Wait()
	endedEvents := ev.wait(t, PodEnded, 14, 10*time.Second) // all but the two deleted
	deletedEvents := ev.wait(t, PodDeleted, 2, 10*time.Second)
	preempted := 0
	for _, e := range endedEvents {
		want := e.Index < 12
		if e.Preempted != want {
			t.Errorf("%s (exit %d): preempted %v", e.Pod, e.ExitCode, e.Preempted)
		}
		if e.Preempted {
			preempted++
		}
	}
	for _, e := range deletedEvents {
		if !e.Preempted {
			t.Errorf("%s deleted by someone else is not preempted", e.Pod)
		}
		preempted++
	}
	if len(endedEvents) != 14 || preempted != 14 {
		t.Fatalf("%d ended events, %d preempted: %+v", len(endedEvents), preempted, endedEvents)
	}
	// The engine replaces the preempted workers.
	if err := p.Start(ctx, preempted); err != nil {
		t.Fatal(err)
	}
	created := ev.wait(t, PodCreated, n+preempted, 10*time.Second)
	if last := created[len(created)-1]; last.Pod != fmt.Sprintf("mnist-worker-%d", n+preempted-1) {
		t.Fatalf("last created: %+v", last)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pods, _ := client.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods left", len(pods.Items))
	}
}

// TestAdoptsEarlierWorkers: a driver that restarts finds the job's running
// workers and numbers new ones after them; pods of other jobs are ignored.
func TestAdoptsEarlierWorkers(t *testing.T) {
	client := newClientset()
	ctx := context.Background()
	earlier := newTest(t, testConfig(client, newEvents()))
	if err := earlier.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	other := testConfig(client, newEvents())
	other.Job = "other"
	if err := newTest(t, other).Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p := newTest(t, testConfig(client, newEvents()))
	if ws := p.Workers(); len(ws) != 2 || ws[1].Pod != "mnist-worker-1" {
		t.Fatalf("adopted: %+v", ws)
	}
	if err := p.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-2", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSecretOnlyTheJobCanName: a Secret made in advance under the job's
// guessable name is neither read by the workers nor touched; a driver with
// another job secret uses another Secret, and one with the same secret (a
// restarted driver adopting its predecessor's workers) the same.
func TestSecretOnlyTheJobCanName(t *testing.T) {
	client := newClientset()
	ctx := context.Background()
	planted := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mnist-secret", Namespace: "ml", Labels: map[string]string{LabelJob: "mnist"}},
		Data: map[string][]byte{envconfig.EnvSecret: []byte("planted")}}
	if _, err := client.CoreV1().Secrets("ml").Create(ctx, planted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := newTest(t, testConfig(client, newEvents()))
	if err := p.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ref string
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == envconfig.EnvSecret && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref = e.ValueFrom.SecretKeyRef.Name
		}
	}
	if ref == "" || ref == planted.Name || ref != p.SecretName() {
		t.Fatalf("the worker reads the secret from %q (the provisioner's: %q, made in advance: %q)", ref, p.SecretName(), planted.Name)
	}
	s, err := client.CoreV1().Secrets("ml").Get(ctx, ref, metav1.GetOptions{})
	if err != nil || s.StringData[envconfig.EnvSecret]+string(s.Data[envconfig.EnvSecret]) != testSecret {
		t.Fatalf("the job's Secret: %+v %v", s, err)
	}

	same := newTest(t, testConfig(client, newEvents()))
	other := testConfig(client, newEvents())
	other.SecretEnv = map[string]string{envconfig.EnvSecret: strings.Repeat("77", 32)}
	if got := same.SecretName(); got != p.SecretName() {
		t.Errorf("a driver with the same secret names its Secret %s, not %s", got, p.SecretName())
	}
	if got := newTest(t, other).SecretName(); got == p.SecretName() {
		t.Errorf("a driver with another secret names its Secret %s too", got)
	}

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	kept, err := client.CoreV1().Secrets("ml").Get(ctx, planted.Name, metav1.GetOptions{})
	if err != nil || string(kept.Data[envconfig.EnvSecret]) != "planted" {
		t.Fatalf("the Secret made in advance after Close: %+v %v", kept, err)
	}
	if _, err := client.CoreV1().Secrets("ml").Get(ctx, ref, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the job's Secret after Close: %v", err)
	}
}
