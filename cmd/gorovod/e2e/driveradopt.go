package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// procTCPAddr parses an address of /proc/net/tcp: the IPv4 word in the
// host's byte order (little-endian on the machines this runs on), then the
// port, in hex ("0200007F:1F90" is 127.0.0.2:8080).
func procTCPAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	w, err1 := strconv.ParseUint(h, 16, 32)
	port, err2 := strconv.ParseUint(p, 16, 16)
	if !ok || len(h) != 8 || err1 != nil || err2 != nil {
		return netip.AddrPort{}, false
	}
	ip := netip.AddrFrom4([4]byte{byte(w), byte(w >> 8), byte(w >> 16), byte(w >> 24)})
	return netip.AddrPortFrom(ip, uint16(port)), true
}

// podSockets are the TCP sockets of a pod's processes on this host.
type podSockets struct {
	listen []netip.AddrPort    // listening
	conns  [][2]netip.AddrPort // established: local, remote
}

// podsSockets finds the processes of pods on this host (the test's
// kubelets run their containers here) by the pod UID in their environment
// (GOROVOD_POD_UID, which cluster/kube gives its workers), and returns
// their TCP sockets by pod name (uids: pod UID → name): those of
// /proc/PID/net/tcp (the host's network, which host-network pods share)
// that are among the process's open files.
func podsSockets(t *testing.T, uids map[string]string) map[string]*podSockets {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*podSockets{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		proc := filepath.Join("/proc", e.Name())
		environ, err := os.ReadFile(filepath.Join(proc, "environ"))
		if err != nil {
			continue
		}
		var pod string
		for kv := range bytes.SplitSeq(environ, []byte{0}) {
			if uid, ok := bytes.CutPrefix(kv, []byte("GOROVOD_POD_UID=")); ok {
				pod = uids[string(uid)]
			}
		}
		if pod == "" {
			continue
		}
		tcp, err := os.ReadFile(filepath.Join(proc, "net", "tcp"))
		if err != nil {
			continue
		}
		own := map[string]bool{}
		fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(proc, "fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
				own[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
			}
		}
		s := out[pod]
		if s == nil {
			s = &podSockets{}
			out[pod] = s
		}
		for _, line := range strings.Split(string(tcp), "\n")[1:] {
			// sl local_address rem_address st ... inode (the 10th field);
			// st 0A is LISTEN, 01 ESTABLISHED.
			f := strings.Fields(line)
			if len(f) < 10 || !own[f[9]] {
				continue
			}
			local, ok1 := procTCPAddr(f[1])
			remote, ok2 := procTCPAddr(f[2])
			switch {
			case !ok1 || !ok2:
			case f[3] == "0A":
				s.listen = append(s.listen, local)
			case f[3] == "01":
				s.conns = append(s.conns, [2]netip.AddrPort{local, remote})
			}
		}
	}
	return out
}

// WorkersAtPodIPs is e2eCluster.workersAtPodIPs for the job in namespace ns.
func WorkersAtPodIPs(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns, job string, across bool, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		why, found := workersAtPodIPsNow(ctx, t, admin, ns, job, across)
		if why == "" {
			return found
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's workers at their pod IPs, for %v: %s (%s)", job, within, why, found)
		}
		time.Sleep(200 * time.Millisecond) // polling the API server and /proc, which have no change notification here
	}
}

// workersAtPodIPsNow is one look of WorkersAtPodIPs: why it does not hold
// ("" when it does) and what it found.
func workersAtPodIPsNow(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns, job string, across bool) (why, found string) {
	t.Helper()
	pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job + "," + kube.LabelRole + "=" + kube.RoleWorker})
	if err != nil {
		return err.Error(), ""
	}
	uids, node := map[string]string{}, map[string]string{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.PodIP != p.Spec.NodeName {
			return fmt.Sprintf("pod %s on node %s has IP %q", p.Name, p.Spec.NodeName, p.Status.PodIP), ""
		}
		uids[string(p.UID)], node[p.Name] = p.Name, p.Spec.NodeName
	}
	socks := podsSockets(t, uids)
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(node)) {
		var ls []string
		if s := socks[name]; s != nil {
			for _, l := range s.listen {
				ls = append(ls, l.String())
			}
		}
		parts = append(parts, fmt.Sprintf("%s on %s listening at %v", name, node[name], ls))
	}
	found = strings.Join(parts, "; ")
	if len(node) == 0 {
		return "no worker pod running", found
	}
	nodes := map[string]bool{}
	for name, n := range node {
		nodes[n] = true
		s := socks[name]
		if s == nil || !slices.ContainsFunc(s.listen, func(a netip.AddrPort) bool { return a.Addr().String() == n }) {
			return fmt.Sprintf("%s's worker does not listen at its pod IP %s", name, n), found
		}
	}
	if !across {
		return "", found
	}
	if len(nodes) < 2 {
		return fmt.Sprintf("worker pods on %d node", len(nodes)), found
	}
	// owner: a listening socket at a pod's IP → the pod.
	owner := map[netip.AddrPort]string{}
	for name, s := range socks {
		for _, l := range s.listen {
			if l.Addr().String() == node[name] {
				owner[l] = name
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(socks)) {
		for _, c := range socks[name].conns {
			if to, ok := owner[c[1]]; ok && node[to] != node[name] {
				return "", fmt.Sprintf("%s; %s (on %s) connected from %s to %s's %s (on %s)", found, name, node[name], c[0], to, c[1], node[to])
			}
		}
	}
	return "no connection of a worker to a worker on another node at its address", found
}
