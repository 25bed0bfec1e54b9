package kube

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
)

// The Launcher as the job runner uses it (fake clientset; the kubelet's part
// is played by writing pod statuses): each launch is a pod named by its
// launch index running the job's command; the job secret goes to the Secret
// only; a pod's end maps to the exit a job.Process reports; Signal deletes
// the pod; a launch with another secret is refused.
func TestLauncher(t *testing.T) {
	client := newClientset()
	ev := newEvents()
	cfg := testConfig(client, ev)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := newTestLauncher(t, cfg)
	notices := make(chan string, 16)
	launch := func(index int, secret string) (job.Process, error) {
		return l.Launch(ctx, job.LaunchRequest{Index: index, Argv: []string{"/bin/trainer", "--steps", "9"},
			Env:    []string{envconfig.EnvJobID + "=job-7", envconfig.EnvSecret + "=" + secret, envconfig.EnvLaunchIndex + "=99", "EXTRA=x=y"},
			Notice: func(msg string) { notices <- msg }})
	}

	procs := map[int]job.Process{}
	for _, i := range []int{0, 1, 2, 3} {
		var err error
		if procs[i], err = launch(i, testSecret); err != nil {
			t.Fatal(err)
		}
	}
	ev.wait(t, PodCreated, 4, 10*time.Second)
	pod, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(pod)
	if strings.Contains(string(b), testSecret) {
		t.Fatal("the job secret is in the pod")
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
		if e.Name == envconfig.EnvSecret && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("the secret is not a secretKeyRef: %+v", e)
		}
	}
	if env[envconfig.EnvJobID] != "job-7" || env["EXTRA"] != "x=y" || env[envconfig.EnvLaunchIndex] != "2" {
		t.Errorf("pod env %v", env)
	}
	if got := strings.Join(pod.Spec.Containers[0].Command, " "); got != "/bin/trainer --steps 9" {
		t.Errorf("command %q", got)
	}
	secret, err := client.CoreV1().Secrets("ml").Get(ctx, l.Provisioner().SecretName(), metav1.GetOptions{})
	if err != nil || secret.StringData[envconfig.EnvSecret]+string(secret.Data[envconfig.EnvSecret]) != testSecret {
		t.Fatalf("the Secret: %+v %v", secret, err)
	}

	// How each pod ends, as its job.Process reports it.
	for _, tc := range []struct {
		index  int
		code   int32
		want   error
		killed bool
	}{
		{0, 0, nil, false},
		{1, 143, &job.ExitError{Code: -1, Signal: syscall.SIGTERM}, true},
		{2, 3, &job.ExitError{Code: 3}, false},
	} {
		name := l.Provisioner().podName(tc.index)
		setStatus(t, client, name, running)
		setStatus(t, client, name, exited(tc.code))
		p := procs[tc.index]
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Done not closed after exit %d", name, tc.code)
		}
		err := p.Err()
		if (err == nil) != (tc.want == nil) || (err != nil && err.Error() != tc.want.Error()) || job.KilledBySignal(err) != tc.killed {
			t.Errorf("%s exited %d: Err %v (killed %v), want %v (killed %v)", name, tc.code, err, job.KilledBySignal(err), tc.want, tc.killed)
		}
	}
	// Exit 143 without the provisioner's deletion: preempted, and the job
	// is told.
	select {
	case n := <-notices:
		if !strings.Contains(n, "pod mnist-worker-1 was preempted (exit code 143") {
			t.Errorf("notice %q", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notice of the preempted pod")
	}

	// Signal deletes the pod; a pod gone without its container ending
	// counts as killed.
	if err := procs[3].Signal(job.LeaveSignal); err != nil {
		t.Fatal(err)
	}
	select {
	case <-procs[3].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the pod's deletion")
	}
	if _, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-3", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod 3 after Signal: %v", err)
	}
	if err := procs[3].Err(); !job.KilledBySignal(err) {
		t.Errorf("a deleted pod's Err %v, want killed", err)
	}
	ev.wait(t, PodDeleted, 1, 10*time.Second) // the events of pod 3's deletion are out
	select {
	case n := <-notices:
		t.Errorf("a pod the job deleted was reported: %q", n)
	default:
	}

	// Every launch of a job carries its one secret.
	if _, err := launch(4, strings.Repeat("aa", 32)); err == nil || !strings.Contains(err.Error(), "another job secret") {
		t.Errorf("a launch with another secret: %v", err)
	}
}

