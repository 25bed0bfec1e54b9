package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// Labels on everything a job creates.
const (
	LabelJob   = "gorovod.io/job"   // the job's name
	LabelRole  = "gorovod.io/role"  // "worker" on worker pods
	LabelIndex = "gorovod.io/index" // a worker's number, in creation order
	RoleWorker = "worker"
	// AnnotationHost is the job's host of a worker pod a Launcher made
	// (job.LaunchRequest.Host), for a driver that takes the job back.
	AnnotationHost = "gorovod.io/host"
	// ContainerName is the worker pod's one container.
	ContainerName = "trainer"
)

// Config configures a Provisioner. A zero field means its default.
type Config struct {
	// Client talks to the API server (in a pod: kubernetes.NewForConfig of
	// rest.InClusterConfig()).
	Client kubernetes.Interface
	// Namespace holds the job. Default: the driver's pod's namespace
	// (GOROVOD_POD_NAMESPACE), else "default".
	Namespace string
	// Job names the job: a DNS label (lower case, digits, '-'; at most 40
	// characters, so that pod names stay under 63).
	Job string
	// Image and Command are the worker container's.
	Image   string
	Command []string
	// Env is added to every worker's environment: the job id and the gossip
	// seeds (envconfig.ElasticWorker.Environ without the secret), and
	// whatever the trainer needs.
	Env []corev1.EnvVar
	// SecretEnv are variables whose values go into the job's Secret, not into
	// the pod spec: GOROVOD_SECRET (the hex job secret) at least.
	SecretEnv map[string]string
	// Owner is what the job's objects belong to (the driver's pod): deleting
	// it deletes them. Nil: no owner (Close must clean up).
	Owner *metav1.OwnerReference
	// Resources, ServiceAccountName (default: the namespace's default; its
	// token is not mounted: workers do not call the API) and Customize (a
	// last edit of each worker pod: node selectors, tolerations, volumes).
	Resources          corev1.ResourceRequirements
	ServiceAccountName string
	Customize          func(*corev1.Pod)
	// NodeName, if set, binds each launch's pod to a node (spec.nodeName:
	// no scheduler places it): the node NodeName returns for the launch's
	// host (job.LaunchRequest.Host; "" leaves the pod to the cluster's
	// scheduler). For an allocator that places a job's workers itself, such
	// as the gorovod scheduler service (a GorovodJob's status.allocation).
	NodeName func(host string) string
	// Template, if set, is what every worker pod starts from (node
	// selectors, tolerations, volumes, resources, host networking, extra
	// environment): the provisioner sets its own fields on a copy (name,
	// labels added to the template's, owner, restart policy, host name,
	// grace period, the trainer container's command and the job's
	// environment). The trainer container is the template's container named
	// ContainerName, else its first; an environment variable the template's
	// trainer container sets wins over the provisioner's defaults
	// (GOROVOD_LISTEN_ADDR, say), never over the job's secret.
	Template *corev1.Pod
	// Grace is the workers' notice: a removed worker's time to exit by
	// itself before its pod is deleted, and the pods'
	// terminationGracePeriodSeconds (SIGTERM to SIGKILL). Default 25 s.
	Grace time.Duration
	// PendingTimeout: a pod not running this long after its creation is
	// deleted and reported as given up. Default 5 minutes.
	PendingTimeout time.Duration
	// OnEvent receives what happens to the job's pods, on the watch's
	// goroutine (it must not block).
	OnEvent func(Event)
	// Logf receives what the provisioner does (nil: nothing).
	Logf func(format string, args ...any)
}

// DefaultConfig returns the defaults: a 25 s notice, 5 minutes to start.
func DefaultConfig() Config {
	return Config{Grace: 25 * time.Second, PendingTimeout: 5 * time.Minute}
}

// EventKind says what happened to a worker pod.
type EventKind string

