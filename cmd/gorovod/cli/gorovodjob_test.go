package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/job"
)

// The job's hosts for an allocation: one per worker, running workers keep
// theirs, a node on hold gets no free one.
func TestSlotHosts(t *testing.T) {
	now := time.Unix(1000, 0)
	later := now.Add(time.Minute)
	for _, tc := range []struct {
		name     string
		alloc    []string
		occupied map[string]int
		held     map[string]time.Time
		want     []string
		next     time.Time
	}{
		{"first allocation", []string{"a", "b", "a"}, nil, nil, []string{"a/0", "a/1", "b/0"}, time.Time{}},
		{"grow on a node", []string{"a", "a", "a"}, map[string]int{"a/0": 0, "a/1": 1}, nil, []string{"a/0", "a/1", "a/2"}, time.Time{}},
		{"shrink keeps a running worker's host", []string{"a"}, map[string]int{"a/1": 4}, nil, []string{"a/1"}, time.Time{}},
		{"same count after a worker left keeps the others", []string{"a", "a"}, map[string]int{"a/0": 0, "a/2": 5}, nil, []string{"a/0", "a/2"}, time.Time{}},
		{"fill the gaps", []string{"a", "a", "a"}, map[string]int{"a/2": 5}, nil, []string{"a/0", "a/1", "a/2"}, time.Time{}},
		{"node taken away", []string{"b"}, map[string]int{"a/0": 0, "b/0": 1}, nil, []string{"b/0"}, time.Time{}},
		{"held node keeps only its running workers", []string{"a", "a", "b"}, map[string]int{"a/1": 3, "b/0": 1},
			map[string]time.Time{"a": later}, []string{"a/1", "b/0"}, later},
		{"a hold that ended", []string{"a", "a"}, map[string]int{"a/1": 3}, map[string]time.Time{"a": now}, []string{"a/0", "a/1"}, time.Time{}},
		{"nothing allocated", nil, map[string]int{"a/0": 0}, nil, nil, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, next := slotHosts(tc.alloc, tc.occupied, tc.held, now)
			var got []string
			for _, h := range hosts {
				if h.Slots != 1 {
					t.Errorf("host %s has %d slots", h.Name, h.Slots)
				}
				got = append(got, h.Name)
			}
			if !slices.Equal(got, tc.want) || !next.Equal(tc.next) {
				t.Fatalf("hosts %v next %v, want %v next %v", got, next, tc.want, tc.next)
			}
			for _, h := range got {
				if slotNode(h) == "" || slotIndex(h) < 0 {
					t.Errorf("host %q: node %q index %d", h, slotNode(h), slotIndex(h))
				}
			}
		})
	}
}

func TestWorkerResources(t *testing.T) {
	one := resource.MustParse("1")
	for _, tc := range []struct {
		name string
		in   corev1.ResourceRequirements
		want corev1.ResourceName
	}{
		{"none: a slot", corev1.ResourceRequirements{}, api.SlotResource},
		{"cpu only: a slot too", corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: one}}, api.SlotResource},
		{"a GPU", corev1.ResourceRequirements{Limits: corev1.ResourceList{api.GPUResource: one}}, api.GPUResource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := workerResources(tc.in)
			if q := got.Limits[tc.want]; q.Cmp(one) != 0 {
				t.Fatalf("limits %v, want one %s", got.Limits, tc.want)
			}
			other := map[corev1.ResourceName]corev1.ResourceName{api.SlotResource: api.GPUResource, api.GPUResource: api.SlotResource}[tc.want]
			if _, ok := got.Limits[other]; ok {
				t.Fatalf("limits %v ask for %s too", got.Limits, other)
			}
		})
	}
	in := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: one}}
	workerResources(in)
	if _, ok := in.Limits[api.SlotResource]; ok {
		t.Fatal("workerResources changed its argument")
	}
}

