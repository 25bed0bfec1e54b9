package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gorovod/gorovod/internal/envconfig"
)

// resolvedKube is how a command reaches the API server.
type resolvedKube struct {
	config *rest.Config
	// namespace is the chosen context's namespace, or in a pod its service
	// account's; "default" when neither names one.
	namespace string
	// source says where the configuration came from, for messages.
	source string
}

// errNoCluster says that nothing names an API server.
var errNoCluster = errors.New("no Kubernetes cluster configured: give --kubeconfig, set $KUBECONFIG or write ~/.kube/config (or run in a pod)")

// resolveKube finds the API server as kubectl does, for every command that
// talks to one: the --kubeconfig file when given (it must load); else the
// files of $KUBECONFIG, merged in order (the first to set a value wins;
// missing files are skipped); else ~/.kube/config; and when those give no
// configuration at all, the pod's service account (in-cluster). context, when
// not empty, picks the kubeconfig's context instead of its current one.
func resolveKube(explicit, context string, access envconfig.KubeAccess) (resolvedKube, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: explicit}
	source := "--kubeconfig " + explicit
	switch {
	case explicit != "":
	case len(access.Kubeconfigs) > 0:
		rules.Precedence = access.Kubeconfigs
		source = "$KUBECONFIG (" + strings.Join(access.Kubeconfigs, string(filepath.ListSeparator)) + ")"
	case access.HomeKubeconfig != "":
		rules.Precedence = []string{access.HomeKubeconfig}
		source = access.HomeKubeconfig
	}
	merged := clientcmdapi.NewConfig()
	if explicit != "" || len(rules.Precedence) > 0 {
		var err error
		if merged, err = rules.Load(); err != nil {
			return resolvedKube{}, fmt.Errorf("the kubeconfig from %s: %w", source, err)
		}
	}
	if explicit == "" && clientcmdapi.IsConfigEmpty(merged) {
		if !access.InCluster() {
			return resolvedKube{}, errNoCluster
		}
		return inClusterKube(access)
	}
	cc := clientcmd.NewNonInteractiveClientConfig(*merged, "", &clientcmd.ConfigOverrides{CurrentContext: context}, rules)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return resolvedKube{}, fmt.Errorf("the kubeconfig from %s: %w", source, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return resolvedKube{}, fmt.Errorf("the kubeconfig's namespace from %s: %w", source, err)
	}
	return resolvedKube{config: cfg, namespace: ns, source: source}, nil
}

// inClusterKube is the pod's service account: the API server the kubelet
// named, the mounted token (read again as it rotates) and CA.
func inClusterKube(access envconfig.KubeAccess) (resolvedKube, error) {
	tokenFile := filepath.Join(access.ServiceAccountDir, "token")
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return resolvedKube{}, fmt.Errorf("in a pod (%s is set), but its service account token: %w", envconfig.EnvKubernetesServiceHost, err)
	}
	cfg := &rest.Config{
		Host:            "https://" + net.JoinHostPort(access.ServiceHost, access.ServicePort),
		BearerToken:     strings.TrimSpace(string(token)),
		BearerTokenFile: tokenFile,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(access.ServiceAccountDir, "ca.crt")},
	}
	ns := "default"
	if b, err := os.ReadFile(filepath.Join(access.ServiceAccountDir, "namespace")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			ns = s
		}
	}
	return resolvedKube{config: cfg, namespace: ns, source: "the pod's service account"}, nil
}
