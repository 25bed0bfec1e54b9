package api

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

func TestSpecValidate(t *testing.T) {
	ok := Spec{Image: "img", Command: []string{"train"}, MinWorkers: 1, MaxWorkers: 4}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string // "" for valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"no bound above", func(s *Spec) { s.MaxWorkers = 0 }, ""},
		{"no image", func(s *Spec) { s.Image = "" }, "spec.image"},
		{"no command", func(s *Spec) { s.Command = nil }, "spec.command"},
		{"no workers", func(s *Spec) { s.MinWorkers = 0 }, "spec.minWorkers"},
		{"max below min", func(s *Spec) { s.MinWorkers, s.MaxWorkers = 3, 2 }, "spec.maxWorkers"},
		{"negative batch", func(s *Spec) { s.Batch.Min = -1 }, "spec.batch"},
		{"batch min above max", func(s *Spec) { s.Batch.Min, s.Batch.Max = 64, 32 }, "spec.batch.min"},
		{"tolerations", func(s *Spec) {
			sec := int64(30)
			s.Tolerations = []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "vision", Effect: corev1.TaintEffectNoSchedule},
				{Key: "example.com/spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &sec},
				{Operator: corev1.TolerationOpExists}, {Key: "no-operator-is-equal", Value: "v"}}
		}, ""},
		{"toleration bad key", func(s *Spec) { s.Tolerations = []corev1.Toleration{{Key: "a b", Operator: corev1.TolerationOpExists}} }, "spec.tolerations[0]: key"},
		{"toleration empty key with Equal", func(s *Spec) { s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpEqual, Value: "v"}} }, "needs operator Exists"},
		{"toleration Exists with value", func(s *Spec) {
			s.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}}
		}, "takes no value"},
		{"toleration bad operator", func(s *Spec) { s.Tolerations = []corev1.Toleration{{Key: "k", Operator: "In"}} }, "operator \"In\""},
		{"toleration bad effect", func(s *Spec) { s.Tolerations = []corev1.Toleration{{Key: "k", Effect: "Sometimes"}} }, "effect"},
		{"toleration seconds without NoExecute", func(s *Spec) {
			sec := int64(5)
			s.Tolerations = []corev1.Toleration{{Key: "k", Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: &sec}}
		}, "tolerationSeconds"},
		{"toleration bad value", func(s *Spec) { s.Tolerations = []corev1.Toleration{{Key: "k", Value: "not a label value"}} }, "value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			tc.edit(&s)
			err := s.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestUnstructuredRoundTrip(t *testing.T) {
	now := metav1.Unix(1700000000, 0)
	j := &GorovodJob{
		ObjectMeta: metav1.ObjectMeta{Name: "mnist", Namespace: "team"},
		Spec: Spec{Image: "img", Command: []string{"train", "--epochs", "3"}, MinWorkers: 1, MaxWorkers: 4, Batch: BatchBounds{Initial: 64, Max: 1024}, Priority: 2,
			Tolerations: []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "vision", Effect: corev1.TaintEffectNoSchedule}}},
		Status: Status{Phase: PhaseRunning, Allocation: []string{"n1", "n1", "n2"}, WorldSize: 3, SubmitTime: &now, DriverRestarts: 1,
			Adoption: &Adoption{JobID: "j1", Seeds: []string{"198.18.0.5:7946"}, SecretName: "mnist-secret-0123456789", MinWorkers: 1},
			Goodput:  &GoodputStatus{Model: goodput.Model{Perf: goodput.PerfParams{AlphaC: 0.01, BetaC: 1e-4, Gamma: 1.5}, Grad: goodput.GradParams{Sqr: 1, Var: 2}, InitBatch: 64}, MaxProfiledWorkers: 3, FittedAt: now}},
	}
	u, err := ToUnstructured(j)
	if err != nil {
		t.Fatal(err)
	}
	if u.GetKind() != Kind || u.GetAPIVersion() != "gorovod.io/v1alpha1" {
		t.Fatalf("kind %q apiVersion %q", u.GetKind(), u.GetAPIVersion())
	}
	back, err := FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	back.TypeMeta = j.TypeMeta
	if !reflect.DeepEqual(back, j) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, j)
	}
	if !PhaseSucceeded.Ended() || PhaseRunning.Ended() {
		t.Fatal("Ended")
	}
}
