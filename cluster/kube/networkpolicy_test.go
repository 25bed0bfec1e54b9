package kube

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNetworkPolicyMatchesTheJob: deploy/kubernetes/networkpolicy.yaml
// guards exactly the pods of driver.yaml's job — its driver and the worker
// pods the provisioner makes — and lets in only those, not another job's
// pods nor unlabelled ones.
func TestNetworkPolicyMatchesTheJob(t *testing.T) {
	np, ok := manifest(t, "networkpolicy.yaml")[0].(*networkingv1.NetworkPolicy)
	if !ok {
		t.Fatal("networkpolicy.yaml does not start with a NetworkPolicy")
	}
	driver := manifest(t, "driver.yaml")[0].(*batchv1.Job)
	cfg := testConfig(newClientset(), newEvents())
	cfg.Job = driver.Name
	worker := newTest(t, cfg).WorkerPod(0)

	selector := func(s *metav1.LabelSelector) labels.Selector {
		t.Helper()
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Fatalf("policy types %v, want Ingress only", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		np.Spec.Ingress[0].From[0].NamespaceSelector != nil || np.Spec.Ingress[0].From[0].IPBlock != nil || len(np.Spec.Ingress[0].Ports) != 0 {
		t.Fatalf("ingress %+v, want one rule: from the job's pods in this namespace, to any port", np.Spec.Ingress)
	}
	guarded, from := selector(&np.Spec.PodSelector), selector(np.Spec.Ingress[0].From[0].PodSelector)
	if guarded.Empty() || from.Empty() {
		t.Fatal("a selector matches every pod")
	}
	for _, tc := range []struct {
		what   string
		labels map[string]string
		in     bool
	}{
		{"the driver", driver.Spec.Template.Labels, true},
		{"a worker", worker.Labels, true},
		{"another job's worker", map[string]string{LabelJob: "other", LabelRole: RoleWorker}, false},
		{"an unlabelled pod", map[string]string{}, false},
	} {
		set := labels.Set(tc.labels)
		if guarded.Matches(set) != tc.in || from.Matches(set) != tc.in {
			t.Errorf("%s (%v): guarded %v, let in %v; want %v", tc.what, tc.labels, guarded.Matches(set), from.Matches(set), tc.in)
		}
	}
}
