package testkube

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gorovod/gorovod/internal/testing/testdaemon"
)

// A Node is a kubelet with its own containerd (Debian's containerd and runc),
// registered with a ControlPlane, that runs pods from images imported from
// tarballs (no registry is reachable here).
//
// What it takes on these machines: containerd's CRI plugin with
// restrict_oom_score_adj (the machine withholds CAP_SYS_RESOURCE, so runc
// cannot give the pod sandbox the oom_score_adj -998 containerd asks for);
// pods with hostNetwork (no CNI plugin is installed, so the node reports its
// network not ready and only host-network pods start); and no node IP (the
// kubelet refuses a loopback one and the machine's own addresses are not for
// tests), so a pod's status.podIP stays empty and `kubectl logs` cannot reach
// the kubelet: read LogDir instead, or start the node with
// NodeConfig.Reachable. There is no scheduler: pods name the node
// (spec.nodeName).
type Node struct {
	Name    string
	Dir     string
	LogDir  string // the pods' logs: <namespace>_<pod>_<uid>/<container>/0.log
	cp      *ControlPlane
	socket  string // containerd's
	ctrd    *testdaemon.Proc
	kubelet *testdaemon.Proc
}

// NodeConfig configures a node.
type NodeConfig struct {
	// Images are imported into containerd before the kubelet starts. One of
	// them must be PauseRef (a process that waits for SIGTERM), the pod
	// sandbox's image.
	Images   []Image
	PauseRef string
	// StartTimeout bounds the start. Default 2 minutes.
	StartTimeout time.Duration
	// NetworkReady gives containerd a CNI network configuration (a bridge
	// whose plugin is not installed), so that it reports the pod network
	// ready and the node turns Ready, as the gorovod scheduler requires of
	// the nodes it places workers on. Only host-network pods still start:
	// a pod of its own network would fail for want of the plugin.
	NetworkReady bool
	// Reachable names the node by a loopback address of its own
	// (127.0.0.2, 127.0.0.3, … per control plane), where its kubelet
	// listens with a serving certificate of the control plane's kubelet
	// authority and accepts the API server's client certificate, so that
	// the API server reaches it: pod logs (`kubectl logs`), exec, port
	// forwarding. The kubelet takes an IP given as its host name for the
	// node's address without the check that refuses a loopback --node-ip;
	// a host-network pod's status.podIP is then that address too.
	Reachable bool
}

// MissingNode says why a node cannot run here ("" when it can).
func MissingNode(cfg Config) string {
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	var missing []string
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, "kubelet")); err != nil {
		missing = append(missing, filepath.Join(cfg.BinDir, "kubelet"))
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if len(missing) > 0 {
		return "a kubelet cannot run here: missing " + strings.Join(missing, ", ") + " (apt-get install containerd runc)"
	}
	return ""
}

// NewNode starts a node for t (skipping t when it cannot run here) and stops
// it when t ends, before the control plane stops.
func (c *ControlPlane) NewNode(t testing.TB, cfg NodeConfig) *Node {
	t.Helper()
	if why := MissingNode(c.cfg); why != "" {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := c.StartNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- containerd\n%s\n--- kubelet\n%s", n.ctrd.Tail(3000), n.kubelet.Tail(3000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Errorf("stopping the node: %v", err)
		}
	})
	return n
}