// Event kinds, each reported at most once per pod.
const (
	PodCreated EventKind = "created" // scale-up: the pod exists
	PodRunning EventKind = "running" // its container started
	PodEnded   EventKind = "ended"   // its container exited (Preempted: by SIGTERM or a disruption)
	PodDeleted EventKind = "deleted" // scale-down: the pod is gone from the API
	PodGaveUp  EventKind = "gave-up" // not running after PendingTimeout; deleted
	// PodRejected: the node did not admit the pod for want of a resource
	// (the kubelet's OutOf<resource>, or UnexpectedAdmissionError from a
	// device plugin) — another pod, terminating, still holds it. The
	// provisioner deletes the pod and makes it again, under the same name,
	// until the node admits it or PendingTimeout runs out; the worker has
	// not ended. Reported once per rejection.
	PodRejected EventKind = "rejected"
)

// Event is a change of a worker pod.
type Event struct {
	Kind      EventKind
	Pod       string
	Index     int
	Phase     corev1.PodPhase
	ExitCode  int32 // PodEnded
	Preempted bool  // PodEnded, PodDeleted: ended by SIGTERM (exit 143), a disruption, or deleted by someone else
	Reason    string
	Time      time.Time
}

// Worker is what the provisioner knows of a worker pod.
type Worker struct {
	Pod       string
	Index     int
	Host      string // its job host (AnnotationHost), when a Launcher made it
	Phase     corev1.PodPhase
	Running   bool // its container has started (now or before)
	Ended     bool
	Deleted   bool // gone from the API
	Preempted bool
	// Exited says the trainer container ended with ExitCode (rather than
	// the pod going without it: deleted, evicted, given up).
	Exited   bool
	ExitCode int32
	GaveUp   bool // not running PendingTimeout after its creation
}

type podState struct {
	Worker
	reported map[EventKind]bool
	byUs     bool // we asked for its deletion
	pending  *time.Timer
	ended    chan struct{} // closed once it ended or was deleted
	gone     chan struct{} // closed once it is deleted

	// Made again after a rejection (PodRejected).
	spec       *corev1.Pod // the pod as created; nil for a pod adopted from an earlier driver
	rejections int
	// oldGone, while a rejected incarnation is still there: closed (and
	// nil) once the watch saw it deleted. The watch delivers one name's
	// events in order, so every event until then is of that incarnation,
	// and every later one of the pod made again.
	oldGone chan struct{}
}

// Provisioner starts and stops worker pods; it implements
// heuristics.Provisioner.
type Provisioner struct {
	cfg     Config
	pods    corev1Pods
	stopInf chan struct{}
	logf    func(format string, args ...any)

	mu      sync.Mutex
	byName  map[string]*podState
	next    int
	shared  bool // the Secret and Service exist
	closed  bool
	stopped bool
	// detached: the pods are left to a driver that takes the job back;
	// nothing is deleted any more (Detach).
	detached bool
}

