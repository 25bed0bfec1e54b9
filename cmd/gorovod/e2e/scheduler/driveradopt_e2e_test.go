package scheduler

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/heuristics/goodput"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// driverListens says whether a driver process of the job (driverPID's
// match) has a TCP socket listening at addr (IPv4 "ip:port"): a listening
// socket at that address in /proc/PID/net/tcp (the host's network, which
// the host-network pods share) that is one of the process's open files.
func driverListens(t *testing.T, job, addr string) bool {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		t.Fatalf("the driver's address %q: not an IPv4 ip:port", addr)
	}
	// The address as /proc writes it: the 32-bit word in the host's byte
	// order (little-endian on the machines this runs on), then the port.
	ip := ap.Addr().As4()
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ap.Port())
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	cmdline := []byte("--gorovodjob=" + job + "\x00")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		proc := filepath.Join("/proc", e.Name())
		b, err := os.ReadFile(filepath.Join(proc, "cmdline"))
		if argv0, _, _ := bytes.Cut(b, []byte{0}); err != nil || filepath.Base(string(argv0)) != "gorovod" || !bytes.Contains(b, cmdline) {
			continue
		}
		tcp, err := os.ReadFile(filepath.Join(proc, "net", "tcp"))
		if err != nil {
			continue
		}
		sockets := map[string]bool{}
		for _, line := range strings.Split(string(tcp), "\n")[1:] {
			// sl local_address rem_address st ... inode (the 10th field)
			if f := strings.Fields(line); len(f) > 9 && f[1] == want && f[3] == "0A" {
				sockets["socket:["+f[9]+"]"] = true
			}
		}
		fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(proc, "fd", fd.Name())); err == nil && sockets[l] {
				return true
			}
		}
	}
	return false
}

