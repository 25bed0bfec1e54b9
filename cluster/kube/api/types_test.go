package api

import (
	"reflect"
	"strings"
	"testing"
	"time"

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
		{"probe timeout", func(s *Spec) { s.ProbeTimeout = &metav1.Duration{Duration: 3 * time.Second} }, ""},
		{"probe timeout at the bound", func(s *Spec) { s.ProbeTimeout = &metav1.Duration{Duration: MaxProbeTimeout} }, ""},
		{"probe timeout zero", func(s *Spec) { s.ProbeTimeout = &metav1.Duration{} }, "spec.probeTimeout"},
		{"probe timeout negative", func(s *Spec) { s.ProbeTimeout = &metav1.Duration{Duration: -time.Second} }, "spec.probeTimeout"},
		{"probe timeout above the bound", func(s *Spec) { s.ProbeTimeout = &metav1.Duration{Duration: MaxProbeTimeout + time.Second} }, "spec.probeTimeout"},
		{"workers per node", func(s *Spec) { s.MaxWorkersPerNode = 1 }, ""},
		{"workers per node at the bound", func(s *Spec) { s.MaxWorkersPerNode = MaxWorkersPerNodeLimit }, ""},
		{"workers per node negative", func(s *Spec) { s.MaxWorkersPerNode = -1 }, "spec.maxWorkersPerNode"},
		{"workers per node above the bound", func(s *Spec) { s.MaxWorkersPerNode = MaxWorkersPerNodeLimit + 1 }, "spec.maxWorkersPerNode"},
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
		{"node selection", func(s *Spec) {
			s.NodeSelector = map[string]string{"example.com/pool": "a100", "zone": ""}
			s.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu-count", Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}}}},
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1.example.com"}}}}}}
		}, ""},
		{"node selector bad key", func(s *Spec) { s.NodeSelector = map[string]string{"a b": "x"} }, "spec.nodeSelector: key \"a b\""},
		{"node selector bad value", func(s *Spec) { s.NodeSelector = map[string]string{"pool": "not a label value"} }, "spec.nodeSelector[pool]: value"},
		{"affinity without terms", func(s *Spec) { s.RequiredNodeAffinity = &corev1.NodeSelector{} }, "nodeSelectorTerms is empty"},
		{"affinity empty term", func(s *Spec) {
			s.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
		}, "nodeSelectorTerms[0] is empty"},
		{"affinity bad operator", func(s *Spec) {
			s.RequiredNodeAffinity = affinity(corev1.NodeSelectorRequirement{Key: "k", Operator: "Equal"})
		}, "operator \"Equal\""},
		{"affinity In without values", func(s *Spec) {
			s.RequiredNodeAffinity = affinity(corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpIn})
		}, "matchExpressions[0]"},
		{"affinity Exists with values", func(s *Spec) {
			s.RequiredNodeAffinity = affinity(corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists, Values: []string{"v"}})
		}, "must be empty"},
		{"affinity Gt not a number", func(s *Spec) {
			s.RequiredNodeAffinity = affinity(corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpGt, Values: []string{"many"}})
		}, "integer"},
		{"affinity bad key", func(s *Spec) {
			s.RequiredNodeAffinity = affinity(corev1.NodeSelectorRequirement{Key: "-k", Operator: corev1.NodeSelectorOpExists})
		}, "key"},
		{"affinity field not the name", func(s *Spec) {
			s.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "spec.unschedulable", Operator: corev1.NodeSelectorOpIn, Values: []string{"false"}}}}}}
		}, "the only field is metadata.name"},
		{"affinity field two names", func(s *Spec) {
			s.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}}}
		}, "takes one value"},
		{"preferences", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{
				prefer(1, corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}}),
				prefer(100, corev1.NodeSelectorRequirement{Key: "gpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}}),
				{Weight: 5, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
					{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}}}}}
		}, ""},
		{"preference weight 0", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(0, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists})}
		}, "spec.preferredNodeAffinity[0].weight 0: want 1 to 100"},
		{"preference weight above 100", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{
				prefer(10, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists}),
				prefer(101, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists})}
		}, "spec.preferredNodeAffinity[1].weight 101: want 1 to 100"},
		{"preference negative weight", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(-3, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists})}
		}, "weight -3"},
		{"preference bad operator", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(10, corev1.NodeSelectorRequirement{Key: "k", Operator: "Equals", Values: []string{"v"}})}
		}, "spec.preferredNodeAffinity[0].preference.matchExpressions[0]: operator \"Equals\": want In, NotIn, Exists, DoesNotExist, Gt or Lt"},
		{"preference In without values", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(10, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpIn})}
		}, "spec.preferredNodeAffinity[0].preference.matchExpressions[0]"},
		{"preference Lt not a number", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(10, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpLt, Values: []string{"few"}})}
		}, "integer"},
		{"preference bad key", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{prefer(10, corev1.NodeSelectorRequirement{Key: "a b", Operator: corev1.NodeSelectorOpExists})}
		}, "spec.preferredNodeAffinity[0].preference.matchExpressions[0]"},
		{"preference empty term", func(s *Spec) { s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{{Weight: 10}} }, "spec.preferredNodeAffinity[0].preference is empty"},
		{"preference field not the name", func(s *Spec) {
			s.PreferredNodeAffinity = []corev1.PreferredSchedulingTerm{{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.uid", Operator: corev1.NodeSelectorOpIn, Values: []string{"x"}}}}}}
		}, "spec.preferredNodeAffinity[0].preference.matchFields[0]: key \"metadata.uid\""},
		{"preferences at the bound", func(s *Spec) {
			for range MaxPreferredTerms {
				s.PreferredNodeAffinity = append(s.PreferredNodeAffinity, prefer(1, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists}))
			}
		}, ""},
		{"too many preferences", func(s *Spec) {
			for range MaxPreferredTerms + 1 {
				s.PreferredNodeAffinity = append(s.PreferredNodeAffinity, prefer(1, corev1.NodeSelectorRequirement{Key: "k", Operator: corev1.NodeSelectorOpExists}))
			}
		}, "spec.preferredNodeAffinity has 17 terms: at most 16"},
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

func affinity(exprs ...corev1.NodeSelectorRequirement) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: exprs}}}
}