// corev1Pods is the pod API of the namespace.
type corev1Pods = interface {
	Create(ctx context.Context, pod *corev1.Pod, opts metav1.CreateOptions) (*corev1.Pod, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

var _ heuristics.Provisioner = (*Provisioner)(nil)

// New checks cfg, starts watching the job's pods (workers of an earlier
// driver of the same job are adopted) and returns once the watch has synced.
func New(ctx context.Context, cfg Config) (*Provisioner, error) {
	def := DefaultConfig()
	if cfg.Client == nil {
		return nil, errors.New("kube: no client")
	}
	if errs := validation.IsDNS1123Label(cfg.Job); len(errs) > 0 || len(cfg.Job) > 40 {
		return nil, fmt.Errorf("kube: job name %q: want a DNS label of at most 40 characters %v", cfg.Job, errs)
	}
	if cfg.Image == "" && (cfg.Template == nil || trainerContainer(cfg.Template) == nil || trainerContainer(cfg.Template).Image == "") {
		return nil, errors.New("kube: no worker image")
	}
	if cfg.Namespace == "" {
		if pod, ok, err := envconfig.LoadKubernetesPod(os.Getenv); err == nil && ok {
			cfg.Namespace = pod.Namespace
		} else {
			cfg.Namespace = "default"
		}
	}
	if cfg.Grace <= 0 {
		cfg.Grace = def.Grace
	}
	if cfg.PendingTimeout <= 0 {
		cfg.PendingTimeout = def.PendingTimeout
	}
	p := &Provisioner{cfg: cfg, pods: cfg.Client.CoreV1().Pods(cfg.Namespace), stopInf: make(chan struct{}), logf: cfg.Logf, byName: map[string]*podState{}}
	if p.logf == nil {
		p.logf = func(string, ...any) {}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelJob + "=" + cfg.Job + "," + LabelRole + "=" + RoleWorker
		}))
	inf := factory.Core().V1().Pods().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.observe(obj, false) },
		UpdateFunc: func(_, obj any) { p.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p.observe(obj, true)
		},
	})
	if err != nil {
		return nil, err
	}
	factory.Start(p.stopInf)
	// The handler's own HasSynced, not the informer's: the informer has
	// synced once its store holds the first list, while the handler gets
	// those pods later, on its own goroutine, and byName (what Workers and
	// Adopt read) is the handler's. A driver that takes a job back would
	// otherwise see no pods of it for a moment.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		close(p.stopInf)
		factory.Shutdown()
		return nil, fmt.Errorf("kube: watching the pods of job %s in namespace %s: %w", cfg.Job, cfg.Namespace, errors.Join(ctx.Err(), errors.New("cache not synced")))
	}
	go func() {
		<-p.stopInf
		factory.Shutdown()
	}()
	return p, nil
}

// Names of the job's objects.
func (p *Provisioner) podName(i int) string { return fmt.Sprintf("%s-worker-%d", p.cfg.Job, i) }
func (p *Provisioner) serviceName() string  { return p.cfg.Job }

// SecretName is the name of the job's Secret (see secretNameFor).
func (p *Provisioner) SecretName() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return secretNameFor(p.cfg.Job, p.cfg.SecretEnv)
}

// SecretNameFor is the name of the Secret of job that holds secretEnv (see
// secretNameFor): a driver that takes a job back checks with it that the
// secret it was given is the one in the job's Secret.
func SecretNameFor(job string, secretEnv map[string]string) string {
	return secretNameFor(job, secretEnv)
}

// secretNameFor is the name of the Secret holding secretEnv for job:
// <job>-secret-<10 hex digits of a SHA-256 of its contents>. The driver may
// not read Secrets (its Role creates and deletes them, so that it cannot
// read the namespace's other Secrets), so it cannot check who made a Secret
// that exists already. A name only a holder of the job secret can compute
// does instead: a Secret someone made in advance under a name they could
// guess is never the one the workers read, while a restarted driver given
// the same secret finds the one its predecessor made, for the workers it
// adopts.
func secretNameFor(job string, secretEnv map[string]string) string {
	h := sha256.New()
	h.Write([]byte("gorovod kubernetes secret name\x00"))
	for _, k := range slices.Sorted(maps.Keys(secretEnv)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(secretEnv[k]), secretEnv[k])
	}
	return job + "-secret-" + hex.EncodeToString(h.Sum(nil)[:5])
}

func (p *Provisioner) labels() map[string]string {
	return map[string]string{LabelJob: p.cfg.Job}
}

func (p *Provisioner) owners() []metav1.OwnerReference {
	if p.cfg.Owner == nil {
		return nil
	}
	return []metav1.OwnerReference{*p.cfg.Owner}
}

// ensureShared creates the job's Secret and headless Service once.
func (p *Provisioner) ensureShared(ctx context.Context) error {
	p.mu.Lock()
	done, secretEnv := p.shared, p.cfg.SecretEnv
	p.mu.Unlock()
	if done {
		return nil
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretNameFor(p.cfg.Job, secretEnv), Labels: p.labels(), OwnerReferences: p.owners()},
		Type:       corev1.SecretTypeOpaque,
		StringData: secretEnv,
	}
	if _, err := p.cfg.Client.CoreV1().Secrets(p.cfg.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kube: creating secret %s: %w", secret.Name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: p.serviceName(), Labels: p.labels(), OwnerReferences: p.owners()},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{LabelJob: p.cfg.Job, LabelRole: RoleWorker},
			// Workers look each other up before they are ready.
			PublishNotReadyAddresses: true,
		},
	}
	if _, err := p.cfg.Client.CoreV1().Services(p.cfg.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kube: creating service %s: %w", svc.Name, err)
	}
	p.mu.Lock()
	p.shared = true
	p.mu.Unlock()
	return nil
}

