package testkube

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gorovod/gorovod/internal/testing/testdaemon"
)

// Version is the Kubernetes release the build script builds.
const Version = "v1.31.4"

// DefaultBinDir is where deploy/kubernetes/build-control-plane.sh puts the
// binaries by default.
const DefaultBinDir = "/var/cache/gorovod/k8s-" + Version + "/bin"

// Config configures the control plane.
type Config struct {
	// BinDir holds kube-apiserver and kube-controller-manager. Default
	// DefaultBinDir.
	BinDir string
	// StartTimeout bounds the start (etcd, the API server ready, the
	// default service account created). Default 3 minutes: the API server
	// starts slowly on a busy machine.
	StartTimeout time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{BinDir: DefaultBinDir, StartTimeout: 3 * time.Minute}
}

// ServiceCIDR is the cluster's service IP range: a piece of the benchmarking
// range 198.18.0.0/15, as nothing here may use private addresses. Headless
// services take no IP from it; the API server's own "kubernetes" service does.
const ServiceCIDR = "198.18.250.0/24"

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
type ControlPlane struct {
	Dir        string
	URL        string // https://127.0.0.1:port
	AdminToken string
	CACert     string // the API server's self-signed serving certificate
	cfg        Config
	daemons    []*testdaemon.Proc
	kubelets   *kubeletPKI
	// mu guards reachable, the last loopback address a reachable node
	// was given (127.0.0.<reachable>).
	mu        sync.Mutex
	reachable int
}

// Missing says why the control plane cannot run here ("" when it can).
func Missing(cfg Config) string {
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	var missing []string
	for _, p := range []string{"etcd", "openssl"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			missing = append(missing, filepath.Join(cfg.BinDir, b)+" (deploy/kubernetes/build-control-plane.sh builds it)")
		}
	}
	if len(missing) > 0 {
		return "Kubernetes control plane not available: " + strings.Join(missing, ", ")
	}
	return ""
}

// New starts a control plane for t, skipping t when it cannot run here, and
// stops it when t ends.
func New(t testing.TB, cfg Config) *ControlPlane {
	t.Helper()
	if why := Missing(cfg); why != "" {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(3000))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	return c
}

// Start starts etcd, the API server and the controller manager and waits
// until the API server is ready and the "default" namespace has its default
// service account. Ports lost to another process between being picked and
// bound make it try again, up to three times.
func Start(ctx context.Context, cfg Config) (*ControlPlane, error) {
	def := DefaultConfig()
	if cfg.BinDir == "" {
		cfg.BinDir = def.BinDir
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = def.StartTimeout
	}
	if why := Missing(cfg); why != "" {
		return nil, errors.New(why)
	}
	return testdaemon.RetryPortTaken(ctx, 3, func() (*ControlPlane, error) { return start(ctx, cfg) })
}