func prefer(weight int32, exprs ...corev1.NodeSelectorRequirement) corev1.PreferredSchedulingTerm {
	return corev1.PreferredSchedulingTerm{Weight: weight, Preference: corev1.NodeSelectorTerm{MatchExpressions: exprs}}
}

func TestNodePreference(t *testing.T) {
	labels := map[string]string{"pool": "a100", "zone": "z1", "gpus": "8"}
	zone := func(w int32, z string) corev1.PreferredSchedulingTerm {
		return prefer(w, corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{z}})
	}
	for _, tc := range []struct {
		name  string
		terms []corev1.PreferredSchedulingTerm
		node  string
		want  int
	}{
		{"no preferences", nil, "n1", 0},
		{"one term matches", []corev1.PreferredSchedulingTerm{zone(30, "z1")}, "n1", 30},
		{"one term does not", []corev1.PreferredSchedulingTerm{zone(30, "z2")}, "n1", 0},
		{"matching weights are summed", []corev1.PreferredSchedulingTerm{zone(30, "z1"), zone(20, "z2"),
			prefer(7, corev1.NodeSelectorRequirement{Key: "gpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"4"}})}, "n1", 37},
		{"a term's expressions are ANDed", []corev1.PreferredSchedulingTerm{prefer(40,
			corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}},
			corev1.NodeSelectorRequirement{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a100"}})}, "n1", 0},
		{"by name", []corev1.PreferredSchedulingTerm{{Weight: 9, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}}}, "n1", 9},
		{"by name, another node", []corev1.PreferredSchedulingTerm{{Weight: 9, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}}}, "n2", 0},
		{"the same term twice counts twice", []corev1.PreferredSchedulingTerm{zone(100, "z1"), zone(100, "z1")}, "n1", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{PreferredNodeAffinity: tc.terms}
			score, err := s.NodePreference()
			if err != nil {
				t.Fatal(err)
			}
			if got := score(labels, tc.node); got != tc.want {
				t.Fatalf("score %d, want %d", got, tc.want)
			}
			if s.Prefers() != (len(tc.terms) > 0) {
				t.Fatalf("Prefers = %v", s.Prefers())
			}
			if s.Pinned() {
				t.Fatal("a preference pins the job")
			}
		})
	}
}

func TestMatchesNode(t *testing.T) {
	labels := map[string]string{"pool": "a100", "zone": "z1", "gpus": "8"}
	for _, tc := range []struct {
		name     string
		selector map[string]string
		affinity *corev1.NodeSelector
		node     string
		want     bool
	}{
		{"no selection", nil, nil, "n1", true},
		{"one label", map[string]string{"pool": "a100"}, nil, "n1", true},
		{"one label, other value", map[string]string{"pool": "v100"}, nil, "n1", false},
		{"label missing", map[string]string{"rack": "r1"}, nil, "n1", false},
		{"several labels", map[string]string{"pool": "a100", "zone": "z1"}, nil, "n1", true},
		{"several labels, one differs", map[string]string{"pool": "a100", "zone": "z2"}, nil, "n1", false},
		{"affinity In", nil, affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z0", "z1"}}), "n1", true},
		{"affinity NotIn", nil, affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"z1"}}), "n1", false},
		{"affinity DoesNotExist", nil, affinity(corev1.NodeSelectorRequirement{Key: "spot", Operator: corev1.NodeSelectorOpDoesNotExist}), "n1", true},
		{"affinity Gt", nil, affinity(corev1.NodeSelectorRequirement{Key: "gpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"4"}}), "n1", true},
		{"affinity Lt", nil, affinity(corev1.NodeSelectorRequirement{Key: "gpus", Operator: corev1.NodeSelectorOpLt, Values: []string{"4"}}), "n1", false},
		{"affinity expressions of a term all hold", nil, affinity(
			corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpExists},
			corev1.NodeSelectorRequirement{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"v100"}}), "n1", false},
		{"affinity one term of several", nil, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"v100"}}}},
			{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}}}, "n1", true},
		{"affinity name NotIn", nil, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}}}}}}, "n1", false},
		{"selector and affinity both hold", map[string]string{"pool": "a100"}, affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}}), "n1", true},
		{"selector holds, affinity not", map[string]string{"pool": "a100"}, affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z2"}}), "n1", false},
		{"invalid selection matches nothing", map[string]string{"pool": "a100", "a b": "c"}, nil, "n1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{NodeSelector: tc.selector, RequiredNodeAffinity: tc.affinity}
			if got := s.MatchesNode(labels, tc.node); got != tc.want {
				t.Fatalf("MatchesNode = %v, want %v", got, tc.want)
			}
			if got := s.Pinned(); got != (tc.selector != nil || tc.affinity != nil) {
				t.Fatalf("Pinned = %v", got)
			}
		})
	}
}

