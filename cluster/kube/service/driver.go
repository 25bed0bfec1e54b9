package service

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// The driver pod and what it runs as.
const (
	// RoleDriver is the gorovod.io/role label of a job's driver pod.
	RoleDriver = "driver"
	// DriverContainer is the driver pod's container.
	DriverContainer = "driver"
	// DriverServiceAccount is the service account the driver pod runs as,
	// and DriverClusterRole what it may do (deploy/kubernetes/gorovod.yaml).
	DriverServiceAccount = "gorovod-driver"
	DriverClusterRole    = "gorovod-driver"
	// DriverRoleBinding binds DriverClusterRole to DriverServiceAccount in
	// a job's namespace (the scheduler creates it where missing).
	DriverRoleBinding = "gorovod-driver-gorovodjobs"
	// gossipPort is the driver's gossip port (as in driver.yaml).
	gossipPort = 7946
)

// DriverPodName is the name of a job's driver pod.
func DriverPodName(job string) string { return job + "-driver" }

func defaultDriverResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("250m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}}
}

// driverPod is the driver pod of a job: owned by the job (deleting the job
// deletes it, and the driver's workers with it), run once.
func (s *Service) driverPod(j *api.GorovodJob) *corev1.Pod {
	image := j.Spec.DriverImage
	if image == "" {
		image = j.Spec.Image
	}
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	return &corev1.Pod{
		ObjectMeta: driverMeta(j, DriverPodName(j.Name)),
		Spec: corev1.PodSpec{
			ServiceAccountName: DriverServiceAccount,
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:    DriverContainer,
				Image:   image,
				Command: []string{"gorovod", "run", "--gorovodjob=" + j.Name},
				Ports:   []corev1.ContainerPort{{Name: "gossip", ContainerPort: gossipPort}},
				Env: []corev1.EnvVar{
					{Name: "GOROVOD_POD_NAME", ValueFrom: field("metadata.name")},
					{Name: "GOROVOD_POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
					{Name: "GOROVOD_POD_UID", ValueFrom: field("metadata.uid")},
					{Name: "GOROVOD_POD_IP", ValueFrom: field("status.podIP")},
				},
				Resources: s.cfg.DriverResources,
			}},
			Tolerations:  slices.Clone(j.Spec.Tolerations),
			NodeSelector: maps.Clone(j.Spec.NodeSelector),
			Affinity:     NodeAffinity(j.Spec),
		},
	}
}

// NodeAffinity is the pod affinity of a job's required and preferred node
// affinity (nil: neither), for its driver pod: the cluster's scheduler
// places the driver on the job's nodes, its preferred ones where it can.
func NodeAffinity(spec api.Spec) *corev1.Affinity {
	if spec.RequiredNodeAffinity == nil && len(spec.PreferredNodeAffinity) == 0 {
		return nil
	}
	na := &corev1.NodeAffinity{}
	if spec.RequiredNodeAffinity != nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = spec.RequiredNodeAffinity.DeepCopy()
	}
	for _, t := range spec.PreferredNodeAffinity {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, *t.DeepCopy())
	}
	return &corev1.Affinity{NodeAffinity: na}
}

// startDriver creates a job's driver pod (and, first, its namespace's
// service account and role binding). A pod of that name already owned by
// the job is fine (a scheduler that stopped before recording it).
func (s *Service) startDriver(ctx context.Context, j *api.GorovodJob) error {
	if err := s.bindDriver(ctx, j.Namespace); err != nil {
		return err
	}
	if err := s.protectDriver(ctx, j); err != nil {
		return err
	}
	pod := s.driverPod(j)
	if s.cfg.CustomizeDriver != nil {
		s.cfg.CustomizeDriver(pod)
	}
	return s.createDriverPod(ctx, j, pod)
}

