package service

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"

	"github.com/gorovod/gorovod/cluster/kube"
)

// TestPodChangesThatCallForRounds checks which changes of the pods bound to
// nodes call for a round: those of pods not the scheduled jobs' that change
// what they take of a node.
func TestPodChangesThatCallForRounds(t *testing.T) {
	q := resource.MustParse
	pod := func(ns, job, node string, req corev1.ResourceList) *corev1.Pod {
		p := otherPod(ns, "p", node, req, false)
		if job != "" {
			p.Labels = map[string]string{kube.LabelJob: job}
		}
		return p
	}
	slot := corev1.ResourceList{SlotResource: q("1")}
	for _, tc := range []struct {
		name       string
		namespaces []string
		obj        any
		jobs       bool
	}{
		{"another's pod", nil, pod("db", "", "n1", slot), false},
		{"a job's pod, all namespaces", nil, pod("ml", "mnist", "n1", slot), true},
		{"a job's pod, its namespace scheduled", []string{"ml"}, pod("ml", "mnist", "n1", slot), true},
		{"a job's pod of a namespace not scheduled", []string{"team"}, pod("ml", "mnist", "n1", slot), false},
		{"a job's pod's tombstone", nil, cache.DeletedFinalStateUnknown{Key: "ml/p", Obj: pod("ml", "mnist", "n1", slot)}, true},
		{"another's pod's tombstone", nil, cache.DeletedFinalStateUnknown{Key: "db/p", Obj: pod("db", "", "n1", slot)}, false},
		{"not a pod", nil, "x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{cfg: Config{Namespaces: tc.namespaces}}
			if got := s.jobsPod(tc.obj); got != tc.jobs {
				t.Fatalf("jobsPod = %v, want %v", got, tc.jobs)
			}
		})
	}
	for _, tc := range []struct {
		name string
		a, b *corev1.Pod
		same bool
	}{
		{"unchanged", pod("db", "", "n1", slot), pod("db", "", "n1", slot), true},
		{"memory only", pod("db", "", "n1", corev1.ResourceList{corev1.ResourceMemory: q("1Gi")}),
			pod("db", "", "n1", corev1.ResourceList{corev1.ResourceMemory: q("2Gi")}), true},
		{"another node", pod("db", "", "n1", slot), pod("db", "", "n2", slot), false},
		{"more slots", pod("db", "", "n1", slot), pod("db", "", "n1", corev1.ResourceList{SlotResource: q("2")}), false},
		{"CPU resized", pod("db", "", "n1", corev1.ResourceList{corev1.ResourceCPU: q("1")}),
			pod("db", "", "n1", corev1.ResourceList{corev1.ResourceCPU: q("1500m")}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameSlotRequests(tc.a, tc.b); got != tc.same {
				t.Fatalf("sameSlotRequests = %v, want %v", got, tc.same)
			}
		})
	}
}

func TestRoundPacingConfig(t *testing.T) {
	for _, tc := range []struct {
		name             string
		delay, gap       time.Duration
		wantDelay, wantG time.Duration
	}{
		{"defaults", 0, 0, time.Second, 2 * time.Second},
		{"set", 300 * time.Millisecond, 5 * time.Second, 300 * time.Millisecond, 5 * time.Second},
		{"none", -1, -1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Config{EventDelay: tc.delay, MinRoundGap: tc.gap}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if c.EventDelay != tc.wantDelay || c.MinRoundGap != tc.wantG {
				t.Fatalf("EventDelay %v, MinRoundGap %v; want %v, %v", c.EventDelay, c.MinRoundGap, tc.wantDelay, tc.wantG)
			}
		})
	}
}