// WorkerPod returns the pod the provisioner creates for worker i.
func (p *Provisioner) WorkerPod(i int) *corev1.Pod { return p.workerPod(i, nil, nil, "", nil) }

// trainerContainer is the template's trainer container: the one named
// ContainerName, else the first; nil when it has none.
func trainerContainer(pod *corev1.Pod) *corev1.Container {
	cs := pod.Spec.Containers
	for i := range cs {
		if cs[i].Name == ContainerName {
			return &cs[i]
		}
	}
	if len(cs) > 0 {
		return &cs[0]
	}
	return nil
}

// workerPod is worker i's pod, with extra variables (a launch's own) after
// the configuration's, running command (nil: Config.Command), bound to node
// ("": as the template says).
func (p *Provisioner) workerPod(i int, command []string, extra []corev1.EnvVar, node string, annotations map[string]string) *corev1.Pod {
	name := p.podName(i)
	labels := p.labels()
	labels[LabelRole] = RoleWorker
	labels[LabelIndex] = strconv.Itoa(i)
	pod := &corev1.Pod{}
	if p.cfg.Template != nil {
		pod = p.cfg.Template.DeepCopy()
		pod.ObjectMeta = metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}
		pod.Status = corev1.PodStatus{}
	}
	tc := trainerContainer(pod)
	if tc == nil {
		pod.Spec.Containers = []corev1.Container{{}}
		tc = &pod.Spec.Containers[0]
	}
	var tplEnv []corev1.EnvVar
	tplEnv, tc.Env = tc.Env, nil
	for k, v := range labels {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[k] = v
	}
	for k, v := range annotations {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[k] = v
	}
	grace := int64((p.cfg.Grace + time.Second - 1) / time.Second)
	no := false
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	env := []corev1.EnvVar{
		{Name: envconfig.EnvPodName, ValueFrom: field("metadata.name")},
		{Name: envconfig.EnvPodNamespace, ValueFrom: field("metadata.namespace")},
		{Name: envconfig.EnvPodUID, ValueFrom: field("metadata.uid")},
		{Name: envconfig.EnvPodIP, ValueFrom: field("status.podIP")},
		{Name: envconfig.EnvLaunchIndex, Value: strconv.Itoa(i)},
	}
	set := map[string]bool{}
	for _, e := range slices.Concat(p.cfg.Env, extra, tplEnv) {
		set[e.Name] = true
	}
	// Other pods reach this worker at its pod IP ($(VAR) is expanded by the
	// kubelet from the variables above).
	if !set[envconfig.EnvListenAddr] {
		env = append(env, corev1.EnvVar{Name: envconfig.EnvListenAddr, Value: "$(" + envconfig.EnvPodIP + "):0"})
	}
	if !set[envconfig.EnvGossipAddr] {
		env = append(env, corev1.EnvVar{Name: envconfig.EnvGossipAddr, Value: "$(" + envconfig.EnvPodIP + ")"})
	}
	// Later entries of a name win: the template's over the job's, the
	// secret's over everything.
	env = appendEnv(env, p.cfg.Env...)
	env = appendEnv(env, extra...)
	env = appendEnv(env, tplEnv...)
	for _, k := range slices.Sorted(maps.Keys(p.cfg.SecretEnv)) {
		env = appendEnv(env, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretNameFor(p.cfg.Job, p.cfg.SecretEnv)}, Key: k}}})
	}
	pod.Name, pod.Namespace, pod.OwnerReferences = name, p.cfg.Namespace, p.owners()
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Hostname, pod.Spec.Subdomain = name, p.serviceName()
	pod.Spec.TerminationGracePeriodSeconds = &grace
	if p.cfg.ServiceAccountName != "" || p.cfg.Template == nil {
		pod.Spec.ServiceAccountName = p.cfg.ServiceAccountName
	}
	if p.cfg.Template == nil || pod.Spec.AutomountServiceAccountToken == nil {
		pod.Spec.AutomountServiceAccountToken = &no
	}
	if p.cfg.Template == nil || pod.Spec.EnableServiceLinks == nil {
		pod.Spec.EnableServiceLinks = &no
	}
	tc.Name, tc.Env = ContainerName, env
	if p.cfg.Image != "" {
		tc.Image = p.cfg.Image
	}
	if command == nil {
		command = p.cfg.Command
	}
	if len(command) > 0 {
		tc.Command = slices.Clone(command)
	}
	if len(p.cfg.Resources.Limits) > 0 || len(p.cfg.Resources.Requests) > 0 {
		tc.Resources = p.cfg.Resources
	}
	if tc.ImagePullPolicy == "" {
		tc.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if node != "" {
		pod.Spec.NodeName = node
	}
	if p.cfg.Customize != nil {
		p.cfg.Customize(pod)
	}
	return pod
}