// The worker pods tolerate the taints the scheduler counts as tolerated
// (service.WorkerTolerations), once each, beside the template's own and the
// job's spec.tolerations, and a customization set before still runs.
func TestWorkerTolerations(t *testing.T) {
	spot := corev1.Toleration{Key: "example.com/spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}
	for _, tc := range []struct {
		name string
		have []corev1.Toleration
		spec []corev1.Toleration // the GorovodJob's
		want int                 // tolerations after
	}{
		{"none", nil, nil, len(service.WorkerTolerations)},
		{"the template's own kept", []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "b", Effect: corev1.TaintEffectNoSchedule}}, nil,
			len(service.WorkerTolerations) + 1},
		{"one already there", []corev1.Toleration{service.WorkerTolerations[0]}, nil, len(service.WorkerTolerations)},
		{"the job's spec.tolerations", nil, []corev1.Toleration{spot}, len(service.WorkerTolerations) + 1},
		{"the job's and the template's same", []corev1.Toleration{spot}, []corev1.Toleration{spot}, len(service.WorkerTolerations) + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			kc := kube.Config{Customize: func(*corev1.Pod) { ran = true }}
			(&gorovodJobDriver{spec: api.Spec{Tolerations: tc.spec}}).configure(&kc)
			pod := &corev1.Pod{Spec: corev1.PodSpec{Tolerations: slices.Clone(tc.have)}}
			kc.Customize(pod)
			if !ran || len(pod.Spec.Tolerations) != tc.want {
				t.Fatalf("tolerations %+v (customization ran: %v), want %d", pod.Spec.Tolerations, ran, tc.want)
			}
			for _, want := range tc.spec {
				taint := corev1.Taint{Key: want.Key, Effect: want.Effect}
				if !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(&taint) }) {
					t.Errorf("no toleration of the job's %+v", taint)
				}
			}
			for _, w := range service.WorkerTolerations {
				for _, taint := range []corev1.Taint{{Key: w.Key, Value: "present", Effect: corev1.TaintEffectNoSchedule}, {Key: w.Key, Effect: corev1.TaintEffectNoExecute}} {
					if !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(&taint) }) {
						t.Errorf("no toleration of %+v", taint)
					}
				}
			}
		})
	}
}

// TestWorkerNodeSelection: a worker pod carries the job's node selection
// on top of its template's, so that the kubelet of the node it is bound to
// admits it only where both hold.
func TestWorkerNodeSelection(t *testing.T) {
	term := func(key string, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}}}
	}
	required := func(terms ...corev1.NodeSelectorTerm) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: terms}
	}
	nodes := []map[string]string{
		{"pool": "a", "zone": "z1", "disk": "ssd"},
		{"pool": "a", "zone": "z2", "disk": "ssd"},
		{"pool": "b", "zone": "z1", "disk": "hdd"},
	}
	for _, tc := range []struct {
		name                 string
		template             *corev1.Pod
		spec                 api.Spec
		wantSelector         map[string]string
		wantNodes            []int // of nodes, where the pod's selection holds
		wantTemplateAffinity bool  // the template's other affinity kept
		wantPreferred        []corev1.PreferredSchedulingTerm
	}{
		{"none", &corev1.Pod{}, api.Spec{}, nil, []int{0, 1, 2}, false, nil},
		{"the job's selector", &corev1.Pod{}, api.Spec{NodeSelector: map[string]string{"pool": "a"}}, map[string]string{"pool": "a"}, []int{0, 1}, false, nil},
		{"several labels, added to the template's", &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: map[string]string{"disk": "ssd"}}},
			api.Spec{NodeSelector: map[string]string{"pool": "a", "zone": "z1"}}, map[string]string{"disk": "ssd", "pool": "a", "zone": "z1"}, []int{0}, false, nil},
		{"a selector no node matches", &corev1.Pod{}, api.Spec{NodeSelector: map[string]string{"pool": "c"}}, map[string]string{"pool": "c"}, nil, false, nil},
		{"the job's affinity", &corev1.Pod{}, api.Spec{RequiredNodeAffinity: required(term("zone", "z2"), term("pool", "b"))}, nil, []int{1, 2}, false, nil},
		{"the job's affinity and the template's: both hold", &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{
			NodeAffinity:    &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required(term("disk", "ssd"))},
			PodAntiAffinity: &corev1.PodAntiAffinity{}}}},
			api.Spec{RequiredNodeAffinity: required(term("zone", "z1"), term("pool", "b"))}, nil, []int{0}, true, nil},
		{"the job's preferences", &corev1.Pod{}, api.Spec{PreferredNodeAffinity: []corev1.PreferredSchedulingTerm{{Weight: 40, Preference: term("zone", "z2")}}},
			nil, []int{0, 1, 2}, false, []corev1.PreferredSchedulingTerm{{Weight: 40, Preference: term("zone", "z2")}}},
		{"preferences after the template's, with a required affinity", &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{
			NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: term("disk", "ssd")}}}}}},
			api.Spec{RequiredNodeAffinity: required(term("zone", "z1")),
				PreferredNodeAffinity: []corev1.PreferredSchedulingTerm{{Weight: 40, Preference: term("pool", "b")}, {Weight: 1, Preference: term("zone", "z1")}}},
			nil, []int{0, 2}, false,
			[]corev1.PreferredSchedulingTerm{{Weight: 5, Preference: term("disk", "ssd")}, {Weight: 40, Preference: term("pool", "b")}, {Weight: 1, Preference: term("zone", "z1")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := kube.Config{}
			(&gorovodJobDriver{spec: tc.spec}).configure(&kc)
			pod := tc.template.DeepCopy()
			kc.Customize(pod)
			if !maps.Equal(pod.Spec.NodeSelector, tc.wantSelector) {
				t.Errorf("nodeSelector %v, want %v", pod.Spec.NodeSelector, tc.wantSelector)
			}
			// The pod's selection, read as the job's would be.
			var podSelection api.Spec
			podSelection.NodeSelector = pod.Spec.NodeSelector
			if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				podSelection.RequiredNodeAffinity = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			}
			var got []int
			for i, labels := range nodes {
				if podSelection.MatchesNode(labels, fmt.Sprint("n", i)) {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, tc.wantNodes) {
				t.Errorf("the pod may run on nodes %v, want %v (affinity %+v)", got, tc.wantNodes, pod.Spec.Affinity)
			}
			if tc.wantTemplateAffinity && pod.Spec.Affinity.PodAntiAffinity == nil {
				t.Errorf("the template's pod anti-affinity was dropped")
			}
			var preferred []corev1.PreferredSchedulingTerm
			if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				preferred = a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
			}
			if !reflect.DeepEqual(preferred, tc.wantPreferred) {
				t.Errorf("preferred node affinity %+v, want %+v", preferred, tc.wantPreferred)
			}
		})
	}
}