// createDriverPod creates a driver pod of job j; one of that name already
// owned by the job is fine.
func (s *Service) createDriverPod(ctx context.Context, j *api.GorovodJob, pod *corev1.Pod) error {
	_, err := s.kube.CoreV1().Pods(j.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	old, err := s.kube.CoreV1().Pods(j.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, o := range old.OwnerReferences {
		if o.UID == j.UID {
			return nil
		}
	}
	return fmt.Errorf("pod %s/%s exists and is not this job's driver", j.Namespace, pod.Name)
}

// ReplacementDriverPodName is the name of a job's n-th replacement driver
// pod (n ≥ 1).
func ReplacementDriverPodName(job string, n int32) string { return fmt.Sprintf("%s-driver-%d", job, n) }

// driverKilled says whether a driver pod that ended (nil: deleted) did so
// without ending its job: killed (exit status 137, SIGKILL, or the OOM
// killer), left on SIGTERM (143: its pod was deleted; the driver leaves the
// workers to a replacement), gone, or failed without its container ending
// (its node lost). A driver that ended its job exits 0 or 1.
func driverKilled(pod *corev1.Pod) bool {
	if pod == nil {
		return true
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == DriverContainer && c.State.Terminated != nil {
			code := c.State.Terminated.ExitCode
			return code == 128+9 || code == 128+15
		}
	}
	return pod.Status.Phase == corev1.PodFailed
}

// replaceDriver starts a driver pod in place of job e's, which ended
// without ending the job (why), when the job's driver recorded how to take
// the job back (status.adoption, read fresh from the API server: the cache
// may not have the driver's last write yet) and the job has restarts left.
// The replacement gets the job secret from the job's Secret, named in the
// record, through a secretKeyRef: neither the scheduler nor the driver reads
// Secrets. It says whether it did.
func (s *Service) replaceDriver(ctx context.Context, e *entry, why string) (bool, error) {
	if s.cfg.MaxDriverRestarts < 0 || int(e.st.DriverRestarts) >= s.cfg.MaxDriverRestarts {
		return false, nil
	}
	u, err := s.dyn.Resource(api.GroupVersionResource()).Namespace(e.job.Namespace).Get(ctx, e.job.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("service: reading %s: %w", e.id, err)
	}
	j, err := api.FromUnstructured(u)
	if err != nil {
		return false, err
	}
	a := j.Status.Adoption
	if a == nil || a.Ended {
		return false, nil
	}
	if !jobSecretName(j.Name, a.SecretName) {
		// Only the job's own Secret goes into its driver pod: a record
		// naming another (another job's) is not followed.
		s.cfg.Logger.Warn("not replacing a driver: status.adoption names another Secret than the job's", "job", e.id, "secret", a.SecretName)
		return false, nil
	}
	if err := s.writable(ctx); err != nil {
		return false, err
	}
	n := e.st.DriverRestarts + 1
	pod := s.driverPod(j)
	pod.Name = ReplacementDriverPodName(j.Name, n)
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: envconfig.EnvSecret, ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: a.SecretName}, Key: envconfig.EnvSecret}}})
	if s.cfg.CustomizeDriver != nil {
		s.cfg.CustomizeDriver(pod)
	}
	if err := s.createDriverPod(ctx, j, pod); err != nil {
		s.cfg.Logger.Warn("replacing a driver", "job", e.id, "err", err)
		return false, nil
	}
	s.cfg.Logger.Info("driver replaced", "job", e.id, "ended", why, "driver", pod.Name)
	e.st.Driver, e.st.DriverRestarts = pod.Name, n
	return true, nil
}

// stopWorkers deletes the worker pods left of a job whose driver ended
// without them (it failed, or was killed with no replacement): they belong
// to the job, which has ended, and would hold their slots.
func (s *Service) stopWorkers(ctx context.Context, e *entry) error {
	if err := s.writable(ctx); err != nil {
		return err
	}
	pods := s.kube.CoreV1().Pods(e.job.Namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + e.job.Name + "," + kube.LabelRole + "=" + kube.RoleWorker})
	if err != nil {
		return fmt.Errorf("service: the worker pods of %s: %w", e.id, err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || !slices.ContainsFunc(p.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == e.job.UID }) {
			continue
		}
		if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("service: deleting worker pod %s of ended job %s: %w", p.Name, e.id, err)
		}
		s.cfg.Logger.Info("worker pod of an ended job deleted", "job", e.id, "pod", p.Name)
	}
	return nil
}