// appendEnv appends vars to env, each replacing an entry of its name.
func appendEnv(env []corev1.EnvVar, vars ...corev1.EnvVar) []corev1.EnvVar {
	for _, v := range vars {
		env = slices.DeleteFunc(env, func(e corev1.EnvVar) bool { return e.Name == v.Name })
		env = append(env, v)
	}
	return env
}

// Start creates n more worker pods (heuristics.Provisioner); the first call
// also creates the job's Secret and Service.
func (p *Provisioner) Start(ctx context.Context, n int) error {
	for range n {
		p.mu.Lock()
		i := p.next
		p.mu.Unlock()
		if _, err := p.create(ctx, i, nil, nil, "", nil); err != nil {
			return err
		}
	}
	return nil
}

// create creates worker i's pod (index i must not have been used) as
// workerPod makes it; the first call also creates the job's Secret and
// Service.
func (p *Provisioner) create(ctx context.Context, i int, command []string, extra []corev1.EnvVar, node string, annotations map[string]string) (*podState, error) {
	if err := p.ensureShared(ctx); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("kube: provisioner closed")
	}
	if _, taken := p.byName[p.podName(i)]; taken || i < 0 {
		p.mu.Unlock()
		return nil, fmt.Errorf("kube: worker index %d is taken", i)
	}
	p.next = max(p.next, i+1)
	st := p.track(p.podName(i), i)
	p.mu.Unlock()
	pod := p.workerPod(i, command, extra, node, annotations)
	p.mu.Lock()
	st.spec = pod.DeepCopy() // before the pod exists: a rejection makes it again
	p.mu.Unlock()
	if _, err := p.pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		p.mu.Lock()
		p.forget(st)
		p.mu.Unlock()
		return nil, fmt.Errorf("kube: creating pod %s: %w", st.Pod, err)
	}
	p.logf("pod %s created", st.Pod)
	return st, nil
}

// track registers a pod (under mu); the pending timer starts with it.
func (p *Provisioner) track(name string, index int) *podState {
	if st, ok := p.byName[name]; ok {
		return st
	}
	st := &podState{Worker: Worker{Pod: name, Index: index}, reported: map[EventKind]bool{},
		ended: make(chan struct{}), gone: make(chan struct{})}
	st.pending = time.AfterFunc(p.cfg.PendingTimeout, func() { p.giveUp(st) })
	p.byName[name] = st
	return st
}

// forget drops a pod whose creation failed (under mu).
func (p *Provisioner) forget(st *podState) {
	st.pending.Stop()
	delete(p.byName, st.Pod)
}

// Detach leaves the job's pods, Service and Secret to a driver that takes
// the job back: from now on the provisioner deletes nothing (Stop, Close,
// a pod's Signal and the pending timeout leave the pods alone) and Close
// only stops the watch.
func (p *Provisioner) Detach() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.detached = true
	for _, st := range p.byName {
		st.pending.Stop()
	}
}