// StartNode starts containerd, imports the images and starts a kubelet, and
// waits for the node to register.
func (c *ControlPlane) StartNode(ctx context.Context, cfg NodeConfig) (_ *Node, err error) {
	if why := MissingNode(c.cfg); why != "" {
		return nil, errors.New(why)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	dir, err := os.MkdirTemp("", "cluster-kubelet-")
	if err != nil {
		return nil, err
	}
	n := &Node{Name: "gorovod-" + filepath.Base(dir)[len("cluster-"):], Dir: dir, LogDir: filepath.Join(dir, "pods"), cp: c,
		socket: filepath.Join(dir, "containerd", "containerd.sock")}
	defer func() {
		if err != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if stopErr := n.Stop(stopCtx); stopErr != nil {
				err = fmt.Errorf("%w (and stopping: %v)", err, stopErr)
			}
		}
	}()
	wait, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	for _, sub := range []string{"containerd", "kubelet", "pods", "manifests", "images"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return n, err
		}
	}
	cd := filepath.Join(dir, "containerd")
	conf := fmt.Sprintf(`version = 2
root = "%[1]s/root"
state = "%[1]s/state"
[grpc]
  address = "%[2]s"
[ttrpc]
  address = "%[2]s.ttrpc"
[debug]
  address = "%[1]s/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[3]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "%[1]s/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[1]s/cni/bin"
    conf_dir = "%[1]s/cni/conf"
`, cd, n.socket, cfg.PauseRef)
	if err := os.WriteFile(filepath.Join(cd, "config.toml"), []byte(conf), 0o644); err != nil {
		return n, err
	}
	if cfg.NetworkReady {
		cni := filepath.Join(cd, "cni", "conf")
		if err := os.MkdirAll(cni, 0o755); err != nil {
			return n, err
		}
		if err := os.WriteFile(filepath.Join(cni, "10-gorovod-test.conflist"), []byte(
			`{"cniVersion": "1.0.0", "name": "gorovod-test", "plugins": [{"type": "bridge"}]}`), 0o644); err != nil {
			return n, err
		}
	}
	n.ctrd, err = testdaemon.Start("containerd", []string{"containerd", "--config", filepath.Join(cd, "config.toml")}, nil, filepath.Join(dir, "containerd.log"))
	if err != nil {
		return n, err
	}
	if err := testdaemon.WaitFor(wait, 100*time.Millisecond, func() error {
		return exec.CommandContext(wait, "ctr", "--address", n.socket, "version").Run()
	}, n.ctrd); err != nil {
		return n, fmt.Errorf("containerd: %w", err)
	}
	for i, img := range cfg.Images {
		tarball := filepath.Join(dir, "images", fmt.Sprintf("%d.tar", i))
		if err := img.WriteArchive(tarball); err != nil {
			return n, err
		}
		if out, err := exec.CommandContext(wait, "ctr", "--address", n.socket, "--namespace", "k8s.io", "images", "import", tarball).CombinedOutput(); err != nil {
			return n, fmt.Errorf("importing %s: %w: %s", img.Ref, err, out)
		}
	}

	ports, err := testdaemon.FreePorts(2)
	if err != nil {
		return n, err
	}
	// Unreachable: the kubelet listens on 127.0.0.1 and the node has no
	// address (its loopback --node-ip is refused) rather than the
	// machine's. Reachable: its own loopback address, as above.
	// (addressFlag: for a reachable node, its host name again.)
	address, addressFlag, serving := "127.0.0.1", "--node-ip=127.0.0.1", ""
	if cfg.Reachable {
		c.mu.Lock()
		if c.reachable < 2 {
			c.reachable = 1
		}
		c.reachable++
		k := c.reachable
		c.mu.Unlock()
		if k > 254 {
			return n, errors.New("testkube: no loopback address left for another reachable node")
		}
		ip := net.IPv4(127, 0, 0, byte(k))
		address, n.Name = ip.String(), ip.String()
		addressFlag = "--hostname-override=" + n.Name
		crt, key := filepath.Join(dir, "kubelet-serving.crt"), filepath.Join(dir, "kubelet-serving.key")
		if err := c.kubelets.issue(crt, key, n.Name, x509.ExtKeyUsageServerAuth, ip); err != nil {
			return n, err
		}
		serving = fmt.Sprintf("tlsCertFile: %s\ntlsPrivateKeyFile: %s\n", crt, key)
	}
	kconf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
podLogsDir: %s
staticPodPath: %s
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, address, ports[0], ports[1], c.kubelets.caFile, n.LogDir, filepath.Join(dir, "manifests"), n.socket, n.socket) + serving
	if err := os.WriteFile(filepath.Join(dir, "kubelet.yaml"), []byte(kconf), 0o644); err != nil {
		return n, err
	}
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(c.Kubeconfig(c.AdminToken)), 0o600); err != nil {
		return n, err
	}
	n.kubelet, err = testdaemon.Start("kubelet", []string{filepath.Join(c.cfg.BinDir, "kubelet"),
		"--config=" + filepath.Join(dir, "kubelet.yaml"), "--kubeconfig=" + kubeconfig,
		"--root-dir=" + filepath.Join(dir, "kubelet"), "--cert-dir=" + filepath.Join(dir, "kubelet", "pki"),
		"--hostname-override=" + n.Name, addressFlag, "--v=1"}, nil, filepath.Join(dir, "kubelet.log"))
	if err != nil {
		return n, err
	}
	client, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return n, err
	}
	if err := testdaemon.WaitFor(wait, 200*time.Millisecond, func() error {
		_, err := client.CoreV1().Nodes().Get(wait, n.Name, metav1.GetOptions{})
		return err
	}, n.ctrd, n.kubelet); err != nil {
		return n, fmt.Errorf("kubelet: %w\n%s", err, n.kubelet.Tail(3000))
	}
	return n, nil
}

// Stop deletes the node's pods, stops the kubelet, kills what containerd
// still runs, stops containerd, unmounts what they left mounted and removes
// the directory.
func (n *Node) Stop(ctx context.Context) error {
	var errs []error
	if client, err := kubernetes.NewForConfig(n.cp.AdminConfig()); err == nil && n.kubelet != nil {
		zero := int64(0)
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err == nil {
			for _, p := range pods.Items {
				_ = client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}
		}
		_ = client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	}
	if n.kubelet != nil {
		if err := n.kubelet.Stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if n.ctrd != nil {
		ctr := func(args ...string) []string {
			out, _ := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...).Output()
			return strings.Fields(string(out))
		}
		for _, id := range ctr("tasks", "ls", "-q") {
			ctr("tasks", "kill", "--signal", "SIGKILL", "--all", id)
			ctr("tasks", "delete", "--force", id)
		}
		for _, id := range ctr("containers", "ls", "-q") {
			ctr("containers", "delete", id)
		}
		if err := n.ctrd.Stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// The shims (and any container process left) name our socket.
	if err := testdaemon.KillMarked(testdaemon.Marker{Cmdline: n.socket}); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(n.Dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(append(errs, fmt.Errorf("node files kept in %s", n.Dir))...)
	}
	return os.RemoveAll(n.Dir)
}

// unmountUnder unmounts every mount point under dir, deepest first (the
// kubelet makes its root directory a mount of its own; containerd mounts
// container root file systems).
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}
