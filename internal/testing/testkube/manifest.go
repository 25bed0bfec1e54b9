package testkube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
)

// manifestResource is the resource of a kind deploy/kubernetes/gorovod.yaml
// holds, and whether it is namespaced.
type manifestResource struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}

// manifestResources maps the kinds of gorovod.yaml to their resources.
func manifestResources() map[string]manifestResource {
	return map[string]manifestResource{
		"CustomResourceDefinition": {schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}, false},
		"Namespace":                {schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, false},
		"ServiceAccount":           {schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
		"ClusterRole":              {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
		"ClusterRoleBinding":       {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
		"Role":                     {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
		"RoleBinding":              {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
		"Deployment":               {schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, true},
	}
}

// ApplyManifest creates every object of the install manifest at path
// (deploy/kubernetes/gorovod.yaml), as `kubectl apply -f` would on an empty
// cluster; the Deployment only as a dry run (no kube-scheduler runs its pods
// here: tests run the scheduler themselves, as the Deployment's service
// account). It returns once the GorovodJob resource is served.
func ApplyManifest(ctx context.Context, dyn dynamic.Interface, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	resources := manifestResources()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	kinds := map[string]int{}
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if u.Object == nil {
			continue
		}
		r, ok := resources[u.GetKind()]
		if !ok {
			return fmt.Errorf("%s: no way to apply a %s", path, u.GetKind())
		}
		opts := metav1.CreateOptions{}
		if u.GetKind() == "Deployment" {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(r.gvr)
		if r.namespaced {
			ri = dyn.Resource(r.gvr).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(ctx, &u, opts); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		kinds[u.GetKind()]++
	}
	if len(kinds) != len(resources) {
		return fmt.Errorf("%s holds %v, want every one of %d kinds", path, kinds, len(resources))
	}
	// The CRD serves once it is established.
	if err := testdaemon.WaitFor(ctx, 200*time.Millisecond, func() error {
		_, err := dyn.Resource(api.GroupVersionResource()).Namespace("default").List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("the GorovodJob resource never served: %w", err)
	}
	return nil
}
