package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// followPodLogs feeds the trainer lines of the worker pods' logs under
// dir (a node's LogDir) to h until the returned stop is called; stop then
// takes the lines written last, and may be called again.
func followPodLogs(ctx context.Context, h *e2e.RunJobHarness, dir string) (stop func()) {
	logs := &e2e.PodLogs{Dir: dir, Read: map[string]int64{}, Partial: map[string]string{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		logs.Follow(ctx, h)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			logs.Poll(h)
		})
	}
}

// withKubelet starts a control plane and one real kubelet node running the
// trainer's images (e2e.TrainerImages), or skips t where this machine cannot
// run one. The node has an address of its own (testkube's
// NodeConfig.Reachable, 127.0.0.2), which its host-network pods get as
// status.podIP and their workers bind.
func withKubelet(t *testing.T) (*testkube.ControlPlane, *testkube.Node) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a job on a real kubelet; skipped with -short")
	}
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skipf("no Kubernetes node here: %s", why)
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	return cp, cp.NewNode(t, testkube.NodeConfig{Reachable: true, PauseRef: e2e.PauseImage, Images: e2e.TrainerImages(t)})
}

// TestKubernetesElasticJob runs an elastic job with `gorovod run
// --kubernetes` from outside the cluster (--kubeconfig): its workers are
// pods that a real kubelet runs (containerd, runc, the synthetic trainer in
// an image built here), created through a real API server. The fixed
// schedule grows the job from 2 to 3 pods; mid-run one worker's pod is
// deleted by someone else, as a preemption or a drain does: the kubelet
// sends SIGTERM, the worker leaves within its notice, and the engine starts a
// replacement pod. The job finishes with the workers agreeing on the
// parameters at every step and every sample of each data epoch trained on
// once, and leaves no pod, Secret or Service behind. The node has an address
// of its own, its pods' status.podIP, and the job sets none: the workers
// listen at their pod IP.
func TestKubernetesElasticJob(t *testing.T) {
	const steps, samples = 600, 1200
	const notice = 4 * time.Second
	cp, node := withKubelet(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const ns = "gorovod-run"
	admin := cp.AdminClient(ctx, t, ns)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// No scheduler and no CNI plugin here (package testkube): the pods name
	// the node and use its network. The workers bind their pod IP, the
	// node's address (127.0.0.2); the driver runs on this host outside any
	// pod and listens on loopback, its default, where they reach it.
	template := filepath.Join(dir, "pod.yaml")
	for path, text := range map[string]string{
		kubeconfig: cp.Kubeconfig(cp.AdminToken),
		template: fmt.Sprintf(`apiVersion: v1
kind: Pod
spec:
  nodeName: %s
  hostNetwork: true
  containers:
  - name: trainer
    imagePullPolicy: Never
`, node.Name),
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	h := e2e.StartRunJob(t, "--kubernetes", "--kubeconfig", kubeconfig, "--kubernetes-namespace", ns,
		"--kubernetes-job", "e2e", "--kubernetes-image", e2e.TrainerImage, "--kubernetes-pod-template", template,
		"--np", "2", "--json", "--heuristic", "fixed-schedule", "--heuristic-opt", "schedule=0:2,40:3",
		"--leave-notice", notice.String(),
		"--", "/bin/synthetic", "--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "5ms")
	stopLogs := followPodLogs(ctx, h, node.LogDir)
	defer stopLogs()
	h.LogTailOnFailure(t, "gorovod run's log")

	h.WaitFor(t, "a world of 3 pods", 3*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == 3 })
	pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=e2e," + kube.LabelRole + "=" + kube.RoleWorker})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("worker pods: %v %v", pods, err)
	}
	t.Logf("at 3 pods: %s", e2e.WorkersAtPodIPs(ctx, t, admin, ns, "e2e", false, 30*time.Second))

	// Someone else deletes a worker's pod: the kubelet sends SIGTERM, the
	// worker leaves within its notice, and the engine brings the job back
	// to 3 with a new pod.
	h.Mu.Lock()
	at := e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	victim := "e2e-worker-1"
	t0 := time.Now()
	if err := admin.CoreV1().Pods(ns).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, victim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Since(t0) > notice+10*time.Second {
			t.Fatalf("pod %s still there %v after its deletion (notice %v): %v", victim, time.Since(t0), notice, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server, as kubectl wait does
	}
	t.Logf("pod %s deleted at step %d, gone %v later (notice %v)", victim, at, time.Since(t0).Round(time.Millisecond), notice)
	h.WaitFor(t, "a world of 3 again without the preempted worker", 3*time.Minute, func(l []e2e.TrainerLine) bool {
		for _, x := range l {
			if x.Step > at && x.Size == 3 && x.Worker > 2 {
				return true
			}
		}
		return false
	})

	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run --kubernetes: %v", err)
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("the job did not finish")
	}
	stopLogs()
	h.Mu.Lock()
	defer h.Mu.Unlock()
	evs := h.EngineEventsLocked(t)
	e2e.LogDecisions(t, evs)
	if !e2e.CarriedOut(evs, heuristics.Grow) {
		t.Errorf("the engine did not grow the job through Kubernetes")
	}
	if !strings.Contains(h.Log.String(), "pod "+victim+" was ") {
		t.Errorf("gorovod run did not report the preempted pod")
	}
	// The preempted worker left the job and exited by itself within its
	// notice (the kubelet's SIGKILL at the end of the grace period would
	// make it lost).
	if !regexp.MustCompile(`\d+ workers finished, 0 lost, 0 failed`).MatchString(h.Log.String()) {
		t.Errorf("not every worker finished by itself")
	}
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
	left, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(left.Items) != 0 {
		t.Errorf("pods left after the job: %v %v", left, err)
	}
	if secrets, err := admin.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=e2e"}); err != nil || len(secrets.Items) != 0 {
		t.Errorf("the job's Secret after the job: %v %v", secrets, err)
	}
	if _, err := admin.CoreV1().Services(ns).Get(ctx, "e2e", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the job's Service after the job: %v", err)
	}
}