func TestUnstructuredRoundTrip(t *testing.T) {
	now := metav1.Unix(1700000000, 0)
	j := &GorovodJob{
		ObjectMeta: metav1.ObjectMeta{Name: "mnist", Namespace: "team"},
		Spec: Spec{Image: "img", Command: []string{"train", "--epochs", "3"}, MinWorkers: 1, MaxWorkers: 4, Batch: BatchBounds{Initial: 64, Max: 1024}, Priority: 2,
			Tolerations:           []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "vision", Effect: corev1.TaintEffectNoSchedule}},
			NodeSelector:          map[string]string{"example.com/pool": "a100"},
			RequiredNodeAffinity:  affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1", "z2"}}),
			PreferredNodeAffinity: []corev1.PreferredSchedulingTerm{prefer(20, corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}})},
			ProbeTimeout:          &metav1.Duration{Duration: 2500 * time.Millisecond}},
		Status: Status{Phase: PhaseRunning, Allocation: []string{"n1", "n1", "n2"}, WorldSize: 3, SubmitTime: &now, DriverRestarts: 1,
			Adoption: &Adoption{JobID: "j1", Seeds: []string{"198.18.0.5:7946"}, Workers: []string{"198.18.0.6:40001"}, SecretName: "mnist-secret-0123456789", MinWorkers: 1,
				ProbeTimeout: &metav1.Duration{Duration: 2500 * time.Millisecond}},
			Goodput: &GoodputStatus{Model: goodput.Model{Perf: goodput.PerfParams{AlphaC: 0.01, BetaC: 1e-4, Gamma: 1.5}, Grad: goodput.GradParams{Sqr: 1, Var: 2}, InitBatch: 64}, MaxProfiledWorkers: 3, FittedAt: now,
				Profile: []goodput.ProfileEntry{{Nodes: 1, Replicas: 2, MicroBatch: 32, AccumTime: 1.5, AccumCount: 30, OptimTime: 2.25, OptimCount: 15}}}},
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
