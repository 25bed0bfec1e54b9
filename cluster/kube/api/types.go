package api

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// The resource's names.
const (
	Group    = "gorovod.io"
	Version  = "v1alpha1"
	Kind     = "GorovodJob"
	ListKind = "GorovodJobList"
	Resource = "gorovodjobs"
	Singular = "gorovodjob"
	// ShortName is what `kubectl get gj` takes.
	ShortName = "gj"
)

// GroupVersionResource is the resource for the dynamic client.
func GroupVersionResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}
}

// GroupVersionKind is the kind of a GorovodJob.
func GroupVersionKind() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: Group, Version: Version, Kind: Kind}
}

// Phase is where a job is in its life.
type Phase string

// The phases, in order. A job is Pending until the scheduler first gives it
// workers (at least MinWorkers), Running while its driver runs, and ends
// Succeeded (its trainer finished) or Failed (see Status.Message).
const (
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// Ended reports whether the phase is final.
func (p Phase) Ended() bool { return p == PhaseSucceeded || p == PhaseFailed }

// GorovodJob is one elastic training job on the cluster.
type GorovodJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   Spec   `json:"spec"`
	Status Status `json:"status,omitempty"`
}

// GorovodJobList is a list of jobs.
type GorovodJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []GorovodJob `json:"items"`
}

// Spec is what the job's user asks for.
type Spec struct {
	// Image is the container image of the job's workers (and, unless
	// DriverImage is set, of its driver: it must hold the gorovod command).
	Image string `json:"image"`
	// DriverImage is the image of the job's driver pod, when the workers'
	// image lacks the gorovod command.
	DriverImage string `json:"driverImage,omitempty"`
	// Command is the trainer each worker runs.
	Command []string `json:"command"`
	// Env is added to every worker's environment.
	Env []corev1.EnvVar `json:"env,omitempty"`
	// MinWorkers is the fewest workers the job trains with (≥ 1): the
	// scheduler gives it at least that many or none.
	MinWorkers int32 `json:"minWorkers"`
	// MaxWorkers bounds the job's size (0: only by the cluster).
	MaxWorkers int32 `json:"maxWorkers,omitempty"`
	// Batch bounds the global batch size the job may be run at.
	Batch BatchBounds `json:"batch,omitempty"`
	// Priority orders jobs that cannot all be admitted: higher first, then
	// the earlier submitted.
	Priority int32 `json:"priority,omitempty"`
	// Resources are each worker's container resources. A job that names
	// nvidia.com/gpu here runs on GPU nodes only; any other on nodes
	// without GPUs only, each worker asking for one gorovod.io/slot (see
	// docs/clusters.md).
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// Tolerations are added to the job's worker pods and its driver pod
	// (the workers also carry the tolerations of the GPU and slot nodes'
	// taints, service.WorkerTolerations). The scheduler allocates workers
	// only on nodes whose NoSchedule and NoExecute taints those default
	// tolerations cover, so a job's own tolerations keep its pods on a node
	// that gets another taint while they run (a NoExecute taint's eviction),
	// and let the driver pod onto tainted nodes.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// NodeSelector keeps the job on the nodes that carry every one of
	// these labels (a pod's nodeSelector). RequiredNodeAffinity, when
	// set, keeps it further on the nodes that match one of its terms (a
	// pod's affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution).
	// The scheduler allocates the job's workers only on such nodes
	// (Spec.MatchesNode), and the worker pods and the driver pod carry
	// both, so that the kubelet and the cluster's scheduler hold them to
	// it too.
	NodeSelector         map[string]string    `json:"nodeSelector,omitempty"`
	RequiredNodeAffinity *corev1.NodeSelector `json:"requiredNodeAffinity,omitempty"`
	// PreferredNodeAffinity are weighted node preferences (a pod's
	// affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution):
	// a node's score is the sum of the weights (1 to 100) of the terms it
	// matches (Spec.NodePreference). The scheduler places the job's
	// workers on the nodes it may use in order of their score, where the
	// policy leaves the choice of node open; a preference never makes a
	// node usable or unusable, nor changes how many workers the job gets.
	// At most MaxPreferredTerms terms.
	PreferredNodeAffinity []corev1.PreferredSchedulingTerm `json:"preferredNodeAffinity,omitempty"`
	// MaxWorkersPerNode, when above 0, is the most workers of the job
	// the scheduler places on one node (0 to MaxWorkersPerNodeLimit; 0:
	// no limit beyond the node's slots): a job spreads its workers over
	// at least MinWorkers/MaxWorkersPerNode nodes, for their network
	// bandwidth or to lose fewer workers with a node. A job whose
	// MinWorkers its nodes cannot hold so waits, its message saying so.
	MaxWorkersPerNode int32 `json:"maxWorkersPerNode,omitempty"`
	// ProbeTimeout is how long a worker blamed for a failed collective has
	// to answer the liveness probe of the job's driver, or of the worker
	// that proposes in its place while no driver runs, before it is left
	// out of the next world (gorovod run --probe-timeout): a Go duration
	// such as "3s", above zero and at most MaxProbeTimeout. The driver pod
	// uses it and every worker gets it (GOROVOD_PROBE_TIMEOUT). Unset: the
	// driver's default, 500ms.
	ProbeTimeout *metav1.Duration `json:"probeTimeout,omitempty"`
}

