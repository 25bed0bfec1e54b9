package service

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// TestSchemaAgainstAPIServer: the GorovodJob schema of
// deploy/kubernetes/gorovod.yaml keeps spec.tolerations and the adoption
// fields of the status (a structural schema prunes what it does not name),
// spec.nodeSelector, spec.requiredNodeAffinity and
// spec.preferredNodeAffinity, and refuses a toleration or node selector
// requirement the Pod API would refuse for its operator or effect, and a
// preference's weight outside 1 to 100 or more than api.MaxPreferredTerms
// preferences; it keeps spec.probeTimeout and refuses one that is not a
// duration above 0 and at most api.MaxProbeTimeout; it keeps
// spec.maxWorkersPerNode and refuses one outside 0 to
// api.MaxWorkersPerNodeLimit.
func TestSchemaAgainstAPIServer(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	applyManifest(ctx, t, dyn)
	const ns = "schema"
	if err := cp.Namespace(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	jobs := dyn.Resource(api.GroupVersionResource()).Namespace(ns)
	sec := int64(30)
	tolerate := []corev1.Toleration{{Key: "example.com/spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &sec},
		{Key: "team", Operator: corev1.TolerationOpEqual, Value: "vision", Effect: corev1.TaintEffectNoSchedule}}
	create := func(name string, tol []corev1.Toleration, edit ...func(*api.Spec)) (*api.GorovodJob, error) {
		j := &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: api.Spec{Image: "img", Command: []string{"train"}, MinWorkers: 1, Tolerations: tol}}
		for _, e := range edit {
			e(&j.Spec)
		}
		u, err := api.ToUnstructured(j)
		if err != nil {
			t.Fatal(err)
		}
		// A schema refusal must come from the API server (retried: the
		// CRD's schema may take a moment to be served).
		var got *api.GorovodJob
		for {
			out, err := jobs.Create(ctx, u, metav1.CreateOptions{})
			if err == nil {
				got, err = api.FromUnstructured(out)
				return got, err
			}
			if !strings.Contains(err.Error(), "the server could not find the requested resource") || ctx.Err() != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	got, err := create("tolerant", tolerate)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Spec.Tolerations, tolerate) {
		t.Fatalf("spec.tolerations as stored: %+v", got.Spec.Tolerations)
	}
	for _, bad := range []corev1.Toleration{{Key: "k", Operator: "In"}, {Key: "k", Operator: corev1.TolerationOpExists, Effect: "Sometimes"}} {
		if _, err := create("bad-"+strings.ToLower(string(bad.Operator)), []corev1.Toleration{bad}); err == nil || !strings.Contains(err.Error(), "spec.tolerations") {
			t.Errorf("toleration %+v: got %v, want the schema to refuse it", bad, err)
		}
	}
	// The node selection: kept, and an operator the Pod API refuses is
	// refused.
	pin := func(op corev1.NodeSelectorOperator) func(*api.Spec) {
		return func(s *api.Spec) {
			s.NodeSelector = map[string]string{"example.com/pool": "a100"}
			s.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: op, Values: []string{"z1", "z2"}}}},
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}}}}}
		}
	}
	pinned, err := create("pinned", nil, pin(corev1.NodeSelectorOpIn))
	if err != nil {
		t.Fatal(err)
	}
	var want api.Spec
	pin(corev1.NodeSelectorOpIn)(&want)
	if !reflect.DeepEqual(pinned.Spec.NodeSelector, want.NodeSelector) || !reflect.DeepEqual(pinned.Spec.RequiredNodeAffinity, want.RequiredNodeAffinity) {
		t.Fatalf("spec.nodeSelector %v and spec.requiredNodeAffinity %+v as stored", pinned.Spec.NodeSelector, pinned.Spec.RequiredNodeAffinity)
	}
	if _, err := create("bad-affinity", nil, pin("Equal")); err == nil || !strings.Contains(err.Error(), "spec.requiredNodeAffinity") {
		t.Errorf("a node selector operator Equal: got %v, want the schema to refuse it", err)
	}
	// The node preferences: kept, and a weight outside 1 to 100, a bad
	// operator or more than api.MaxPreferredTerms terms refused.
	prefer := func(weight int32, op corev1.NodeSelectorOperator, terms int) func(*api.Spec) {
		return func(s *api.Spec) {
			for range terms {
				s.PreferredNodeAffinity = append(s.PreferredNodeAffinity, corev1.PreferredSchedulingTerm{Weight: weight, Preference: corev1.NodeSelectorTerm{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: op, Values: []string{"z1"}}},
					MatchFields:      []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-2"}}}}})
			}
		}
	}
	preferring, err := create("preferring", nil, prefer(30, corev1.NodeSelectorOpIn, 2))
	if err != nil {
		t.Fatal(err)
	}
	want = api.Spec{}
	prefer(30, corev1.NodeSelectorOpIn, 2)(&want)
	if !reflect.DeepEqual(preferring.Spec.PreferredNodeAffinity, want.PreferredNodeAffinity) {
		t.Fatalf("spec.preferredNodeAffinity %+v as stored", preferring.Spec.PreferredNodeAffinity)
	}
	for _, bad := range []struct {
		name string
		edit func(*api.Spec)
	}{
		{"bad-weight-0", prefer(0, corev1.NodeSelectorOpIn, 1)},
		{"bad-weight-101", prefer(101, corev1.NodeSelectorOpIn, 1)},
		{"bad-operator", prefer(10, "Equal", 1)},
		{"bad-terms", prefer(10, corev1.NodeSelectorOpIn, api.MaxPreferredTerms+1)},
	} {
		if _, err := create(bad.name, nil, bad.edit); err == nil || !strings.Contains(err.Error(), "spec.preferredNodeAffinity") {
			t.Errorf("%s: got %v, want the schema to refuse it", bad.name, err)
		}
	}
	// The probe timeout: kept, and one that is not a duration above 0
	// and at most api.MaxProbeTimeout refused.
	probing, err := create("probing", nil, func(s *api.Spec) { s.ProbeTimeout = &metav1.Duration{Duration: 2500 * time.Millisecond} })
	if err != nil {
		t.Fatal(err)
	}
	if pt := probing.Spec.ProbeTimeout; pt == nil || pt.Duration != 2500*time.Millisecond {
		t.Fatalf("spec.probeTimeout as stored: %v", pt)
	}
	for _, bad := range []string{"0s", "-1s", "10m1s", "soon", "3"} {
		j := &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: "bad-probe", Namespace: ns}, Spec: api.Spec{Image: "img", Command: []string{"train"}, MinWorkers: 1}}
		u, err := api.ToUnstructured(j)
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(u.Object, bad, "spec", "probeTimeout"); err != nil {
			t.Fatal(err)
		}
		if _, err := jobs.Create(ctx, u, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "spec.probeTimeout") {
			t.Errorf("spec.probeTimeout %q: got %v, want the schema to refuse it", bad, err)
		}
	}
	// The cap per node: kept, and one outside 0 to
	// api.MaxWorkersPerNodeLimit refused.
	spread, err := create("spread", nil, func(s *api.Spec) { s.MaxWorkersPerNode = 1 })
	if err != nil {
		t.Fatal(err)
	}
	if spread.Spec.MaxWorkersPerNode != 1 {
		t.Fatalf("spec.maxWorkersPerNode as stored: %d", spread.Spec.MaxWorkersPerNode)
	}
	if _, err := create("widest", nil, func(s *api.Spec) { s.MaxWorkersPerNode = api.MaxWorkersPerNodeLimit }); err != nil {
		t.Errorf("spec.maxWorkersPerNode %d: %v", api.MaxWorkersPerNodeLimit, err)
	}
	for _, bad := range []int32{-1, api.MaxWorkersPerNodeLimit + 1} {
		if _, err := create(fmt.Sprintf("bad-per-node-%d", bad+1), nil, func(s *api.Spec) { s.MaxWorkersPerNode = bad }); err == nil || !strings.Contains(err.Error(), "spec.maxWorkersPerNode") {
			t.Errorf("spec.maxWorkersPerNode %d: got %v, want the schema to refuse it", bad, err)
		}
	}
	// The driver's and the scheduler's new status fields.
	body, err := json.Marshal(map[string]any{"status": map[string]any{"driverRestarts": 2,
		"adoption": api.Adoption{JobID: "job-1", Seeds: []string{"198.18.0.5:7946"}, Workers: []string{"198.18.0.6:40001", "198.18.0.7:40002"},
			SecretName: "tolerant-secret-0123456789", MinWorkers: 1, ProbeTimeout: &metav1.Duration{Duration: 3 * time.Second}, Ended: true}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := jobs.Patch(ctx, "tolerant", types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	if got, err = api.FromUnstructured(out); err != nil {
		t.Fatal(err)
	}
	if a := got.Status.Adoption; got.Status.DriverRestarts != 2 || a == nil || a.JobID != "job-1" || !slices.Equal(a.Seeds, []string{"198.18.0.5:7946"}) ||
		!slices.Equal(a.Workers, []string{"198.18.0.6:40001", "198.18.0.7:40002"}) ||
		a.SecretName != "tolerant-secret-0123456789" || a.MinWorkers != 1 || a.ProbeTimeout == nil || a.ProbeTimeout.Duration != 3*time.Second || !a.Ended {
		t.Fatalf("status as stored: %+v (adoption %+v)", got.Status, a)
	}
}
