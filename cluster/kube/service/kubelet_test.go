package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// TestDriverPodsOnKubelet runs the driver pods the scheduler creates on real
// kubelets, two, each with its own containerd and runc (package testkube), with a stand-in for
// `gorovod run` (testdata/fakedriver) in the driver's image: the pod runs
// the command, service account and downward-API variables the scheduler
// gave it, and its real end decides the job's phase — exit 0 Succeeded,
// exit 3 Failed with the container's termination message. The slots are on
// a node registered through the API (the kubelets' nodes have no GPU, slot
// resource or slot label: a driver needs no slot), and with no kube-scheduler
// here each driver pod names its kubelet's node.
func TestDriverPodsOnKubelet(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skip(why)
	}
	bin := testkube.BuildStatic(t, "./testdata/fakedriver")
	nodeCfg := testkube.NodeConfig{
		PauseRef: "gorovod.local/pause:test",
		Images: []testkube.Image{
			{Ref: "gorovod.local/pause:test", Files: map[string]string{"bin/pause": bin}, Entrypoint: []string{"/bin/pause", "pause"}},
			{Ref: "gorovod.local/driver:test", Files: map[string]string{"usr/local/bin/gorovod": bin}, Entrypoint: []string{"/usr/local/bin/gorovod"}},
		},
	}
	// Two kubelets, each with its own containerd: the drivers' pods are
	// host-network pods here (no network plugin), so two of them on one
	// node would both claim the gossip port.
	nodes := map[string]*testkube.Node{"succeeds": cp.NewNode(t, nodeCfg), "fails": cp.NewNode(t, nodeCfg)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "onkubelet"
	e := newE2E(ctx, t, cp, ns, "slots")
	admin, jobs := e.admin, e.jobs
	startReplica(ctx, t, cp.ConfigFor(e.token), "sched", func(c *Config) {
		c.CustomizeDriver = func(pod *corev1.Pod) {
			pod.Spec.NodeName, pod.Spec.HostNetwork = nodes[pod.Labels[kube.LabelJob]].Name, true
			pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		}
	})
	for _, name := range []string{"succeeds", "fails"} {
		j := &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: api.Spec{Image: "gorovod.local/worker:none", DriverImage: "gorovod.local/driver:test", Command: []string{"train"}, MinWorkers: 1, MaxWorkers: 1}}
		u, err := api.ToUnstructured(j)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := jobs.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var ended map[string]*api.GorovodJob
	if err := testdaemon.WaitFor(ctx, 200*time.Millisecond, func() error {
		ended = map[string]*api.GorovodJob{}
		for _, name := range []string{"succeeds", "fails"} {
			u, err := jobs.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			j, err := api.FromUnstructured(u)
			if err != nil {
				return err
			}
			if !j.Status.Phase.Ended() {
				return fmt.Errorf("%s: %+v", name, j.Status)
			}
			ended[name] = j
		}
		return nil
	}); err != nil {
		t.Fatalf("the jobs never ended: %v", err)
	}
	if s := ended["succeeds"].Status; s.Phase != api.PhaseSucceeded || s.Allocation != nil || s.CompletionTime == nil {
		t.Errorf("succeeds: %+v", s)
	}
	if s := ended["fails"].Status; s.Phase != api.PhaseFailed || !strings.Contains(s.Message, "exited with status 3") || !strings.Contains(s.Message, "loss is NaN") {
		t.Errorf("fails: %+v", s)
	}
	// What the driver saw: the command and the downward API's variables.
	pod, err := admin.CoreV1().Pods(ns).Get(ctx, "succeeds-driver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != nodes["succeeds"].Name {
		t.Errorf("succeeds-driver ran on %s", pod.Spec.NodeName)
	}
	matches, _ := filepath.Glob(filepath.Join(nodes["succeeds"].LogDir, ns+"_succeeds-driver_*", DriverContainer, "*.log"))
	var log strings.Builder
	for _, m := range matches {
		b, _ := os.ReadFile(m)
		log.Write(b)
	}
	for _, want := range []string{"args run --gorovodjob=succeeds", "env GOROVOD_POD_NAME=succeeds-driver", "env GOROVOD_POD_NAMESPACE=" + ns,
		"env GOROVOD_POD_UID=" + string(pod.UID)} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the driver's log lacks %q: %q", want, log.String())
		}
	}
}