// MaxProbeTimeout bounds Spec.ProbeTimeout: a frozen worker holds the next
// world that long.
const MaxProbeTimeout = 10 * time.Minute

// MaxPreferredTerms bounds Spec.PreferredNodeAffinity: every node is scored
// against every term each scheduling round.
const MaxPreferredTerms = 16

// MaxWorkersPerNodeLimit bounds Spec.MaxWorkersPerNode: the scheduler gives a
// node at most 255 slots, so a larger cap would be no cap.
const MaxWorkersPerNodeLimit = 255

// BatchBounds bound a job's global batch size. Zero values mean no bound;
// Initial 0 means the trainer's own.
type BatchBounds struct {
	Initial int32 `json:"initial,omitempty"`
	Min     int32 `json:"min,omitempty"`
	Max     int32 `json:"max,omitempty"`
}

// Status is what the scheduler and the job's driver say of the job.
type Status struct {
	// Written by the scheduler.
	Phase   Phase  `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	// Allocation is the node of each worker the scheduler gave the job,
	// one entry per worker (a node named twice holds two of its workers).
	Allocation []string `json:"allocation,omitempty"`
	// Reallocations counts the changes to Allocation after the first.
	Reallocations int32 `json:"reallocations,omitempty"`
	// Driver is the name of the job's driver pod.
	Driver         string       `json:"driver,omitempty"`
	SubmitTime     *metav1.Time `json:"submitTime,omitempty"`
	StartTime      *metav1.Time `json:"startTime,omitempty"`
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ObservedGeneration is the spec generation the scheduler last acted on.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ScheduledBy is the identity of the scheduler replica (the leader)
	// that wrote these fields last.
	ScheduledBy string `json:"scheduledBy,omitempty"`
	// AllocationTime is when Allocation last changed, and
	// AttainedWorkerSeconds the workers × seconds the job held before it:
	// the service time that Tiresias and Pollux's priorities need, kept
	// here so that a new scheduler continues from it.
	AllocationTime        *metav1.Time `json:"allocationTime,omitempty"`
	AttainedWorkerSeconds int64        `json:"attainedWorkerSeconds,omitempty"`

	// DriverRestarts counts the driver pods the scheduler started in place
	// of one that was killed or deleted while the job ran (each takes the
	// running job back from Adoption).
	DriverRestarts int32 `json:"driverRestarts,omitempty"`

	// Written by the job's driver.
	WorldSize int32 `json:"worldSize,omitempty"`
	// Step is the last training step the driver saw.
	Step int64 `json:"step,omitempty"`
	// Goodput is the job's goodput model as the driver last fitted it;
	// nil until it has measured the job.
	Goodput *GoodputStatus `json:"goodput,omitempty"`
	// Adoption is what a replacement driver pod needs to take the running
	// job back; the driver writes it once its first workers run, and sets
	// Ended when the job is over (a driver pod that ends then is not
	// replaced).
	Adoption *Adoption `json:"adoption,omitempty"`
}

// Adoption is the job's record for a replacement driver (status.adoption).
// It holds no secret: the job secret stays in the Secret SecretName, which a
// replacement driver pod gets through its environment (a secretKeyRef the
// scheduler sets) and checks against the name, a hash of its contents that
// only a holder of the secret can compute.
type Adoption struct {
	// JobID is the elastic job's id (the workers' GOROVOD_JOB_ID).
	JobID string `json:"jobID"`
	// Seeds are the workers' gossip seeds: the gossip address of the
	// driver that took the job last, which a replacement binds when it can
	// (the same IP) and gives the workers it starts.
	Seeds []string `json:"seeds"`
	// Workers are the gossip addresses of the job's workers as its driver
	// last saw them: a replacement that cannot bind the seed (a pod with
	// another IP) contacts them itself.
	Workers []string `json:"workers,omitempty"`
	// SecretName is the job's Secret (key GOROVOD_SECRET).
	SecretName string `json:"secretName"`
	// MinWorkers is the job's floor, as its workers were given it.
	MinWorkers int32 `json:"minWorkers"`
	// ProbeTimeout is the job's probe timeout, as its workers were given
	// it (GOROVOD_PROBE_TIMEOUT); nil: they were given none.
	ProbeTimeout *metav1.Duration `json:"probeTimeout,omitempty"`
	// Ended: the job is over; its driver's end is the job's.
	Ended bool `json:"ended,omitempty"`
}

// GoodputStatus is a job's fitted goodput model (package heuristics/goodput),
// as the scheduler reads it for Pollux.
type GoodputStatus struct {
	Model goodput.Model `json:"model"`
	// MaxProfiledWorkers is the largest world size the job was measured at.
	MaxProfiledWorkers int32 `json:"maxProfiledWorkers"`
	// WorkersPerNode is the packing the model was fitted for.
	WorkersPerNode int32 `json:"workersPerNode,omitempty"`
	// FittedAt is when the model was fitted.
	FittedAt metav1.Time `json:"fittedAt"`
	// Profile is what the model was fitted to: each configuration measured,
	// with its sums (at most MaxGoodputProfile, those of the most steps). A
	// driver that replaces the job's driver fits to it with what it measures
	// itself, so the scheduler does not see the job as new.
	Profile []goodput.ProfileEntry `json:"profile,omitempty"`
}

// MaxGoodputProfile is the most configurations status.goodput.profile holds.
const MaxGoodputProfile = 32

// Validate checks a spec as submitted.
func (s Spec) Validate() error {
	switch {
	case s.Image == "":
		return fmt.Errorf("gorovodjob: spec.image is empty")
	case len(s.Command) == 0:
		return fmt.Errorf("gorovodjob: spec.command is empty")
	case s.MinWorkers < 1:
		return fmt.Errorf("gorovodjob: spec.minWorkers must be ≥ 1, got %d", s.MinWorkers)
	case s.MaxWorkers != 0 && s.MaxWorkers < s.MinWorkers:
		return fmt.Errorf("gorovodjob: spec.maxWorkers %d is below spec.minWorkers %d", s.MaxWorkers, s.MinWorkers)
	case s.Batch.Min < 0 || s.Batch.Max < 0 || s.Batch.Initial < 0:
		return fmt.Errorf("gorovodjob: spec.batch bounds must be ≥ 0")
	case s.Batch.Max != 0 && s.Batch.Min > s.Batch.Max:
		return fmt.Errorf("gorovodjob: spec.batch.min %d is above spec.batch.max %d", s.Batch.Min, s.Batch.Max)
	case s.ProbeTimeout != nil && (s.ProbeTimeout.Duration <= 0 || s.ProbeTimeout.Duration > MaxProbeTimeout):
		return fmt.Errorf("gorovodjob: spec.probeTimeout %v must be above 0 and at most %v", s.ProbeTimeout.Duration, MaxProbeTimeout)
	case s.MaxWorkersPerNode < 0 || s.MaxWorkersPerNode > MaxWorkersPerNodeLimit:
		return fmt.Errorf("gorovodjob: spec.maxWorkersPerNode must be 0 to %d, got %d", MaxWorkersPerNodeLimit, s.MaxWorkersPerNode)
	}
	for i, t := range s.Tolerations {
		if err := validToleration(t); err != nil {
			return fmt.Errorf("gorovodjob: spec.tolerations[%d]: %w", i, err)
		}
	}
	if _, err := s.NodeMatcher(); err != nil {
		return err
	}
	if _, err := s.NodePreference(); err != nil {
		return err
	}
	return nil
}

// validToleration checks a toleration as the API server checks a pod's:
// a qualified key (empty only with operator Exists, tolerating every
// taint), operator Equal or Exists (no value with Exists), a known effect,
// tolerationSeconds only with NoExecute.
func validToleration(t corev1.Toleration) error {
	if t.Key != "" {
		if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
			return fmt.Errorf("key %q: %s", t.Key, strings.Join(errs, "; "))
		}
	}
	switch t.Operator {
	case corev1.TolerationOpEqual, "":
		if t.Key == "" {
			return fmt.Errorf("an empty key needs operator Exists")
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			return fmt.Errorf("value %q: %s", t.Value, strings.Join(errs, "; "))
		}
	case corev1.TolerationOpExists:
		if t.Value != "" {
			return fmt.Errorf("operator Exists takes no value (got %q)", t.Value)
		}
	default:
		return fmt.Errorf("operator %q: want Equal or Exists", t.Operator)
	}
	switch t.Effect {
	case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return fmt.Errorf("effect %q: want NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
	}
	if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
		return fmt.Errorf("tolerationSeconds needs effect NoExecute")
	}
	return nil
}

// The resources that give a node its worker slots: GPUResource on GPU
// nodes, SlotResource on nodes without GPUs that advertise it.
const (
	// GPUResource is the NVIDIA device plugin's resource.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// SlotResource is the extended resource an operator advertises on a
	// node without GPUs (a node status patch, or a device plugin).
	SlotResource corev1.ResourceName = "gorovod.io/slot"
)

// WantsGPUs says whether the job's workers ask for GPUs (Resources names
// nvidia.com/gpu above 0): such a job runs on GPU nodes only, and any
// other job on nodes without GPUs only.
func (s Spec) WantsGPUs() bool {
	for _, list := range []corev1.ResourceList{s.Resources.Limits, s.Resources.Requests} {
		if q, ok := list[GPUResource]; ok && q.Sign() > 0 {
			return true
		}
	}
	return false
}

// Pinned says whether the spec keeps the job on some nodes only.
func (s Spec) Pinned() bool { return len(s.NodeSelector) > 0 || s.RequiredNodeAffinity != nil }

// MatchesNode says whether the job's workers may run on a node of these
// labels and this name: it has every label of NodeSelector, and matches a
// term of RequiredNodeAffinity where that is set (a term matches when all
// its expressions and fields do; a field is metadata.name). False for a
// spec that fails Validate.
func (s Spec) MatchesNode(labelSet map[string]string, name string) bool {
	m, err := s.NodeMatcher()
	return err == nil && m(labelSet, name)
}

// NodeMatcher is MatchesNode compiled once, for many nodes. It checks
// NodeSelector and RequiredNodeAffinity as the API server checks a pod's:
// qualified label keys, label values, the operators In and NotIn with
// values, Exists and DoesNotExist without, Gt and Lt with one integer; at
// least one term, none empty; fields only metadata.name, with In or NotIn.
func (s Spec) NodeMatcher() (func(labelSet map[string]string, name string) bool, error) {
	keys := slices.Sorted(maps.Keys(s.NodeSelector))
	selector := labels.NewSelector()
	for _, k := range keys {
		v := s.NodeSelector[k]
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("gorovodjob: spec.nodeSelector: key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("gorovodjob: spec.nodeSelector[%s]: value %q: %s", k, v, strings.Join(errs, "; "))
		}
		r, err := labels.NewRequirement(k, selection.Equals, []string{v})
		if err != nil {
			return nil, fmt.Errorf("gorovodjob: spec.nodeSelector[%s]: %w", k, err)
		}
		selector = selector.Add(*r)
	}
	type term struct {
		byLabel labels.Selector
		byName  func(string) bool
	}
	var terms []term
	if a := s.RequiredNodeAffinity; a != nil {
		if len(a.NodeSelectorTerms) == 0 {
			return nil, fmt.Errorf("gorovodjob: spec.requiredNodeAffinity.nodeSelectorTerms is empty (it would match no node)")
		}
		for i, t := range a.NodeSelectorTerms {
			where := fmt.Sprintf("spec.requiredNodeAffinity.nodeSelectorTerms[%d]", i)
			if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
				return nil, fmt.Errorf("gorovodjob: %s is empty (it would match no node)", where)
			}
			byLabel, err := labelRequirements(t.MatchExpressions, where+".matchExpressions")
			if err != nil {
				return nil, err
			}
			byName, err := nameRequirements(t.MatchFields, where+".matchFields")
			if err != nil {
				return nil, err
			}
			terms = append(terms, term{byLabel, byName})
		}
	}
	return func(labelSet map[string]string, name string) bool {
		if !selector.Matches(labels.Set(labelSet)) {
			return false
		}
		if terms == nil {
			return true
		}
		return slices.ContainsFunc(terms, func(t term) bool {
			return t.byLabel.Matches(labels.Set(labelSet)) && t.byName(name)
		})
	}, nil
}

// Prefers says whether the spec has node preferences.
func (s Spec) Prefers() bool { return len(s.PreferredNodeAffinity) > 0 }

// NodePreference compiles PreferredNodeAffinity: the score of a node of
// these labels and this name is the sum of the weights of the terms it
// matches (a term matches when all its matchExpressions and matchFields
// do), 0 without preferences. It checks the terms as the API server checks
// a pod's (weights 1 to 100; expressions and fields as in NodeMatcher), and
// further refuses an empty term (a no-op in Kubernetes) and
// more than MaxPreferredTerms terms.
func (s Spec) NodePreference() (func(labelSet map[string]string, name string) int, error) {
	const where = "spec.preferredNodeAffinity"
	if n := len(s.PreferredNodeAffinity); n > MaxPreferredTerms {
		return nil, fmt.Errorf("gorovodjob: %s has %d terms: at most %d", where, n, MaxPreferredTerms)
	}
	type term struct {
		weight  int
		byLabel labels.Selector
		byName  func(string) bool
	}
	terms := make([]term, 0, len(s.PreferredNodeAffinity))
	for i, t := range s.PreferredNodeAffinity {
		at := fmt.Sprintf("%s[%d]", where, i)
		if t.Weight < 1 || t.Weight > 100 {
			return nil, fmt.Errorf("gorovodjob: %s.weight %d: want 1 to 100", at, t.Weight)
		}
		if len(t.Preference.MatchExpressions) == 0 && len(t.Preference.MatchFields) == 0 {
			return nil, fmt.Errorf("gorovodjob: %s.preference is empty (it would prefer no node)", at)
		}
		byLabel, err := labelRequirements(t.Preference.MatchExpressions, at+".preference.matchExpressions")
		if err != nil {
			return nil, err
		}
		byName, err := nameRequirements(t.Preference.MatchFields, at+".preference.matchFields")
		if err != nil {
			return nil, err
		}
		terms = append(terms, term{int(t.Weight), byLabel, byName})
	}
	return func(labelSet map[string]string, name string) int {
		score := 0
		for _, t := range terms {
			if t.byLabel.Matches(labels.Set(labelSet)) && t.byName(name) {
				score += t.weight
			}
		}
		return score
	}, nil
}

// labelRequirements compiles a term's matchExpressions.
func labelRequirements(exprs []corev1.NodeSelectorRequirement, where string) (labels.Selector, error) {
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
		corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
	}
	selector := labels.NewSelector()
	for i, e := range exprs {
		op, ok := ops[e.Operator]
		if !ok {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: operator %q: want In, NotIn, Exists, DoesNotExist, Gt or Lt", where, i, e.Operator)
		}
		r, err := labels.NewRequirement(e.Key, op, e.Values)
		if err != nil {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: %w", where, i, err)
		}
		selector = selector.Add(*r)
	}
	return selector, nil
}

// nameRequirements compiles a term's matchFields: the one field a node
// selector term may match is the node's name (metadata.name), with In or
// NotIn and one value, as the API server allows.
func nameRequirements(exprs []corev1.NodeSelectorRequirement, where string) (func(string) bool, error) {
	type want struct {
		in   bool
		name string
	}
	var wants []want
	for i, e := range exprs {
		if e.Key != "metadata.name" {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: key %q: the only field is metadata.name", where, i, e.Key)
		}
		if e.Operator != corev1.NodeSelectorOpIn && e.Operator != corev1.NodeSelectorOpNotIn {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: operator %q: want In or NotIn", where, i, e.Operator)
		}
		if len(e.Values) != 1 {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: metadata.name takes one value (got %d)", where, i, len(e.Values))
		}
		if errs := validation.IsDNS1123Subdomain(e.Values[0]); len(errs) > 0 {
			return nil, fmt.Errorf("gorovodjob: %s[%d]: node name %q: %s", where, i, e.Values[0], strings.Join(errs, "; "))
		}
		wants = append(wants, want{e.Operator == corev1.NodeSelectorOpIn, e.Values[0]})
	}
	return func(name string) bool {
		for _, w := range wants {
			if (name == w.name) != w.in {
				return false
			}
		}
		return true
	}, nil
}

// FromUnstructured converts an object of the dynamic client.
func FromUnstructured(u *unstructured.Unstructured) (*GorovodJob, error) {
	var j GorovodJob
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &j); err != nil {
		return nil, fmt.Errorf("gorovodjob %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &j, nil
}

// ToUnstructured converts a job for the dynamic client, with its kind set.
func ToUnstructured(j *GorovodJob) (*unstructured.Unstructured, error) {
	c := *j
	c.TypeMeta = metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
	if err != nil {
		return nil, fmt.Errorf("gorovodjob %s/%s: %w", j.Namespace, j.Name, err)
	}
	return &unstructured.Unstructured{Object: obj}, nil
}