// TestDriverReplacedUnderScheduler kills a GorovodJob's driver three times
// while its workers train, on two real kubelets under the scheduler service
// whose nodes have addresses of their own (127.0.0.2 and 127.0.0.3), which
// their host-network pods get as status.podIP: the drivers bind their pod
// IPs and the workers theirs (GOROVOD_POD_IP), as on a pod network. First
// the driver's process is killed (kill -9, as the OOM killer or a crash
// would), and its replacement runs on the same node, at the same IP: it
// binds the workers' seed. Then the replacement's process is killed with
// the next replacement placed on the other node: a pod with another IP,
// which listens at its own IP (though this host would let it bind the
// other node's) and contacts the workers at the addresses status.adoption
// records. Then the pod of that one is deleted (as kubectl delete pod
// does: SIGTERM, and the driver leaves the workers), and its replacement,
// at the same IP, binds the seed the moved driver recorded
// (status.adoption.seeds). Each time the scheduler starts a replacement
// driver pod (status.driver, status.driverRestarts), which takes the
// running job back from status.adoption instead of starting it again: it
// listens at the seed it records, which is at its pod IP; every worker pod
// of before the kill is the same pod (same UID) after it, their steps go
// on from where they were (never back to the start), the replacement
// writes the job's step into its status and a goodput model fitted to the
// profile of before (status.goodput: no size measured before is lost to
// the scheduler), and the job succeeds with its
// workers agreeing on the parameters at every step and training on every
// sample of each data epoch once.
func TestDriverReplacedUnderScheduler(t *testing.T) {
	e := newE2EClusterOf(t, 10*time.Minute, nil, podIPNodesOnePort)
	ctx := e.ctx
	e.driverNode = e.nodes[0]
	// A probe timeout of its own, which the workers were given and each
	// replacement driver must use as well (status.adoption.probeTimeout).
	const probeTimeout = 3 * time.Second
	j := &e2eJob{name: "replaced", steps: 6000, samples: 1200, spec: "  probeTimeout: 3s"}
	all := []*e2eJob{j}
	defer e.logFailure(t, all)
	sched := e.startScheduler("sched-1")
	e.submit(j)

	workerPods := func() map[string]corev1.Pod {
		pods, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + j.name + "," + kube.LabelRole + "=" + kube.RoleWorker})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev1.Pod{}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				out[p.Name] = p
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
	// podIP is a running pod's status.podIP.
	podIP := func(name string) string {
		var ip string
		e2e.Poll(t, "pod "+name+"'s IP", time.Minute, func() bool {
			p, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ip = p.Status.PodIP
			return ip != ""
		})
		return ip
	}
	// seedAt waits for status.adoption to name a seed at ip, and checks
	// that the job's driver process listens there.
	seedAt := func(ip string) string {
		var seed string
		e2e.Poll(t, "status.adoption's seed at "+ip, 2*time.Minute, func() bool {
			if a := current().Status.Adoption; a != nil && len(a.Seeds) > 0 {
				seed = a.Seeds[0]
			}
			host, _, _ := net.SplitHostPort(seed)
			return host == ip
		})
		if !driverListens(t, j.name, seed) {
			t.Errorf("no driver process of the job listens at the seed %s it recorded", seed)
		}
		return seed
	}
	e2e.Poll(t, "the job training with its adoption record written", 4*time.Minute, func() bool {
		gj := current()
		return gj.Status.Phase == api.PhaseRunning && gj.Status.Adoption != nil && gj.Status.WorldSize > 0
	})
	if a := current().Status.Adoption; a.ProbeTimeout == nil || a.ProbeTimeout.Duration != probeTimeout {
		t.Fatalf("status.adoption %+v does not record the job's probe timeout %v", a, probeTimeout)
	}
	e.trained(j, j.h.Step()+50)
	// The first driver binds its pod IP, the node's address; the workers
	// gossip at theirs.
	if ip := podIP(current().Status.Driver); ip != e.nodes[0].Name {
		t.Fatalf("the driver pod's IP is %q, want its node's address %s", ip, e.nodes[0].Name)
	}
	seed := seedAt(e.nodes[0].Name)
	workerIPs := map[string]bool{}
	for _, p := range workerPods() {
		workerIPs[p.Status.PodIP] = true
	}
	a := current().Status.Adoption
	if len(a.Workers) == 0 {
		t.Fatalf("status.adoption %+v records no worker address", a)
	}
	for _, w := range a.Workers {
		if host, _, _ := net.SplitHostPort(w); !workerIPs[host] {
			t.Errorf("status.adoption records worker address %s, at none of the worker pods' IPs %v", w, slices.Sorted(maps.Keys(workerIPs)))
		}
	}

	// takeOver kills the job's driver (kill), then checks that the
	// replacement n takes the job back, and what the replacement logged
	// (check, with the IPs of the killed pod and of its replacement).
	takeOver := func(n int32, how string, kill func(driver string), check func(own []byte, from, to string)) {
		t.Helper()
		before := current()
		from := podIP(before.Status.Driver)
		pods := workerPods()
		at := j.h.Step()
		j.h.Mu.Lock()
		linesAt := len(j.h.Lines)
		j.h.Mu.Unlock()
		t0 := time.Now()
		kill(before.Status.Driver)
		want := service.ReplacementDriverPodName(j.name, n)
		e2e.Poll(t, "the scheduler replacing the driver with "+want, 2*time.Minute, func() bool {
			gj := current()
			return gj.Status.Driver == want && gj.Status.DriverRestarts == n && gj.Status.Phase == api.PhaseRunning
		})
		replaced := time.Since(t0)
		// The replacement writes the job's step: past the step of the kill.
		e2e.Poll(t, "the replacement writing the job's step", 2*time.Minute, func() bool {
			return current().Status.Step > at
		})
		e.trained(j, j.h.Step()+50)
		// The replacement fits the job's goodput model to the profile the
		// killed driver recorded with its own: the scheduler does not see
		// the job as new, measured at fewer sizes than it was.
		if was := before.Status.Goodput; was != nil {
			now := current().Status.Goodput
			if now == nil || now.MaxProfiledWorkers < was.MaxProfiledWorkers || !coversProfile(now.Profile, was.Profile) {
				t.Errorf("after the %s status.goodput is %+v; before it %+v: the replacement's model is not fitted to the measurements of before", how, now, was)
			} else {
				t.Logf("%s: status.goodput measured up to %d workers in %d configurations, before it %d in %d",
					how, now.MaxProfiledWorkers, len(now.Profile), was.MaxProfiledWorkers, len(was.Profile))
			}
		}
		to := podIP(want)
		// It listens at its pod IP, which it records as the job's seed.
		seed = seedAt(to)
		after := workerPods()
		for name, p := range pods {
			if got, ok := after[name]; !ok {
				t.Errorf("worker pod %s of before the %s no longer runs (now %v)", name, how, slices.Sorted(maps.Keys(after)))
			} else if got.UID != p.UID {
				t.Errorf("worker pod %s was made again (uid %s, then %s): the job was restarted", name, p.UID, got.UID)
			}
		}
		j.h.Mu.Lock()
		for _, l := range j.h.Lines[linesAt:] {
			// A world that moves on rolls back at most to its last
			// committed step; a restarted job would start again at 0.
			if l.Step < at-10 {
				t.Errorf("after the %s at step %d a worker trained step %d: the steps went back", how, at, l.Step)
				break
			}
		}
		j.h.Mu.Unlock()
		t.Logf("%s at step %d: replacement %s (pod IP %s, the killed one's %s, seed %s) recorded %v later; the %d worker pods of before kept; now at step %d",
			how, at, want, to, from, seed, replaced.Round(time.Millisecond), len(pods), j.h.Step())
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
		check(own, from, to)
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
	// atSeed: a replacement at the IP of the driver it replaced binds the
	// workers' seed.
	atSeed := func(own []byte, from, to string) {
		if to != from {
			t.Errorf("the replacement's pod IP is %s, want the IP %s of the driver it replaced (the same node)", to, from)
		}
		if bytes.Contains(own, []byte("cannot be bound")) {
			t.Errorf("the replacement did not listen at the workers' seed; its log ends:\n%s", own[max(0, len(own)-4<<10):])
		}
	}
	takeOver(1, "kill -9 of the driver", killDriver, atSeed)
	first := seed
	takeOver(2, "kill -9 of the driver, the replacement on the other node", func(driver string) {
		e.placeDrivers(e.nodes[1])
		killDriver(driver)
	}, func(own []byte, from, to string) {
		if to == from || to != e.nodes[1].Name {
			t.Errorf("the replacement's pod IP is %s, want the other node's %s (the killed driver's was %s)", to, e.nodes[1].Name, from)
		}
		if !bytes.Contains(own, []byte("cannot be bound")) {
			t.Errorf("the replacement did not say that it listens at its own IP and contacts the workers; its log ends:\n%s", own[max(0, len(own)-4<<10):])
		}
	})
	moved := seed
	if moved == first {
		t.Errorf("status.adoption still names the dead driver's address %s as the job's seed", first)
	}
	takeOver(3, "deletion of the driver's pod", func(driver string) {
		if err := e.admin.CoreV1().Pods(e.ns).Delete(ctx, driver, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}, atSeed)
	if seed != moved {
		t.Errorf("the last replacement's seed is %s, want the address %s of the driver it replaced", seed, moved)
	}

	e2e.Poll(t, "the job ended", 5*time.Minute, func() bool {
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

// workersAtPodIPs checks that the job's running worker pods are at their
// nodes' addresses (status.podIP: the nodes of newE2EClusterPodIPs are
// named by their addresses), that each pod's worker listens there (none
// only at 127.0.0.1), and, with across, that the pods are on more than one
// node and a worker holds a connection to the listening socket of a worker
// on another node, at that node's address: the workers talk across the
// nodes' addresses, as they would not if everything bound 127.0.0.1. It
// polls for up to within (links come as the worlds form) and describes
// what it found.
func (e *e2eCluster) workersAtPodIPs(t *testing.T, job string, across bool, within time.Duration) string {
	t.Helper()
	return e2e.WorkersAtPodIPs(e.ctx, t, e.admin, e.ns, job, across, within)
}

// coversProfile says whether every configuration of before is in now, with
// at least as many steps.
func coversProfile(now, before []goodput.ProfileEntry) bool {
	for _, b := range before {
		if !slices.ContainsFunc(now, func(n goodput.ProfileEntry) bool {
			return n.Nodes == b.Nodes && n.Replicas == b.Replicas && n.MicroBatch == b.MicroBatch && n.OptimCount >= b.OptimCount
		}) {
			return false
		}
	}
	return true
}