// With Config.NodeName a launch's host binds its pod to a node; without a
// host, or without NodeName, the pod names none.
func TestLauncherNodeName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mapper func(string) string
		host   string
		want   string
	}{
		{"no mapper", nil, "node-a/0", ""},
		{"mapped", func(h string) string { n, _, _ := strings.Cut(h, "/"); return n }, "node-a/1", "node-a"},
		{"no host", func(h string) string { n, _, _ := strings.Cut(h, "/"); return n }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := newClientset()
			cfg := testConfig(client, newEvents())
			cfg.NodeName = tc.mapper
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l := newTestLauncher(t, cfg)
			if _, err := l.Launch(ctx, job.LaunchRequest{Index: 0, Host: tc.host, Argv: []string{"/bin/trainer"},
				Env: []string{envconfig.EnvSecret + "=" + testSecret}}); err != nil {
				t.Fatal(err)
			}
			pod, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != tc.want {
				t.Fatalf("spec.nodeName %q, want %q", pod.Spec.NodeName, tc.want)
			}
		})
	}
}

// A pod its node rejects for want of a resource (the kubelet's
// OutOf<resource>: a terminating pod still holds it) is made again under the
// same name, and its worker has not ended; a worker stopped while its pod
// waits to be made again ends as killed, its pod not made again; a pod
// rejected for another reason ends its worker.
func TestRejectedPodMadeAgain(t *testing.T) {
	rejected := func(reason string) func(*corev1.PodStatus) {
		return func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodFailed, reason, "Pod was rejected: Node didn't have enough resource"
		}
	}
	for _, tc := range []struct {
		name    string
		reason  string
		stop    bool // the job stops the worker right after the rejection
		retried bool
	}{
		{name: "made again", reason: "OutOfgorovod.io/slot", retried: true},
		{name: "device plugin", reason: "UnexpectedAdmissionError", retried: true},
		{name: "stopped meanwhile", reason: "OutOfnvidia.com/gpu", stop: true, retried: true},
		{name: "not for want of a resource", reason: "NodeAffinity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := newClientset()
			ev := newEvents()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l := newTestLauncher(t, testConfig(client, ev))
			w, err := l.Launch(ctx, job.LaunchRequest{Index: 0, Argv: []string{"/bin/trainer"}, Env: []string{envconfig.EnvSecret + "=" + testSecret}})
			if err != nil {
				t.Fatal(err)
			}
			ev.wait(t, PodCreated, 1, 10*time.Second)
			setStatus(t, client, "mnist-worker-0", rejected(tc.reason))
			if !tc.retried {
				select {
				case <-w.Done():
				case <-ctx.Done():
					t.Fatal("a worker whose pod was rejected for good did not end")
				}
				if !job.KilledBySignal(w.Err()) || len(ev.of(PodRejected)) != 0 {
					t.Fatalf("Err %v, rejections %+v", w.Err(), ev.of(PodRejected))
				}
				return
			}
			r := ev.wait(t, PodRejected, 1, 10*time.Second)[0]
			if r.Pod != "mnist-worker-0" || !strings.Contains(r.Reason, tc.reason) {
				t.Fatalf("rejection %+v", r)
			}
			if tc.stop {
				if err := w.Signal(job.LeaveSignal); err != nil {
					t.Fatal(err)
				}
				select {
				case <-w.Done():
				case <-ctx.Done():
					t.Fatal("the worker stopped while its pod was rejected did not end")
				}
				if !job.KilledBySignal(w.Err()) {
					t.Errorf("Err %v, want killed", w.Err())
				}
				ev.wait(t, PodDeleted, 1, 10*time.Second)
				if _, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("the pod of a stopped worker was made again: %v", err)
				}
				return
			}
			// Made again: a fresh pod of the same name.
			for {
				pod, err := client.CoreV1().Pods("ml").Get(ctx, "mnist-worker-0", metav1.GetOptions{})
				if err == nil && pod.Status.Phase == "" {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the rejected pod was not made again: %+v %v", pod, err)
				case <-time.After(20 * time.Millisecond): // polling the fake clientset, which has no notification
				}
			}
			setStatus(t, client, "mnist-worker-0", running)
			ev.wait(t, PodRunning, 1, 10*time.Second)
			select {
			case <-w.Done():
				t.Fatalf("the worker ended: %v", w.Err())
			default:
			}
			if n := len(ev.of(PodEnded)) + len(ev.of(PodDeleted)); n != 0 {
				t.Fatalf("a worker made again reported ended or deleted: %+v", ev.all)
			}
		})
	}
}