// giveUp deletes a pod that did not start in time.
func (p *Provisioner) giveUp(st *podState) {
	p.mu.Lock()
	if st.Running || st.Ended || st.Deleted || p.stopped || p.detached {
		p.mu.Unlock()
		return
	}
	st.byUs, st.GaveUp = true, true
	ev := p.eventLocked(st, PodGaveUp, fmt.Sprintf("not running %v after its creation", p.cfg.PendingTimeout))
	p.mu.Unlock()
	p.emit(ev)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	if err := p.pods.Delete(ctx, st.Pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		p.logf("deleting pod %s, which did not start: %v", st.Pod, err)
	}
}

// eventLocked marks kind reported for st and returns the event, or nil if it
// was reported before (under mu).
func (p *Provisioner) eventLocked(st *podState, kind EventKind, reason string) *Event {
	if st.reported[kind] {
		return nil
	}
	st.reported[kind] = true
	return &Event{Kind: kind, Pod: st.Pod, Index: st.Index, Phase: st.Phase, ExitCode: st.ExitCode,
		Preempted: st.Preempted, Reason: reason, Time: time.Now()}
}

func (p *Provisioner) emit(evs ...*Event) {
	for _, ev := range evs {
		if ev == nil {
			continue
		}
		p.logf("pod %s %s %s", ev.Pod, ev.Kind, ev.Reason)
		if p.cfg.OnEvent != nil {
			p.cfg.OnEvent(*ev)
		}
	}
}

// observe updates a pod's state from the watch.
func (p *Provisioner) observe(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[LabelJob] != p.cfg.Job || pod.Labels[LabelRole] != RoleWorker {
		return
	}
	index, err := strconv.Atoi(pod.Labels[LabelIndex])
	if err != nil {
		index = -1
	}
	p.mu.Lock()
	st := p.track(pod.Name, index)
	if h := pod.Annotations[AnnotationHost]; h != "" {
		st.Host = h
	}
	if index >= p.next {
		p.next = index + 1 // adopted from an earlier driver
	}
	if st.oldGone != nil {
		// The incarnation the node rejected: only its deletion matters,
		// after which readmit makes the pod again.
		if deleted {
			close(st.oldGone)
			st.oldGone = nil
		}
		p.mu.Unlock()
		return
	}
	if reason, ok := notAdmitted(pod); ok && st.spec != nil && !st.Running && !st.Ended && !st.byUs && !st.GaveUp && !p.closed {
		st.rejections++
		gone := make(chan struct{})
		if deleted {
			close(gone)
		} else {
			st.oldGone = gone
		}
		delay := readmitDelay(st.rejections)
		ev := &Event{Kind: PodRejected, Pod: st.Pod, Index: st.Index, Phase: pod.Status.Phase,
			Reason: fmt.Sprintf("%s (node %s): made again in %v", reason, pod.Spec.NodeName, delay), Time: time.Now()}
		p.mu.Unlock()
		p.emit(ev)
		go p.readmit(st, pod.UID, gone, delay)
		return
	}
	var evs []*Event
	evs = append(evs, p.eventLocked(st, PodCreated, ""))
	st.Phase = pod.Status.Phase
	if started(pod) && !st.Running {
		st.Running = true
		st.pending.Stop()
		evs = append(evs, p.eventLocked(st, PodRunning, ""))
	}
	if code, reason, exited, ended := ended(pod); ended && !st.Ended {
		st.Ended, st.ExitCode, st.Exited = true, code, exited
		// A worker the provisioner deleted exits 143 too: that is the
		// engine's decision, not a preemption.
		st.Preempted = (preempted(pod, code) || pod.DeletionTimestamp != nil) && !st.byUs
		st.pending.Stop()
		close(st.ended)
		evs = append(evs, p.eventLocked(st, PodEnded, reason))
	}
	if deleted && !st.Deleted {
		st.Deleted = true
		st.pending.Stop()
		if !st.Ended {
			// Gone before its container ended: deleted by someone else
			// (a drain, kubectl) counts as preemption.
			st.Ended, st.Preempted = true, !st.byUs
			close(st.ended)
		}
		close(st.gone)
		reason := "deleted by the provisioner"
		if !st.byUs {
			reason = "deleted by someone else"
		}
		evs = append(evs, p.eventLocked(st, PodDeleted, reason))
	}
	p.mu.Unlock()
	p.emit(evs...)
}