// The Discovery hands the job every new host list, and set returns once the
// job has taken it.
func TestAllocationDiscovery(t *testing.T) {
	a := &allocationDiscovery{delivered: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.set(ctx, []job.Host{{Name: "a/0", Slots: 1}}); err != nil { // not discovering yet: no wait
		t.Fatal(err)
	}
	got := make(chan []job.Host, 8)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Discover(dctx, func(h []job.Host) { got <- h }) }()
	if h := <-got; len(h) != 1 || h[0].Name != "a/0" {
		t.Fatalf("first list %v", h)
	}
	want := []job.Host{{Name: "a/0", Slots: 1}, {Name: "b/0", Slots: 1}}
	setDone := make(chan error, 1)
	go func() { setDone <- a.set(ctx, want) }()
	if h := <-got; !reflect.DeepEqual(h, want) {
		t.Fatalf("second list %v", h)
	}
	if err := <-setDone; err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := a.set(ctx, nil); err != nil { // after the job: no wait
		t.Fatal(err)
	}
}

func TestReorderFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("f", false, "")
	fs.Int("worker", 0, "")
	fs.String("n", "", "")
	for _, tc := range []struct{ in, want string }{
		{"job -f", "-f -- job"},
		{"job --worker 2 -n ns", "--worker 2 -n ns -- job"},
		{"--worker=2 job", "--worker=2 -- job"},
		{"-n ns job.yaml -- cmd --steps 3", "-n ns -- job.yaml cmd --steps 3"},
		{"-f", "-f"},
	} {
		if got := strings.Join(reorderFlags(fs, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestAge(t *testing.T) {
	now := time.Unix(1e6, 0)
	for _, tc := range []struct {
		ago  time.Duration
		want string
	}{{5 * time.Second, "5s"}, {3 * time.Minute, "3m"}, {5 * time.Hour, "5h"}, {72 * time.Hour, "3d"}} {
		if got := age(now, now.Add(-tc.ago)); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.ago, got, tc.want)
		}
	}
	if age(now, time.Time{}) != "-" {
		t.Error("zero time")
	}
}

// --gorovodjob takes the workers, the image, the command and the probe
// timeout from the GorovodJob: the flags that would set them are refused before anything is
// asked of a cluster.
func TestGorovodJobFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gorovodjob", "j", "--np", "3"}, "drop --np"},
		{[]string{"--gorovodjob", "j", "--kubernetes", "--kubernetes-image", "img"}, "drop --kubernetes, --kubernetes-image"},
		{[]string{"--gorovodjob", "j", "--heuristic", "goodput"}, "drop --heuristic"},
		{[]string{"--gorovodjob", "j", "--probe-timeout", "3"}, "drop --probe-timeout"},
		{[]string{"--gorovodjob", "j", "--", "/bin/trainer"}, "give none"},
	} {
		var out, errb strings.Builder
		err := Main(context.Background(), append([]string{"run"}, tc.args...), Config{Stdout: &out, Stderr: &errb})
		if !errors.Is(err, ErrUsage) || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: err %v, stderr %q; want a usage error saying %q", tc.args, err, errb.String(), tc.want)
		}
	}
}
