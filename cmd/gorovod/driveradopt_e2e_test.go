package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
)

// driverPID finds the process of a job's driver container on this host (the
// test's kubelets run their containers here): the gorovod process whose
// command line has --gorovodjob=job.
func driverPID(t *testing.T, job string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("--gorovodjob=" + job + "\x00")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if argv0, _, _ := bytes.Cut(b, []byte{0}); filepath.Base(string(argv0)) == "gorovod" && bytes.Contains(b, want) {
			return pid
		}
	}
	return 0
}

// takePort listens at addr, the gossip address of a driver that was just
// killed, as soon as its process has let it go (another process taking the
// port while its replacement starts), until the test ends.
func takePort(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond) // no event says when a dead process's port is free
	defer tick.Stop()
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			t.Cleanup(func() { l.Close() })
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead driver's port %s: %v", addr, err)
		}
		<-tick.C
	}
}

// TestDriverReplacedUnderScheduler kills a GorovodJob's driver three times
// while its workers train, on two real kubelets under the scheduler service:
// first its process (kill -9, as the OOM killer or a crash would); then its
// replacement's process, with its gossip port taken by another process at
// once and the next replacement placed on the other node, so that it
// cannot listen at the workers' seed (as a driver pod with another IP on a
// pod network cannot) and contacts the workers at the addresses
// status.adoption records; then the pod of that one (deleted, as kubectl
// delete pod does: SIGTERM, and the driver leaves the workers), whose
// replacement finds the job's seed at the address of the driver before it
// (status.adoption.seeds). Each time the scheduler starts a replacement
// driver pod (status.driver, status.driverRestarts), which takes the running
// job back from status.adoption instead of starting it again: the worker
// pods of before the kill are the same pods (same UIDs) after it, their
// steps go on from where they were (never back to the start), the
// replacement writes the job's step into its status, and the job succeeds
// with its workers agreeing on the parameters at every step and training on
// every sample of each data epoch once.
func TestDriverReplacedUnderScheduler(t *testing.T) {
	e := newE2ECluster(t, 10*time.Minute)
	ctx := e.ctx
	// The driver pods use the host's network, which the test's kubelets
	// share (their host-network pods have no IP of their own: the drivers
	// listen on loopback): a replacement binds the workers' seed unless
	// another process took its port.
	e.driverNode = e.nodes[0]
	// A probe timeout of its own, which the workers were given and each
	// replacement driver must use as well (status.adoption.probeTimeout).
	const probeTimeout = 3 * time.Second
	j := &e2eJob{name: "replaced", steps: 6000, samples: 1200, spec: "  probeTimeout: 3s"}
	all := []*e2eJob{j}
	defer e.logFailure(t, all)
	sched := e.startScheduler("sched-1")
	e.submit(j)

	workerUIDs := func() map[string]types.UID {
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + j.name + "," + kube.LabelRole + "=" + kube.RoleWorker})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]types.UID{}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				out[p.Name] = p.UID
			}
		}
		return out
	}
	current := func() *api.GorovodJob {
		u, err := e.jobs.Get(ctx, j.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gj, err := api.FromUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		return gj
	}
	poll(t, "the job training with its adoption record written", 4*time.Minute, func() bool {
		gj := current()
		return gj.Status.Phase == api.PhaseRunning && gj.Status.Adoption != nil && gj.Status.WorldSize > 0
	})
	if a := current().Status.Adoption; a.ProbeTimeout == nil || a.ProbeTimeout.Duration != probeTimeout {
		t.Fatalf("status.adoption %+v does not record the job's probe timeout %v", a, probeTimeout)
	}
	e.trained(j, j.h.step()+50)

	// takeOver kills the job's driver (kill), then checks that the
	// replacement n takes the job back, and what the replacement logged
	// (check).
	takeOver := func(n int32, how string, kill func(driver string), check func(own []byte)) {
		t.Helper()
		before := current()
		pods := workerUIDs()
		at := j.h.step()
		j.h.mu.Lock()
		linesAt := len(j.h.lines)
		j.h.mu.Unlock()
		t0 := time.Now()
		kill(before.Status.Driver)
		want := service.ReplacementDriverPodName(j.name, n)
		poll(t, "the scheduler replacing the driver with "+want, 2*time.Minute, func() bool {
			gj := current()
			return gj.Status.Driver == want && gj.Status.DriverRestarts == n && gj.Status.Phase == api.PhaseRunning
		})
		replaced := time.Since(t0)
		// The replacement writes the job's step: past the step of the kill.
		poll(t, "the replacement writing the job's step", 2*time.Minute, func() bool {
			return current().Status.Step > at
		})
		e.trained(j, j.h.step()+50)
		after := workerUIDs()
		for name, uid := range pods {
			if got, ok := after[name]; ok && got != uid {
				t.Errorf("worker pod %s was made again (uid %s, then %s): the job was restarted", name, uid, got)
			}
		}
		kept := 0
		for name := range pods {
			if _, ok := after[name]; ok {
				kept++
			}
		}
		if kept == 0 {
			t.Errorf("none of the worker pods %v of before the %s runs after it (now %v)", pods, how, after)
		}
		j.h.mu.Lock()
		for _, l := range j.h.lines[linesAt:] {
			// A world that moves on rolls back at most to its last
			// committed step; a restarted job would start again at 0.
			if l.Step < at-10 {
				t.Errorf("after the %s at step %d a worker trained step %d: the steps went back", how, at, l.Step)
				break
			}
		}
		j.h.mu.Unlock()
		t.Logf("%s at step %d: replacement %s recorded %v later; %d of the %d worker pods of before kept; now at step %d",
			how, at, want, replaced.Round(time.Millisecond), kept, len(pods), j.h.step())
		var logs []byte
		for _, b := range e.driverLogs(j.name) {
			logs = append(logs, b...)
		}
		if !regexp.MustCompile(`taking running job \S+ back`).Match(logs) {
			t.Errorf("no replacement driver said it took the job back; the drivers' log ends:\n%s", logs[max(0, len(logs)-4<<10):])
		}
		// The replacement's proposer runs with the probe timeout the
		// workers were given, not the default.
		// (Its own log: a deleted pod's log goes with it.)
		var own []byte
		for _, node := range e.nodes {
			files, _ := filepath.Glob(filepath.Join(node.LogDir, e.ns+"_"+want+"_*", service.DriverContainer, "*.log"))
			for _, f := range files {
				if b, err := os.ReadFile(f); err == nil {
					own = append(own, b...)
				}
			}
		}
		if m := regexp.MustCompile(`took the job back[^\n]*probe_timeout=(\S+)`).FindSubmatch(own); m == nil {
			t.Errorf("%s did not log taking the job back with its probe timeout; its log ends:\n%s", want, own[max(0, len(own)-4<<10):])
		} else if got := string(m[1]); got != probeTimeout.String() {
			t.Errorf("%s proposes with probe timeout %s, want the job's %v", want, got, probeTimeout)
		}
		check(own)
	}
	killDriver := func(string) {
		pid := driverPID(t, j.name)
		if pid == 0 {
			t.Fatal("no driver process of the job on this host")
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	atSeed := func(own []byte) {
		if bytes.Contains(own, []byte("cannot be bound")) {
			t.Errorf("the replacement did not listen at the workers' seed; its log ends:\n%s", own[max(0, len(own)-4<<10):])
		}
	}
	seed := func() string {
		a := current().Status.Adoption
		if a == nil || len(a.Seeds) == 0 || len(a.Workers) == 0 {
			t.Fatalf("status.adoption %+v names no seed or no worker addresses", a)
		}
		return a.Seeds[0]
	}
	takeOver(1, "kill -9 of the driver", killDriver, atSeed)
	first := seed()
	takeOver(2, "kill -9 of the driver, its port taken, the replacement on the other node", func(driver string) {
		e.placeDrivers(e.nodes[1])
		killDriver(driver)
		takePort(t, first)
	}, func(own []byte) {
		if !bytes.Contains(own, []byte("cannot be bound")) {
			t.Errorf("the replacement did not say that it listens elsewhere and contacts the workers; its log ends:\n%s", own[max(0, len(own)-4<<10):])
		}
	})
	moved := seed()
	if moved == first {
		t.Errorf("status.adoption still names the dead driver's address %s as the job's seed", first)
	}
	takeOver(3, "deletion of the driver's pod", func(driver string) {
		if err := e.admin.CoreV1().Pods(e.ns).Delete(ctx, driver, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}, atSeed)
	if got := seed(); got != moved {
		t.Errorf("the last replacement's seed is %s, want the address %s of the driver it replaced", got, moved)
	}

	poll(t, "the job ended", 5*time.Minute, func() bool {
		gj := e.hist.job(j.name)
		return gj != nil && gj.Status.Phase.Ended()
	})
	e.stopScheduler(sched)
	e.stopFollowing()
	e.checkJobs(t, all)
	gj := current()
	if gj.Status.DriverRestarts != 3 || gj.Status.Adoption == nil || !gj.Status.Adoption.Ended {
		t.Errorf("at the end: driverRestarts %d, adoption %+v; want 3 and an ended record", gj.Status.DriverRestarts, gj.Status.Adoption)
	}
}