// notAdmitted says whether the node rejected the pod for want of a resource
// that a terminating pod may still hold (the kubelet counts a pod's requests
// until it has terminated): its reason and message when so. Other
// rejections (node affinity, host ports, a node shutting down) are not
// retried.
func notAdmitted(pod *corev1.Pod) (string, bool) {
	r := pod.Status.Reason
	if pod.Status.Phase != corev1.PodFailed || !(strings.HasPrefix(r, "OutOf") || r == "UnexpectedAdmissionError") {
		return "", false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
			return "", false // it ran: not an admission
		}
	}
	return r + ": " + pod.Status.Message, true
}

// readmitDelay is the wait before a rejected pod is made again: 0.5 s,
// doubling with each rejection of the same worker, at most 4 s (a leaving
// trainer takes up to its leave notice to free its slot).
func readmitDelay(rejections int) time.Duration {
	return min(500*time.Millisecond<<min(rejections-1, 3), 4*time.Second)
}

// readmit replaces an incarnation of st's pod that the node rejected (uid):
// it deletes it, waits for it to be gone and for delay, and creates the pod
// again under the same name. A worker the provisioner let go of meanwhile
// (deleted, given up, the provisioner closed) ends instead, as a pod gone
// without its container ending.
func (p *Provisioner) readmit(st *podState, uid types.UID, gone <-chan struct{}, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := p.pods.Delete(ctx, st.Pod, opts); err != nil && !apierrors.IsNotFound(err) {
		p.logf("deleting pod %s, which its node rejected: %v", st.Pod, err)
	}
	wait := time.NewTimer(delay)
	defer wait.Stop()
	select { // the rejected pod gone
	case <-gone:
	case <-p.stopInf:
	case <-ctx.Done():
	}
	select {
	case <-wait.C:
	case <-p.stopInf:
	case <-ctx.Done():
	}
	p.mu.Lock()
	if letGo := p.closed || st.byUs || st.GaveUp || ctx.Err() != nil; letGo {
		evs := p.endLocked(st, "deleted by the provisioner before its node admitted it")
		p.mu.Unlock()
		p.emit(evs...)
		return
	}
	spec := st.spec.DeepCopy()
	p.mu.Unlock()
	_, err := p.pods.Create(ctx, spec, metav1.CreateOptions{})
	p.mu.Lock()
	if err != nil {
		evs := p.endLocked(st, fmt.Sprintf("making it again after its node rejected it: %v", err))
		p.mu.Unlock()
		p.emit(evs...)
		return
	}
	letGo := p.closed || st.byUs || st.GaveUp
	p.mu.Unlock()
	p.logf("pod %s created again (its node had rejected it)", st.Pod)
	if letGo {
		// Let go of while it was being made: its deletion's events end it.
		if err := p.pods.Delete(ctx, st.Pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			p.logf("deleting pod %s: %v", st.Pod, err)
		}
	}
}

// endLocked ends a worker whose pod is gone without its container ending
// (under mu), and returns the events to emit.
func (p *Provisioner) endLocked(st *podState, reason string) []*Event {
	if st.Deleted {
		return nil
	}
	st.pending.Stop()
	var evs []*Event
	if !st.Ended {
		st.Ended = true
		close(st.ended)
		evs = append(evs, p.eventLocked(st, PodEnded, reason))
	}
	st.Deleted = true
	close(st.gone)
	return append(evs, p.eventLocked(st, PodDeleted, reason))
}

func started(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil {
			return true
		}
	}
	return pod.Status.Phase == corev1.PodRunning
}

