package kube

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	"github.com/gorovod/gorovod/job"
)

// manifest decodes the objects of a file in deploy/kubernetes.
func manifest(t *testing.T, name string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// apply creates the objects in namespace (dry: validated, not stored).
func apply(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string, dry bool, objs ...runtime.Object) {
	t.Helper()
	opts := metav1.CreateOptions{}
	if dry {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(ns).Create(ctx, o, opts)
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(ns).Create(ctx, o, opts)
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(ns).Create(ctx, o, opts)
		case *batchv1.Job:
			_, err = client.BatchV1().Jobs(ns).Create(ctx, o, opts)
		case *networkingv1.NetworkPolicy:
			_, err = client.NetworkingV1().NetworkPolicies(ns).Create(ctx, o, opts)
		default:
			t.Fatalf("no way to apply a %T", obj)
		}
		if err != nil {
			t.Fatalf("applying %T: %v", obj, err)
		}
	}
}

// TestAgainstAPIServer runs the provisioner against a real kube-apiserver
// (RBAC, admission, validation) and kube-controller-manager (service
// accounts, garbage collection), as the service account of
// deploy/kubernetes/rbac.yaml: the Role lets it do its work and nothing
// else; its pods and Service validate; the watch reports growth, shrinking,
// preemption and deletion; deleting the driver's pod deletes the workers,
// their Secret and their Service.
func TestAgainstAPIServer(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "gorovod-e2e"
	admin := cp.AdminClient(ctx, t, ns, "elsewhere")
	apply(ctx, t, admin, ns, false, manifest(t, "rbac.yaml")...)
	// The driver manifest validates (dry run: nothing would run it here).
	apply(ctx, t, admin, ns, true, manifest(t, "driver.yaml")...)
	apply(ctx, t, admin, ns, false, manifest(t, "networkpolicy.yaml")...)

	// Act as the driver's service account.
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "gorovod-driver",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	driverClient, err := kubernetes.NewForConfig(cp.ConfigFor(tok.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	// The driver's pod (no kubelet runs it; it owns the workers).
	driverPod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "synthetic-driver", Labels: map[string]string{LabelJob: "synthetic", LabelRole: "driver"}},
		Spec: corev1.PodSpec{ServiceAccountName: "gorovod-driver", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "driver", Image: "gorovod-examples:latest"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ev := newEvents()
	cfg := Config{
		Client: driverClient, Namespace: ns, Job: "synthetic", Image: "gorovod-examples:latest",
		Command:   []string{"/usr/local/bin/synthetic", "--steps", "2000"},
		Env:       []corev1.EnvVar{{Name: envconfig.EnvJobID, Value: "job-e2e"}, {Name: envconfig.EnvSeeds, Value: "198.18.0.2:7946"}},
		SecretEnv: SecretEnv(bytes.Repeat([]byte{0x5e}, 32)),
		Owner:     &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: driverPod.Name, UID: driverPod.UID},
		Grace:     time.Second, OnEvent: ev.add,
	}
	// A Secret made in advance under the name a stranger would guess for
	// the job's: the workers must not read it, and it is left alone.
	planted := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "synthetic-secret", Labels: map[string]string{LabelJob: "synthetic"}},
		StringData: map[string]string{envconfig.EnvSecret: "planted"}}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, planted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if p.SecretName() == planted.Name {
		t.Fatalf("the job's Secret is named %s, a name computed without the job secret", planted.Name)
	}

	// Grow: the pods, the Secret and the Service pass validation and
	// admission, as the driver's service account.
	if err := p.Start(ctx, 3); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, PodCreated, 3, time.Minute)
	stored, err := admin.CoreV1().Pods(ns).Get(ctx, "synthetic-worker-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Spec.ServiceAccountName != "default" || stored.Spec.Hostname != "synthetic-worker-0" || stored.OwnerReferences[0].UID != driverPod.UID {
		t.Fatalf("stored pod: %+v", stored.Spec)
	}
	if b, _ := stored.Marshal(); bytes.Contains(b, []byte(strings.Repeat("5e", 32))) {
		t.Fatal("the job secret is in the stored pod")
	}
	for _, e := range stored.Spec.Containers[0].Env {
		if e.Name == envconfig.EnvSecret && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != p.SecretName()) {
			t.Fatalf("the workers read the secret from %+v, not %s", e.ValueFrom, p.SecretName())
		}
	}
	secret, err := admin.CoreV1().Secrets(ns).Get(ctx, p.SecretName(), metav1.GetOptions{})
	if err != nil || string(secret.Data[envconfig.EnvSecret]) != strings.Repeat("5e", 32) {
		t.Fatalf("secret: %v %v", secret, err)
	}
	svc, err := admin.CoreV1().Services(ns).Get(ctx, "synthetic", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("service: %+v %v", svc, err)
	}

	// Play the kubelet for worker 0: it runs, then is preempted (exit 143).
	setStatusIn := func(name string, edit func(*corev1.PodStatus)) {
		t.Helper()
		pod, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(&pod.Status)
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setStatusIn("synthetic-worker-0", running)
	ev.wait(t, PodRunning, 1, time.Minute)
	setStatusIn("synthetic-worker-0", exited(143))
	if e := ev.wait(t, PodEnded, 1, time.Minute)[0]; e.Pod != "synthetic-worker-0" || !e.Preempted || e.ExitCode != 143 {
		t.Fatalf("ended: %+v", e)
	}

	// Shrink: worker 2 never exits by itself (no kubelet): Stop deletes it
	// after the grace period. Worker 0 has ended: Stop deletes it at once.
	for _, name := range []string{"synthetic-worker-2", "synthetic-worker-0"} {
		if err := p.Stop(ctx, heuristics.WorkerInfo{Name: name, Host: name}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := ev.wait(t, PodDeleted, 2, time.Minute)
	for _, d := range deleted {
		// Worker 0 stays preempted (it ended with 143); worker 2 was
		// removed by the engine, not preempted.
		if d.Reason != "deleted by the provisioner" || d.Preempted != (d.Pod == "synthetic-worker-0") {
			t.Errorf("deleted: %+v", d)
		}
	}
	if pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelRole + "=" + RoleWorker}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("workers after shrinking: %v %v", pods, err)
	}
	// Grow again.
	if err := p.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, PodCreated, 5, time.Minute)

	// The Role allows what the provisioner did and refuses the rest.
	refused := []struct {
		what string
		do   func() error
	}{
		{"get a pod", func() error {
			_, err := driverClient.CoreV1().Pods(ns).Get(ctx, "synthetic-worker-1", metav1.GetOptions{})
			return err
		}},
		{"update a pod", func() error {
			_, err := driverClient.CoreV1().Pods(ns).Update(ctx, stored, metav1.UpdateOptions{})
			return err
		}},
		{"read the secret", func() error {
			_, err := driverClient.CoreV1().Secrets(ns).Get(ctx, p.SecretName(), metav1.GetOptions{})
			return err
		}},
		{"list secrets", func() error { _, err := driverClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err }},
		{"create a configmap", func() error {
			_, err := driverClient.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}},
		{"create a pod in another namespace", func() error {
			pod := p.WorkerPod(99)
			pod.Namespace = "elsewhere"
			_, err := driverClient.CoreV1().Pods("elsewhere").Create(ctx, pod, metav1.CreateOptions{})
			return err
		}},
		{"list pods in another namespace", func() error {
			_, err := driverClient.CoreV1().Pods("elsewhere").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create a job", func() error {
			_, err := driverClient.BatchV1().Jobs(ns).Create(ctx, manifest(t, "driver.yaml")[0].(*batchv1.Job), metav1.CreateOptions{})
			return err
		}},
		{"grant itself more", func() error {
			_, err := driverClient.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "more"}}, metav1.CreateOptions{})
			return err
		}},
		{"delete the namespace", func() error { return driverClient.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) }},
	}
	for _, r := range refused {
		if err := r.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: want forbidden, got %v", r.what, err)
		}
	}

	// Deleting the driver's pod deletes its workers, Secret and Service
	// (the controller manager's garbage collector follows the owner
	// references).
	if err := admin.CoreV1().Pods(ns).Delete(ctx, driverPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var state string
	gone := func() bool {
		pods, err1 := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		_, err2 := admin.CoreV1().Secrets(ns).Get(ctx, p.SecretName(), metav1.GetOptions{})
		_, err3 := admin.CoreV1().Services(ns).Get(ctx, "synthetic", metav1.GetOptions{})
		state = fmt.Sprintf("pods %v (%v), secret %v, service %v", pods, err1, err2, err3)
		return err1 == nil && len(pods.Items) == 0 && apierrors.IsNotFound(err2) && apierrors.IsNotFound(err3)
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !gone() {
		select {
		case <-deadline.C:
			t.Fatalf("2 minutes after deleting the driver: %s", state)
		case <-tick.C:
		}
	}
	if kept, err := admin.CoreV1().Secrets(ns).Get(ctx, planted.Name, metav1.GetOptions{}); err != nil || string(kept.Data[envconfig.EnvSecret]) != "planted" {
		t.Errorf("the Secret made in advance: %v %v", kept, err)
	}
	// The watch saw the workers go, deleted by someone else: preempted.
	for _, d := range ev.wait(t, PodDeleted, 5, time.Minute)[2:] {
		if !d.Preempted || d.Reason != "deleted by someone else" {
			t.Errorf("deleted with the driver: %+v", d)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// podHelperNode starts a node (a kubelet with containerd and runc) whose
// pause image and worker image (gorovod.local/worker:test, entrypoint
// /bin/worker) are both testdata/podhelper.
func podHelperNode(t *testing.T, cp *testkube.ControlPlane) *testkube.Node {
	t.Helper()
	helper := testkube.BuildStatic(t, "./testdata/podhelper")
	return cp.NewNode(t, testkube.NodeConfig{
		PauseRef: "gorovod.local/pause:test",
		Images: []testkube.Image{
			{Ref: "gorovod.local/pause:test", Files: map[string]string{"bin/pause": helper}, Entrypoint: []string{"/bin/pause", "pause"}},
			{Ref: "gorovod.local/worker:test", Files: map[string]string{"bin/worker": helper}, Entrypoint: []string{"/bin/worker"}},
		},
	})
}

// TestPodsOnKubelet runs worker pods for real: a kubelet with containerd and
// runc, the images built here. The provisioner's pods start, get their
// secret through the Secret and their name through the downward API; a
// worker the engine removes gets SIGTERM from the kubelet and its pod goes;
// a worker whose pod someone else deletes (a drain, a preemption) gets
// SIGTERM, exits 143 and is reported preempted.
func TestPodsOnKubelet(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	node := podHelperNode(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "gorovod-kubelet"
	admin := cp.AdminClient(ctx, t, ns)
	ev := newEvents()
	secret := bytes.Repeat([]byte{0x5e}, 32)
	p, err := New(ctx, Config{
		Client: admin, Namespace: ns, Job: "onnode", Image: "gorovod.local/worker:test", Command: []string{"/bin/worker", "worker"},
		Env:       []corev1.EnvVar{{Name: envconfig.EnvSeeds, Value: "198.18.0.2:7946"}},
		SecretEnv: SecretEnv(secret), Grace: 2 * time.Second, PendingTimeout: 2 * time.Minute, OnEvent: ev.add,
		Customize: func(pod *corev1.Pod) {
			// No scheduler and no CNI plugin here (package testkube).
			pod.Spec.NodeName, pod.Spec.HostNetwork = node.Name, true
			pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if err := p.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, PodRunning, 2, 2*time.Minute)
	logOf := func(pod string) string {
		matches, _ := filepath.Glob(filepath.Join(node.LogDir, ns+"_"+pod+"_*", ContainerName, "*.log"))
		var b strings.Builder
		for _, m := range matches {
			data, _ := os.ReadFile(m)
			b.Write(data)
		}
		return b.String()
	}
	waitLog := func(pod, want string) {
		t.Helper()
		deadline := time.NewTimer(time.Minute)
		defer deadline.Stop()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !strings.Contains(logOf(pod), want) {
			select {
			case <-deadline.C:
				t.Fatalf("%s never printed %q; its log: %q", pod, want, logOf(pod))
			case <-tick.C:
			}
		}
	}
	for i, pod := range []string{"onnode-worker-0", "onnode-worker-1"} {
		// (Its host name is the node's: host-network pods share the
		// node's UTS namespace; the engine, which knows workers by host
		// name, is given the pod name below as it would see it without
		// hostNetwork.)
		waitLog(pod, "ready ")
		waitLog(pod, "env GOROVOD_POD_NAME="+pod+"\n")
		waitLog(pod, "env GOROVOD_SECRET="+strings.Repeat("5e", 32)+"\n")
		waitLog(pod, fmt.Sprintf("env GOROVOD_LAUNCH_INDEX=%d\n", i))
	}

	// The engine removes worker 0: after the grace period its pod is
	// deleted, the kubelet sends SIGTERM, the pod goes.
	if err := p.Stop(ctx, heuristics.WorkerInfo{Name: "w0", Host: "onnode-worker-0"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logOf("onnode-worker-0"), "term") && !p.Workers()[0].Deleted {
		t.Fatalf("worker 0 after Stop: %+v", p.Workers()[0])
	}
	// Someone else deletes worker 1's pod.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "onnode-worker-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var ended *Event
	for _, e := range ev.wait(t, PodDeleted, 2, 2*time.Minute) {
		if e.Pod == "onnode-worker-1" {
			ended = &e
		}
	}
	if ended == nil || !ended.Preempted {
		t.Fatalf("worker 1 deleted by someone else: %+v; all events %+v", ended, ev.all)
	}
	for _, e := range ev.of(PodEnded) {
		// Both got SIGTERM and left with 143; only worker 1 was preempted.
		if e.ExitCode != 143 || e.Preempted != (e.Pod == "onnode-worker-1") {
			t.Fatalf("ended: %+v", e)
		}
	}
	if len(ev.of(PodEnded)) != 2 {
		t.Fatalf("ended events: %+v", ev.of(PodEnded))
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSlotHandOverOnKubelet hands a node's one worker slot (the extended
// resource gorovod.io/slot, as an operator advertises it) from one worker to
// the next, as the gorovod scheduler does when it moves a slot to another
// job or gives a job back a slot it had just taken away: worker 0 holds the
// slot and takes 3 s to leave after its SIGTERM (a trainer finishing its
// step), and worker 1 is launched on the node the moment worker 0 is told
// to go. The kubelet counts a terminating pod's resources, so it rejects
// worker 1's pod (OutOfgorovod.io/slot); the launcher reports the rejection
// and makes the pod again until the slot is free: worker 1 runs, its
// process does not end, and worker 0 ends as a worker the job stopped.
func TestSlotHandOverOnKubelet(t *testing.T) {
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skipf("no Kubernetes node here: %s", why)
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	node := podHelperNode(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "gorovod-handover"
	admin := cp.AdminClient(ctx, t, ns)
	if _, err := admin.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType,
		[]byte(`{"status":{"capacity":{"gorovod.io/slot":"1"}}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if q := n.Status.Allocatable["gorovod.io/slot"]; err == nil && q.Value() == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the node's slot is not allocatable")
		case <-time.After(100 * time.Millisecond): // polling the API server, as kubectl wait does
		}
	}
	ev := newEvents()
	slot := corev1.ResourceList{"gorovod.io/slot": resource.MustParse("1")}
	l, err := NewLauncher(ctx, Config{
		Client: admin, Namespace: ns, Job: "handover", Image: "gorovod.local/worker:test",
		Env:   []corev1.EnvVar{{Name: "PODHELPER_TERM_DELAY", Value: "3s"}},
		Grace: 10 * time.Second, PendingTimeout: 2 * time.Minute, OnEvent: ev.add,
		NodeName:  func(host string) string { n, _, _ := strings.Cut(host, "/"); return n },
		Resources: corev1.ResourceRequirements{Limits: slot, Requests: slot},
		Customize: func(pod *corev1.Pod) {
			// No CNI plugin here (package testkube).
			pod.Spec.HostNetwork = true
			pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	launch := func(i int) job.Process {
		t.Helper()
		p, err := l.Launch(ctx, job.LaunchRequest{Index: i, Host: node.Name + "/0", Argv: []string{"/bin/worker", "worker"},
			Env: []string{envconfig.EnvSecret + "=" + strings.Repeat("5e", 32)}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	w0 := launch(0)
	ev.wait(t, PodRunning, 1, 2*time.Minute)

	// Worker 0 is told to go; worker 1 takes its slot at once.
	if err := w0.Signal(job.LeaveSignal); err != nil {
		t.Fatal(err)
	}
	w1 := launch(1)
	rejected := ev.wait(t, PodRejected, 1, time.Minute)
	if r := rejected[0]; r.Pod != "handover-worker-1" || !strings.Contains(r.Reason, "OutOfgorovod.io/slot") {
		t.Fatalf("rejection %+v, want worker 1's for want of the slot", r)
	}
	running := ev.wait(t, PodRunning, 2, 2*time.Minute)
	if running[1].Pod != "handover-worker-1" {
		t.Fatalf("running: %+v", running)
	}
	select {
	case <-w0.Done():
	default:
		t.Fatal("worker 1 runs while worker 0's process has not ended")
	}
	if err := w0.Err(); !job.KilledBySignal(err) {
		t.Errorf("worker 0 (SIGTERM, exit 143) ended with %v", err)
	}
	select {
	case <-w1.Done():
		t.Fatalf("worker 1's process ended: %v", w1.Err())
	default:
	}
	for _, e := range ev.of(PodEnded) {
		if e.Pod == "handover-worker-1" {
			t.Fatalf("worker 1's pod ended: %+v", e)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w1.Done():
	case <-ctx.Done():
		t.Fatal("worker 1 not ended by Close")
	}
}
