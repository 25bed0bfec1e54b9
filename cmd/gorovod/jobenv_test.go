package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	"github.com/gorovod/gorovod/internal/testing/testslurm"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The job's minimum (--min-np, GOROVOD_MIN_WORKERS) and probe timeout
// (--probe-timeout, GOROVOD_PROBE_TIMEOUT) reach every worker whatever
// starts it, so that a worker that takes over proposing after gorovod run
// died keeps to both: over ssh, as Slurm steps and as pods. (The
// GorovodJob's driver: TestGorovodJobDriverPlacement.)

// boundsTrainer is a trainer that prints the bounds its worker was given,
// then runs the synthetic trainer with its arguments.
func boundsTrainer(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bounds-trainer")
	script := fmt.Sprintf("#!/bin/sh\necho \"worker bounds: min=$%s probe=$%s\" >&2\nexec %s \"$@\"\n",
		envconfig.EnvMinWorkers, envconfig.EnvProbeTimeout, e2e.Synthetic)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkBounds checks that each of n workers printed the bounds wanted.
func checkBounds(t *testing.T, h *e2e.RunJobHarness, n int, want string) {
	t.Helper()
	log := h.LogText()
	got := regexp.MustCompile(`worker bounds: [^\n]*`).FindAllString(log, -1)
	if len(got) != n || slices.ContainsFunc(got, func(s string) bool { return s != "worker bounds: "+want }) {
		t.Fatalf("the workers' bounds: %q; want %d × %q; launcher log:\n%s", got, n, want, log[max(0, len(log)-8<<10):])
	}
}

// TestRunAcrossHostsGivesTheJobsBounds: workers started over ssh (-H).
func TestRunAcrossHostsGivesTheJobsBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhbnd", SSHPort: 2222}, 2)
	h := e2e.HostJobWith(t, n, hs[0], []string{"--np", "2", "--min-np", "1", "--probe-timeout", "3", "-H", hs[1].Name + ":2"},
		boundsTrainer(t), "--steps", "20", "--json", "--samples", "240", "--batch", "24")
	h.WaitExit(t, 2*time.Minute)
	if log := h.LogText(); !strings.Contains(log, "on "+hs[1].Name) {
		t.Fatalf("no worker started on %s:\n%s", hs[1].Name, log[:min(len(log), 4<<10)])
	}
	checkBounds(t, h, 2, "min=1 probe=3s")
}

// TestSlurmGivesTheJobsBounds: workers as srun steps of the allocation
// (--slurm).
func TestSlurmGivesTheJobsBounds(t *testing.T) {
	c := testslurm.New(t, testslurm.DefaultConfig())
	h := salloc(t, c, 2, "--np", "2", "--min-np", "1", "--probe-timeout", "3",
		"--", boundsTrainer(t), "--steps", "20", "--json", "--samples", "240", "--batch", "24")
	h.WaitExit(t, 2*time.Minute)
	checkBounds(t, h, 2, "min=1 probe=3s")
}

// TestKubernetesGivesTheJobsBounds: workers as pods (--kubernetes), against
// a real API server whose pods run nowhere (no node): the pods' environment
// is what the kubelet would give the trainer.
func TestKubernetesGivesTheJobsBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "bounds"
	admin := cp.AdminClient(ctx, t, ns)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(cp.AdminToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	h := e2e.StartRunJob(t, "--kubernetes", "--kubeconfig", kubeconfig, "--kubernetes-namespace", ns,
		"--kubernetes-job", "bounds", "--kubernetes-image", "gorovod.local/synthetic:test",
		"--np", "2", "--min-np", "1", "--probe-timeout", "3", "--", "/bin/synthetic", "--steps", "20")
	h.LogTailOnFailure(t, "gorovod run's log")
	var pods []corev1.Pod
	e2e.Poll(t, "2 worker pods", time.Minute, func() bool {
		l, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=bounds," + kube.LabelRole + "=" + kube.RoleWorker})
		if err == nil {
			pods = l.Items
		}
		return len(pods) == 2
	})
	for _, p := range pods {
		env := p.Spec.Containers[0].Env
		for _, want := range []corev1.EnvVar{{Name: envconfig.EnvMinWorkers, Value: "1"}, {Name: envconfig.EnvProbeTimeout, Value: "3s"}} {
			if !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == want.Name && e.Value == want.Value }) {
				t.Errorf("pod %s lacks %s=%s: %v", p.Name, want.Name, want.Value, env)
			}
		}
	}
}