// TestLauncherDetachAndAdopt: a driver that detaches leaves its pods, the
// Secret and the Service alone when its job stops and it closes; the next
// driver's launcher finds the pods (with their job hosts) and adopts the
// running ones, whose end it reports as for pods it made, and launches more
// only with the job's secret.
func TestLauncherDetachAndAdopt(t *testing.T) {
	client := newClientset()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := testConfig(client, newEvents())
	first, err := NewLauncher(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitWatching(t, client)
	jobCtx, stopJob := context.WithCancel(ctx)
	env := []string{envconfig.EnvJobID + "=job-7", envconfig.EnvSecret + "=" + testSecret}
	var procs []job.Process
	for i, host := range []string{"node-a/0", "node-b/0"} {
		p, err := first.Launch(jobCtx, job.LaunchRequest{Index: i, Host: host, Argv: []string{"/bin/trainer"}, Env: env})
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		setStatus(t, client, p.(*Pod).Name(), running)
	}
	first.Detach()
	stopJob() // the job's context ends: a launcher that did not detach deletes its pods
	if err := procs[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mnist-worker-0", "mnist-worker-1"} {
		if _, err := client.CoreV1().Pods("ml").Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatalf("pod %s after the driver detached: %v", name, err)
		}
	}
	if _, err := client.CoreV1().Secrets("ml").Get(ctx, first.Provisioner().SecretName(), metav1.GetOptions{}); err != nil {
		t.Fatalf("the Secret after the driver detached: %v", err)
	}
	setStatus(t, client, "mnist-worker-0", exited(0)) // ends while no driver watches

	ev := newEvents()
	cfg.OnEvent = ev.add
	next, err := NewLauncher(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitWatching(t, client)
	defer next.Close(context.Background())
	ws := next.Provisioner().Workers()
	if len(ws) != 2 || ws[0].Host != "node-a/0" || !ws[0].Ended || ws[1].Host != "node-b/0" || !ws[1].Running || ws[1].Ended {
		t.Fatalf("the next driver's workers: %+v", ws)
	}
	if err := next.AdoptSecret(map[string]string{envconfig.EnvSecret: testSecret}); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Adopt(ctx, job.AdoptRequest{Index: 0}); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("adopting an ended pod: %v", err)
	}
	if _, err := next.Adopt(ctx, job.AdoptRequest{Index: 7}); err == nil || !strings.Contains(err.Error(), "no pod") {
		t.Fatalf("adopting a pod that is not there: %v", err)
	}
	p, err := next.Adopt(ctx, job.AdoptRequest{Index: 1, Host: "node-b/0"})
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, client, "mnist-worker-1", exited(3))
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatal("the adopted pod's end was not reported")
	}
	if ee := (*job.ExitError)(nil); !errors.As(p.Err(), &ee) || ee.Code != 3 {
		t.Fatalf("the adopted pod's exit: %v", p.Err())
	}
	if _, err := next.Launch(ctx, job.LaunchRequest{Index: 2, Argv: []string{"/bin/trainer"},
		Env: []string{envconfig.EnvJobID + "=job-7", envconfig.EnvSecret + "=" + "another"}}); err == nil {
		t.Fatal("a launch with another secret than the adopted job's")
	}
	if _, err := next.Launch(ctx, job.LaunchRequest{Index: 2, Argv: []string{"/bin/trainer"}, Env: env}); err != nil {
		t.Fatal(err)
	}
}