// jobSecretName says whether name has the shape of job's Secret's name,
// <job>-secret-<10 hex digits> (kube.SecretNameFor).
func jobSecretName(job, name string) bool {
	h, ok := strings.CutPrefix(name, job+"-secret-")
	if !ok || len(h) != 10 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// DriverBudgetName is the name of the PodDisruptionBudget of a job's driver
// pod.
func DriverBudgetName(job string) string { return job + "-driver" }

// driverMeta names an object of job j's driver (its pod, its budget):
// labelled as the driver's, in the job's namespace, owned by the job so that
// it goes with it.
func driverMeta(j *api.GorovodJob, name string) metav1.ObjectMeta {
	controller := true
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: j.Namespace,
		Labels:    map[string]string{kube.LabelJob: j.Name, kube.LabelRole: RoleDriver},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: api.Group + "/" + api.Version, Kind: api.Kind,
			Name: j.Name, UID: j.UID, Controller: &controller}},
	}
}

// driverBudget is the PodDisruptionBudget that keeps a job's running driver
// pod from being evicted (kubectl drain, the cluster autoscaler): the
// driver's end ends the job, so no voluntary disruption of it is allowed.
// minAvailable 1 of the one pod, rather than maxUnavailable 0, because the
// disruption controller counts the expected pods of maxUnavailable through
// the owner's scale subresource, which a GorovodJob has not. Owned by the
// job, it goes with it.
func driverBudget(j *api.GorovodJob) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: driverMeta(j, DriverBudgetName(j.Name)),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &one,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{kube.LabelJob: j.Name, kube.LabelRole: RoleDriver}},
		},
	}
}

// protectDriver creates the job's driver budget before its pod, so that no
// moment of the pod's life goes unprotected. One of that name already owned
// by the job is fine.
func (s *Service) protectDriver(ctx context.Context, j *api.GorovodJob) error {
	b := driverBudget(j)
	_, err := s.kube.PolicyV1().PodDisruptionBudgets(j.Namespace).Create(ctx, b, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("the driver's disruption budget: %w", err)
		}
		return nil
	}
	old, err := s.kube.PolicyV1().PodDisruptionBudgets(j.Namespace).Get(ctx, b.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the driver's disruption budget: %w", err)
	}
	for _, o := range old.OwnerReferences {
		if o.UID == j.UID {
			return nil
		}
	}
	return fmt.Errorf("poddisruptionbudget %s/%s exists and is not this job's", j.Namespace, b.Name)
}

// bindDriver makes sure a namespace has the driver's ServiceAccount and its
// RoleBinding to the driver's ClusterRole, once per namespace and term.
func (s *Service) bindDriver(ctx context.Context, ns string) error {
	if s.boundNamespaces[ns] {
		return nil
	}
	_, err := s.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: DriverServiceAccount, Namespace: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the driver's service account in %s: %w", ns, err)
	}
	_, err = s.kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: DriverRoleBinding, Namespace: ns},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: DriverServiceAccount, Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: DriverClusterRole},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the driver's role binding in %s: %w", ns, err)
	}
	s.boundNamespaces[ns] = true
	return nil
}

// driverEnd says how an ended driver pod ended ("" while it runs).
func driverEnd(pod *corev1.Pod) (api.Phase, string) {
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return api.PhaseSucceeded, ""
	case corev1.PodFailed:
	default:
		return "", ""
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name != DriverContainer || c.State.Terminated == nil {
			continue
		}
		t := c.State.Terminated
		var why []string
		for _, w := range []string{t.Reason, strings.TrimSpace(t.Message)} {
			if w != "" {
				why = append(why, w)
			}
		}
		msg := fmt.Sprintf("driver pod %s exited with status %d", pod.Name, t.ExitCode)
		if len(why) > 0 {
			msg += ": " + strings.Join(why, ": ")
		}
		return api.PhaseFailed, msg
	}
	msg := fmt.Sprintf("driver pod %s failed", pod.Name)
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		msg += ": " + strings.TrimSpace(pod.Status.Reason+" "+pod.Status.Message)
	}
	return api.PhaseFailed, msg
}