func start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	dir, err := os.MkdirTemp("", "cluster-kube-")
	if err != nil {
		return nil, err
	}
	c := &ControlPlane{Dir: dir, cfg: cfg}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and stopping: %v)", err, stopErr)
			}
		}
	}()
	wait, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	for _, sub := range []string{"etcd", "certs", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return c, err
		}
	}
	// The service-account signing key pair.
	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	for _, args := range [][]string{
		{"genrsa", "-out", saKey, "2048"},
		{"rsa", "-in", saKey, "-pubout", "-out", saPub},
	} {
		if out, err := exec.CommandContext(wait, "openssl", args...).CombinedOutput(); err != nil {
			return c, fmt.Errorf("openssl %s: %w: %s", args[0], err, out)
		}
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	c.AdminToken = hex.EncodeToString(tok)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.AdminToken+`,gorovod-test-admin,gorovod-test-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return c, err
	}
	ports, err := testdaemon.FreePorts(4)
	if err != nil {
		return c, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	etcd, err := testdaemon.Start("etcd", []string{"etcd", "--name=gorovod-test", "--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=gorovod-test=" + peerURL, "--log-level=warn"}, nil, filepath.Join(dir, "log", "etcd.log"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, etcd)
	if err := testdaemon.WaitFor(wait, 100*time.Millisecond, func() error { return httpOK(etcdURL+"/health", "", "") }, etcd); err != nil {
		return c, c.portError("etcd", err, etcd)
	}

	c.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	certDir := filepath.Join(dir, "certs")
	// The API server's client certificate for the kubelets, and the
	// authority it checks their serving certificates with.
	if c.kubelets, err = newKubeletPKI(filepath.Join(certDir, "kubelet-ca.crt")); err != nil {
		return c, err
	}
	clientCert, clientKey := filepath.Join(certDir, "kubelet-client.crt"), filepath.Join(certDir, "kubelet-client.key")
	if err := c.kubelets.issue(clientCert, clientKey, "kube-apiserver-kubelet-client", x509.ExtKeyUsageClientAuth); err != nil {
		return c, err
	}
	api, err := testdaemon.Start("kube-apiserver", []string{filepath.Join(cfg.BinDir, "kube-apiserver"),
		"--etcd-servers=" + etcdURL,
		fmt.Sprintf("--secure-port=%d", ports[2]), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--cert-dir=" + certDir,
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--kubelet-client-certificate=" + clientCert, "--kubelet-client-key=" + clientKey,
		"--kubelet-certificate-authority=" + c.kubelets.caFile,
		"--enable-priority-and-fairness=false", "--v=1"}, nil, filepath.Join(dir, "log", "kube-apiserver.log"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, api)
	c.CACert = filepath.Join(certDir, "apiserver.crt")
	if err := testdaemon.WaitFor(wait, 200*time.Millisecond, func() error {
		// The API server writes its self-signed certificate first thing.
		return httpOK(c.URL+"/readyz", c.AdminToken, c.CACert)
	}, api); err != nil {
		return c, c.portError("kube-apiserver", err, api)
	}

	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(c.Kubeconfig(c.AdminToken)), 0o600); err != nil {
		return c, err
	}
	kcm, err := testdaemon.Start("kube-controller-manager", []string{filepath.Join(cfg.BinDir, "kube-controller-manager"),
		"--kubeconfig=" + kubeconfig, "--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--service-account-private-key-file=" + saKey, "--root-ca-file=" + c.CACert,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", ports[3]),
		"--cert-dir=" + filepath.Join(dir, "certs"), "--v=1"}, nil, filepath.Join(dir, "log", "kube-controller-manager.log"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, kcm)
	client, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return c, err
	}
	if err := c.WaitForServiceAccount(wait, client, "default"); err != nil {
		return c, c.portError("kube-controller-manager", err, kcm)
	}
	return c, nil
}

// portError marks err as a lost port when the daemon's log says so.
func (c *ControlPlane) portError(name string, err error, d *testdaemon.Proc) error {
	if strings.Contains(d.Tail(8000), "address already in use") {
		return fmt.Errorf("%w: %s: %w", testdaemon.ErrPortTaken, name, err)
	}
	return fmt.Errorf("%s: %w\n%s", name, err, c.Logs(3000))
}

// httpOK GETs url, trusting caFile for https, and wants 200.
func httpOK(url, token, caFile string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	transport := &http.Transport{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no certificate", caFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Timeout: 5 * time.Second, Transport: transport}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// AdminConfig is a client configuration with the admin token.
func (c *ControlPlane) AdminConfig() *rest.Config { return c.ConfigFor(c.AdminToken) }

// ConfigFor is a client configuration authenticating with token (a
// service account's, say).
func (c *ControlPlane) ConfigFor(token string) *rest.Config {
	return &rest.Config{Host: c.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: c.CACert},
		QPS: 100, Burst: 200}
}

// Kubeconfig renders a kubeconfig file for token (for kubectl and the
// controller manager).
func (c *ControlPlane) Kubeconfig(token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: gorovod-test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: user
  user:
    token: %s
contexts:
- name: gorovod-test
  context:
    cluster: gorovod-test
    user: user
current-context: gorovod-test
`, c.URL, c.CACert, token)
}

// WaitForServiceAccount waits for the controller manager to create
// namespace's default service account (pods are refused before).
func (c *ControlPlane) WaitForServiceAccount(ctx context.Context, client kubernetes.Interface, namespace string) error {
	return testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
		_, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	}, c.daemons...)
}

// Namespace creates a namespace and waits for its default service account.
func (c *ControlPlane) Namespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return c.WaitForServiceAccount(ctx, client, name)
}

// AdminClient is a client with the admin token, once each of namespaces
// exists with its default service account (Namespace); it fails t if
// either cannot be had.
func (c *ControlPlane) AdminClient(ctx context.Context, t testing.TB, namespaces ...string) kubernetes.Interface {
	t.Helper()
	admin, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		if err := c.Namespace(ctx, admin, ns); err != nil {
			t.Fatal(err)
		}
	}
	return admin
}

// Logs returns the end of each daemon's log.
func (c *ControlPlane) Logs(n int) string {
	var b strings.Builder
	for _, d := range c.daemons {
		fmt.Fprintf(&b, "--- %s\n%s\n", d.Name, d.Tail(n))
	}
	return b.String()
}

// Stop ends the daemons (SIGTERM, then SIGKILL) and removes the directory;
// it keeps the directory and returns an error if a daemon had to be killed.
func (c *ControlPlane) Stop() error {
	var errs []error
	for i := len(c.daemons) - 1; i >= 0; i-- {
		if err := c.daemons[i].Stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(append(errs, fmt.Errorf("logs kept in %s", c.Dir))...)
	}
	return os.RemoveAll(c.Dir)
}