// TestPodLogsTakeWholeLines: a poll that meets a log line the container
// runtime is still writing leaves it for the next poll, so the trainer line
// is taken once and whole (a line cut at the end of the file was once read
// as a worker's own words and its step counted as lost).
func TestPodLogsTakeWholeLines(t *testing.T) {
	const step = `{"step":7,"epoch":1,"world_epoch":2,"rank":0,"size":1,"start":24,"global":24}`
	cases := []struct {
		name   string
		writes []string // each followed by a poll
		want   []int64  // the steps taken, in order
	}{
		{"whole", []string{"2026-11-24T02:00:00Z stdout F " + step + "\n"}, []int64{7}},
		{"cut in the JSON", []string{"2026-11-24T02:00:00Z stdout F " + step[:30], step[30:] + "\n"}, []int64{7}},
		{"cut before the newline", []string{"2026-11-24T02:00:00Z stdout F " + step, "\n"}, []int64{7}},
		{"runtime's partial entries", []string{"2026-11-24T02:00:00Z stdout P " + step[:30] + "\n", "2026-11-24T02:00:00Z stdout F " + step[30:] + "\n"}, []int64{7}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ns_job-worker-0_uid", kube.ContainerName, "0.log")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h := &e2e.RunJobHarness{Pids: map[int]int{}, Notify: make(chan struct{}, 1)}
			logs := &e2e.PodLogs{Dir: dir, Read: map[string]int64{}, Partial: map[string]string{}}
			for _, w := range c.writes {
				if _, err := f.WriteString(w); err != nil {
					t.Fatal(err)
				}
				logs.Poll(h)
			}
			var got []int64
			for _, l := range h.Lines {
				got = append(got, l.Step)
			}
			if !slices.Equal(got, c.want) || h.Log.Len() != 0 {
				t.Errorf("steps %v and other lines %q, want steps %v and no other lines", got, h.Log.String(), c.want)
			}
		})
	}
}
