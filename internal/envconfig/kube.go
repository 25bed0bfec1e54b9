package envconfig

import (
	"path/filepath"
	"slices"
	"strings"
)

// The variables that say where the Kubernetes API server is, as kubectl
// reads them.
const (
	// EnvKubeconfig is kubectl's list of kubeconfig files (separated by the
	// system's path-list separator, ':' on Linux), merged in order.
	EnvKubeconfig = "KUBECONFIG"
	// EnvHome locates ~/.kube/config.
	EnvHome = "HOME"
	// EnvKubernetesServiceHost and EnvKubernetesServicePort are set by the
	// kubelet in every pod: the API server's in-cluster address.
	EnvKubernetesServiceHost = "KUBERNETES_SERVICE_HOST"
	EnvKubernetesServicePort = "KUBERNETES_SERVICE_PORT"
)

// ServiceAccountDir is where the kubelet mounts a pod's service account
// (token, ca.crt, namespace).
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// KubeAccess is what the environment says about reaching the Kubernetes API
// server; a command's --kubeconfig flag comes before all of it.
type KubeAccess struct {
	// Kubeconfigs are $KUBECONFIG's files in order, empty and repeated
	// entries dropped. When there are any, ~/.kube/config is not read, even
	// where none of them exists (kubectl's rule).
	Kubeconfigs []string
	// HomeKubeconfig is ~/.kube/config ("" without $HOME).
	HomeKubeconfig string
	// ServiceHost and ServicePort are the in-cluster API server ("" outside
	// a pod); ServiceAccountDir holds the pod's token, CA and namespace.
	ServiceHost, ServicePort string
	ServiceAccountDir        string
}

// InCluster says whether this process runs in a pod that was given the API
// server's address.
func (k KubeAccess) InCluster() bool { return k.ServiceHost != "" && k.ServicePort != "" }

// LoadKubeAccess reads the environment's ways to the API server.
func LoadKubeAccess(getenv func(string) string) KubeAccess {
	k := KubeAccess{ServiceHost: getenv(EnvKubernetesServiceHost), ServicePort: getenv(EnvKubernetesServicePort),
		ServiceAccountDir: ServiceAccountDir}
	for _, p := range filepath.SplitList(getenv(EnvKubeconfig)) {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(k.Kubeconfigs, p) {
			k.Kubeconfigs = append(k.Kubeconfigs, p)
		}
	}
	if home := getenv(EnvHome); home != "" {
		k.HomeKubeconfig = filepath.Join(home, ".kube", "config")
	}
	return k
}