// ended says whether the worker's pod is over, and how: exited when its
// container ended with code (or the pod succeeded), not when the pod failed
// without it (evicted, say).
func ended(pod *corev1.Pod) (code int32, reason string, exited, done bool) {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Terminated != nil {
			t := cs.State.Terminated
			return t.ExitCode, t.Reason, true, true
		}
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return 0, pod.Status.Reason, true, true
	case corev1.PodFailed:
		return 0, pod.Status.Reason, false, true
	}
	return 0, "", false, false
}

// preempted: the trainer was told to go (SIGTERM: exit 143) or the cluster
// took the pod away (preemption, eviction, node shutdown).
func preempted(pod *corev1.Pod, code int32) bool {
	if code == 128+15 || pod.Status.Reason == "Evicted" {
		return true
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Workers lists the job's worker pods, by index.
func (p *Provisioner) Workers() []Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Worker, 0, len(p.byName))
	for _, st := range p.byName {
		out = append(out, st.Worker)
	}
	slices.SortFunc(out, func(a, b Worker) int { return a.Index - b.Index })
	return out
}

// Stop makes sure a worker the engine removed ends (heuristics.Provisioner):
// it waits Grace for the worker's container to exit, then deletes the pod
// (SIGTERM, SIGKILL after Grace) and waits for it to be gone. A pod of
// another job, or no pod at all, is left alone.
func (p *Provisioner) Stop(ctx context.Context, w heuristics.WorkerInfo) error {
	p.mu.Lock()
	st, detached := p.byName[w.Host], p.detached // a worker's host name is its pod name
	p.mu.Unlock()
	if detached {
		return nil
	}
	if st == nil {
		p.logf("worker %s (host %s) is not a pod of job %s; not stopping it", w.Name, w.Host, p.cfg.Job)
		return nil
	}
	t := time.NewTimer(p.cfg.Grace)
	select {
	case <-st.ended:
		t.Stop()
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.C:
		p.logf("pod %s still running %v after its removal; deleting it", st.Pod, p.cfg.Grace)
	}
	return p.deleteAndWait(ctx, st)
}

func (p *Provisioner) deleteAndWait(ctx context.Context, st *podState) error {
	if err := p.deletePod(ctx, st, nil); err != nil {
		return err
	}
	// The kubelet has the pod's grace period to end it, then reports.
	t := time.NewTimer(2*p.cfg.Grace + 30*time.Second)
	defer t.Stop()
	select {
	case <-st.gone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("kube: pod %s still there %v after its deletion", st.Pod, 2*p.cfg.Grace+30*time.Second)
	}
}

// Close ends the job's pods, as at the end of the job: it deletes every
// worker pod (SIGTERM, SIGKILL after Grace), then the Service and the
// Secret, waits for the pods to be gone and stops watching.
func (p *Provisioner) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.detached {
		p.stopped = true
		for _, st := range p.byName {
			st.pending.Stop()
		}
		p.mu.Unlock()
		close(p.stopInf)
		return nil
	}
	var live []*podState
	for _, st := range p.byName {
		if !st.Deleted {
			live = append(live, st)
		}
	}
	p.mu.Unlock()
	errs := make([]error, len(live))
	var wg sync.WaitGroup
	for i, st := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.deleteAndWait(ctx, st)
		}()
	}
	wg.Wait()
	if err := p.cfg.Client.CoreV1().Services(p.cfg.Namespace).Delete(ctx, p.serviceName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("kube: deleting service: %w", err))
	}
	if err := p.cfg.Client.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, p.SecretName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("kube: deleting secret: %w", err))
	}
	p.mu.Lock()
	p.stopped = true
	for _, st := range p.byName {
		st.pending.Stop()
	}
	p.mu.Unlock()
	close(p.stopInf)
	return errors.Join(errs...)
}

// SecretEnv returns the Secret entries for an elastic job's workers: the job
// secret, hex-encoded as envconfig reads it.
func SecretEnv(secret []byte) map[string]string {
	return map[string]string{envconfig.EnvSecret: hex.EncodeToString(secret)}
}
