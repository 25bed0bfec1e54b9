package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testio"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// `gorovod logs` of a running pod, through the API server from a real
// kubelet: the node is one the API server reaches (testkube's Reachable: a
// loopback address of its own, certificates both ways). The job's driver pod
// is the test's (a stand-in that prints and waits), bound to the node.
func TestLogsOfRunningPod(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	if why := testkube.MissingNode(testkube.DefaultConfig()); why != "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	helper := filepath.Join(dir, "podhelper")
	build := exec.Command("go", "build", "-o", helper, "../../../cluster/kube/testdata/podhelper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the pod helper: %v: %s", err, out)
	}
	node := cp.NewNode(t, testkube.NodeConfig{Reachable: true, PauseRef: "gorovod.local/pause:test", Images: []testkube.Image{
		{Ref: "gorovod.local/pause:test", Files: map[string]string{"bin/pause": helper}, Entrypoint: []string{"/bin/pause", "pause"}},
		{Ref: "gorovod.local/helper:test", Files: map[string]string{"bin/podhelper": helper}, Entrypoint: []string{"/bin/podhelper"}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	installCRD(ctx, t, cp.AdminConfig(), "../../../deploy/kubernetes/gorovod.yaml")
	const ns = "team-a"
	if err := cp.Namespace(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForServiceAccount(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	u, err := api.ToUnstructured(&api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: "mnist", Namespace: ns},
		Spec: api.Spec{Image: "gorovod.local/helper:test", Command: []string{"/bin/podhelper"}, MinWorkers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(api.GroupVersionResource()).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mnist-driver", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node.Name, HostNetwork: true, AutomountServiceAccountToken: &no, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "driver", Image: "gorovod.local/helper:test", ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "GOROVOD_POD_NAME", Value: "mnist-driver"}}}}}}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(cp.AdminToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The pod runs and has printed its first lines.
	var out, stderr string
	if err := testdaemon.WaitFor(ctx, 500*time.Millisecond, func() error {
		out, stderr, err = gorovod(ctx, "logs", "--kubeconfig", kubeconfig, "-n", ns, "mnist")
		if err != nil {
			return fmt.Errorf("%v: %s", err, stderr)
		}
		if !strings.Contains(out, "env GOROVOD_POD_NAME=mnist-driver") {
			return fmt.Errorf("log %q", out)
		}
		return nil
	}); err != nil {
		p, _ := admin.CoreV1().Pods(ns).Get(ctx, "mnist-driver", metav1.GetOptions{})
		t.Fatalf("gorovod logs of the running driver pod: %v\npod status %+v", err, p.Status)
	}
	if !strings.HasPrefix(out, "ready ") {
		t.Fatalf("log %q, want the pod's first line first", out)
	}
	// -f streams until the command's context ends, the pod still running.
	fctx, stop := context.WithCancel(ctx)
	followed := &testio.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- Main(fctx, []string{"logs", "-f", "--kubeconfig", kubeconfig, "-n", ns, "mnist"}, Config{Stdout: followed, Stderr: io.Discard})
	}()
	if err := testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
		if !strings.Contains(followed.String(), "env GOROVOD_POD_NAME=mnist-driver") {
			return fmt.Errorf("followed %q", followed.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("logs -f returned while the pod runs: %v", err)
	default:
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("logs -f after its context ended: %v", err)
	}
}
