package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// kubeconfigUsage is the help of every command's --kubeconfig flag.
const kubeconfigUsage = "a kubeconfig `file` (default: the files of $KUBECONFIG, merged, else ~/.kube/config, else the pod's service account)"

// kubeFlags are the job commands' ways to reach a cluster, as kubectl's:
// --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the pod's
// service account (in-cluster); --context picks a context, whose namespace
// is the default one.
type kubeFlags struct {
	kubeconfig    string
	context       string
	namespace     string
	allNamespaces bool
}

func (k *kubeFlags) register(fs *flag.FlagSet, allNamespaces bool) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", kubeconfigUsage)
	fs.StringVar(&k.context, "context", "", "the kubeconfig `context` to use (default: its current context)")
	fs.StringVar(&k.namespace, "namespace", "", "the `namespace` (default: the context's, else \"default\")")
	fs.StringVar(&k.namespace, "n", "", "short for --namespace")
	if allNamespaces {
		fs.BoolVar(&k.allNamespaces, "all-namespaces", false, "the jobs of every namespace")
		fs.BoolVar(&k.allNamespaces, "A", false, "short for --all-namespaces")
	}
}

// kubeClients are the clients of one cluster, for one namespace.
type kubeClients struct {
	config    *rest.Config
	host      string
	namespace string
	core      kubernetes.Interface
	dynamic   dynamic.Interface
}

// errCRDMissing says the GorovodJob resource is not installed.
var errCRDMissing = fmt.Errorf("the %s resource (%s/%s) is not installed in this cluster: apply deploy/kubernetes/gorovod.yaml (kubectl apply -f deploy/kubernetes/gorovod.yaml)",
	api.Kind, api.Group, api.Version)

// connect finds the API server as kubectl does (resolveKube) and checks that the API
// server answers and serves GorovodJobs.
func (k *kubeFlags) connect(ctx context.Context) (*kubeClients, error) {
	r, err := resolveKube(k.kubeconfig, k.context, envconfig.LoadKubeAccess(os.Getenv))
	if err != nil {
		return nil, err
	}
	cfg, ns := r.config, k.namespace
	if ns == "" {
		ns = r.namespace
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second // every request but a log's stream
	}
	c := &kubeClients{config: cfg, host: cfg.Host, namespace: ns}
	if c.core, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return c, c.checkCRD(ctx)
}

// checkCRD asks the API server for the GorovodJob resource: an error names
// an unreachable server or a missing CustomResourceDefinition.
func (c *kubeClients) checkCRD(ctx context.Context) error {
	d, err := discovery.NewDiscoveryClientForConfig(c.config)
	if err != nil {
		return err
	}
	type result struct{ err error }
	done := make(chan result, 1)
	go func() {
		list, err := d.ServerResourcesForGroupVersion(api.Group + "/" + api.Version)
		if err == nil {
			err = errCRDMissing
			for _, r := range list.APIResources {
				if r.Name == api.Resource {
					err = nil
				}
			}
		}
		done <- result{err}
	}()
	var err2 error
	select {
	case r := <-done:
		err2 = r.err
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case err2 == nil || errors.Is(err2, errCRDMissing):
		return err2
	case apierrors.IsNotFound(err2):
		return errCRDMissing
	}
	return c.apiError(err2)
}

// apiError says what an error of the API server means to the user.
func (c *kubeClients) apiError(err error) error {
	var uerr *url.Error
	var nerr net.Error
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server at %s refused the credentials: %w", c.host, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed: %w", err)
	case errors.As(err, &uerr) || errors.As(err, &nerr):
		return fmt.Errorf("cannot reach the Kubernetes API server at %s: %w", c.host, err)
	}
	return err
}

// jobs is the GorovodJob resource of the namespace ("" with
// --all-namespaces: every namespace's).
func (c *kubeClients) jobs(namespace string) dynamic.ResourceInterface {
	if namespace == "" {
		return c.dynamic.Resource(api.GroupVersionResource())
	}
	return c.dynamic.Resource(api.GroupVersionResource()).Namespace(namespace)
}

// getJob reads a GorovodJob, with a clear error when it does not exist.
func (c *kubeClients) getJob(ctx context.Context, name string) (*api.GorovodJob, error) {
	u, err := c.jobs(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("gorovodjob %q not found in namespace %s", name, c.namespace)
	}
	if err != nil {
		return nil, c.apiError(err)
	}
	return api.FromUnstructured(u)
}
