package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// The job commands: GorovodJobs on a Kubernetes cluster where the gorovod
// scheduler runs (deploy/kubernetes/gorovod.yaml).

func jobUsage(stderr io.Writer, command, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod "+command+": "+format+"\nRun 'gorovod "+command+" --help' for the flags.\n", args...)
	return ErrUsage
}

// submitCommand is `gorovod submit JOB.yaml` or `gorovod submit --name N
// --image I [flags] -- COMMAND...`.
func submitCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod submit", flag.ContinueOnError)
	var kf kubeFlags
	kf.register(fs, false)
	name := fs.String("name", "", "the job's `name` (a DNS label of at most 40 characters)")
	image := fs.String("image", "", "the workers' container `image`")
	minW := fs.Int("min-workers", 1, "fewest workers the job trains with")
	maxW := fs.Int("max-workers", 0, "most workers (0: as many as the scheduler gives)")
	priority := fs.Int("priority", 0, "higher runs first when not every job fits")
	gpu := fs.Bool("gpu", false, "each worker asks for one nvidia.com/gpu (spec.resources.limits, added to a manifest's): the job runs on GPU nodes only; without it, on the nodes without GPUs only")
	var perNode *int32
	fs.Func("max-workers-per-node", fmt.Sprintf("at most `N` of the job's workers on one node, 0 to %d (spec.maxWorkersPerNode, replacing a manifest's; 0: no limit beyond the node's slots)", api.MaxWorkersPerNodeLimit),
		func(v string) error {
			n, err := strconv.ParseInt(v, 10, 32) // the range is checked with the spec (Validate)
			if err != nil {
				return fmt.Errorf("%q: want a whole number", v)
			}
			perNode = new(int32)
			*perNode = int32(n)
			return nil
		})
	probeTimeout := fs.Duration("probe-timeout", 0, "a blamed worker's time to answer the liveness probe before it is left out of the next world, a `duration` such as 3s, at most 10m (spec.probeTimeout, replacing a manifest's; default: the driver's, 500ms)")
	nodeSelector := map[string]string{}
	fs.Func("node-selector", "keep the job on the nodes with these labels: `KEY=VALUE[,KEY=VALUE...]` (spec.nodeSelector; repeatable; added to a manifest's)",
		func(v string) error {
			// The keys and values are checked with the spec (Validate).
			for _, pair := range strings.Split(v, ",") {
				k, val, ok := strings.Cut(pair, "=")
				if !ok || strings.TrimSpace(k) == "" {
					return fmt.Errorf("%q: want KEY=VALUE[,KEY=VALUE...]", pair)
				}
				nodeSelector[strings.TrimSpace(k)] = strings.TrimSpace(val)
			}
			return nil
		})
	var required []corev1.NodeSelectorTerm
	fs.Func("require-node", "keep the job on the nodes this label `SELECTOR` matches (kubectl's -l syntax: KEY=VALUE, KEY!=VALUE, 'KEY in (A,B)', 'KEY notin (A,B)', KEY, !KEY, KEY>N, KEY<N; commas: all must hold). Repeat it for alternatives: a node must match one (spec.requiredNodeAffinity, replacing a manifest's)",
		appendParsed(&required, parseNodeTerm))
	var preferred []corev1.PreferredSchedulingTerm
	fs.Func("prefer-node", fmt.Sprintf("place the job's workers first on the nodes this label selector matches, `SELECTOR[:WEIGHT]` (the selector as --require-node's; weight 1 to 100, default %d). Repeatable: a node's score is the sum of the weights it matches (spec.preferredNodeAffinity, added to a manifest's)", defaultPreferenceWeight),
		appendParsed(&preferred, parsePreferNode))
	usage := `Usage: gorovod submit [flags] JOB.yaml
       gorovod submit --name NAME --image IMAGE [--min-workers N] [--max-workers N] [--priority P] [--node-selector K=V] [--require-node SELECTOR] [--prefer-node SELECTOR[:WEIGHT]] [--max-workers-per-node N] [--probe-timeout D] -- COMMAND [ARGS...]

Submits an elastic training job to the gorovod scheduler of a Kubernetes
cluster: a GorovodJob (gorovod.io/v1alpha1), from a manifest or from the
flags. The scheduler gives it workers (pods on its nodes) as the cluster's
load and the job's goodput allow, and grows or shrinks it live.

Where the job runs: --node-selector and --require-node keep it on the nodes
that match (every --node-selector label, and one --require-node selector);
--prefer-node ranks the nodes it may use, the highest summed weight first,
where the scheduler's policy leaves the choice of node open (it never
changes how many workers the job gets); --max-workers-per-node spreads its
workers, at most N on a node (a job whose --min-workers its nodes cannot
hold so waits). For example:

  gorovod submit job.yaml --require-node 'example.com/pool in (a,b)' \
      --prefer-node example.com/pool=b:50 --prefer-node '!example.com/spot' \
      --max-workers-per-node 1`
	if err := parseFlags(fs, reorderFlags(fs, args), usage, stdout, stderr); err != nil {
		return err
	}
	flagsSet := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "name", "image", "min-workers", "max-workers", "priority":
			flagsSet = true
		}
	})
	var gj *api.GorovodJob
	switch rest := fs.Args(); {
	case flagsSet:
		if *name == "" {
			return jobUsage(stderr, "submit", "--name is required without a manifest")
		}
		gj = &api.GorovodJob{ObjectMeta: metav1.ObjectMeta{Name: *name},
			Spec: api.Spec{Image: *image, Command: rest, MinWorkers: int32(*minW), MaxWorkers: int32(*maxW), Priority: int32(*priority)}}
	case len(rest) == 1:
		var err error
		if gj, err = readJobManifest(rest[0]); err != nil {
			return &commandError{command: "submit", err: err}
		}
	default:
		return jobUsage(stderr, "submit", "give a GorovodJob manifest, or --name, --image and -- COMMAND")
	}
	if len(nodeSelector) > 0 {
		if gj.Spec.NodeSelector == nil {
			gj.Spec.NodeSelector = map[string]string{}
		}
		maps.Copy(gj.Spec.NodeSelector, nodeSelector)
	}
	if len(required) > 0 {
		gj.Spec.RequiredNodeAffinity = &corev1.NodeSelector{NodeSelectorTerms: required}
	}
	gj.Spec.PreferredNodeAffinity = append(gj.Spec.PreferredNodeAffinity, preferred...)
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "probe-timeout" { // checked with the spec (Validate)
			gj.Spec.ProbeTimeout = &metav1.Duration{Duration: *probeTimeout}
		}
	})
	if perNode != nil {
		gj.Spec.MaxWorkersPerNode = *perNode
	}
	if *gpu {
		if gj.Spec.Resources.Limits == nil {
			gj.Spec.Resources.Limits = corev1.ResourceList{}
		}
		gj.Spec.Resources.Limits[api.GPUResource] = resource.MustParse("1")
	}
	if err := gj.Spec.Validate(); err != nil {
		return &commandError{command: "submit", err: err}
	}
	if l := len(gj.Name); l == 0 || l > 40 {
		return &commandError{command: "submit", err: fmt.Errorf("gorovodjob: metadata.name %q: want a DNS label of at most 40 characters", gj.Name)}
	}
	c, err := kf.connect(ctx)
	if err != nil {
		return &commandError{command: "submit", err: err}
	}
	if gj.Namespace != "" && kf.namespace != "" && gj.Namespace != kf.namespace {
		return &commandError{command: "submit", err: fmt.Errorf("the manifest's namespace %s is not --namespace %s", gj.Namespace, kf.namespace)}
	}
	ns := gj.Namespace
	if ns == "" {
		ns = c.namespace
	}
	gj.Namespace = ns
	gj.Status = api.Status{}
	u, err := api.ToUnstructured(gj)
	if err != nil {
		return &commandError{command: "submit", err: err}
	}
	if _, err := c.jobs(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			err = fmt.Errorf("gorovodjob %s already exists in namespace %s (gorovod delete %s first, or pick another name)", gj.Name, ns, gj.Name)
		case apierrors.IsInvalid(err):
			err = fmt.Errorf("the API server refused gorovodjob %s: %w", gj.Name, err)
		default:
			err = c.apiError(err)
		}
		return &commandError{command: "submit", err: err}
	}
	fmt.Fprintf(stdout, "gorovodjob %s/%s submitted\n", ns, gj.Name)
	return nil
}

// readJobManifest reads a GorovodJob manifest (YAML or JSON), strictly:
// an unknown field is an error, not ignored.
func readJobManifest(path string) (*api.GorovodJob, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var gj api.GorovodJob
	if err := yaml.UnmarshalStrict(b, &gj); err != nil {
		return nil, fmt.Errorf("%s: not a GorovodJob manifest: %w", path, err)
	}
	if want := api.Group + "/" + api.Version; gj.APIVersion != want || gj.Kind != api.Kind {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q: want apiVersion %s, kind %s", path, gj.APIVersion, gj.Kind, want, api.Kind)
	}
	return &gj, nil
}

// jobsCommand is `gorovod jobs`: a table of the GorovodJobs.
func jobsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod jobs", flag.ContinueOnError)
	var kf kubeFlags
	kf.register(fs, true)
	usage := `Usage: gorovod jobs [-n NAMESPACE | -A]

Lists the GorovodJobs: phase, workers in the world / workers allocated by
the scheduler, the goodput the job's fitted model predicts at its
allocation (samples per second, once measured), and age.`
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return jobUsage(stderr, "jobs", "no arguments expected, got %q", fs.Args())
	}
	c, err := kf.connect(ctx)
	if err != nil {
		return &commandError{command: "jobs", err: err}
	}
	ns := c.namespace
	if kf.allNamespaces {
		ns = ""
	}
	list, err := c.jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return &commandError{command: "jobs", err: c.apiError(err)}
	}
	var jobs []*api.GorovodJob
	for i := range list.Items {
		gj, err := api.FromUnstructured(&list.Items[i])
		if err != nil {
			return &commandError{command: "jobs", err: err}
		}
		jobs = append(jobs, gj)
	}
	if len(jobs) == 0 {
		if ns == "" {
			fmt.Fprintln(stderr, "No gorovodjobs.")
		} else {
			fmt.Fprintf(stderr, "No gorovodjobs in namespace %s.\n", ns)
		}
		return nil
	}
	slices.SortFunc(jobs, func(a, b *api.GorovodJob) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	w := tabwriter.NewWriter(stdout, 0, 4, 3, ' ', 0)
	if ns == "" {
		fmt.Fprint(w, "NAMESPACE\t")
	}
	fmt.Fprintln(w, "NAME\tPHASE\tWORKERS\tGOODPUT\tSTEP\tAGE")
	now := time.Now()
	for _, gj := range jobs {
		if ns == "" {
			fmt.Fprintf(w, "%s\t", gj.Namespace)
		}
		phase := string(gj.Status.Phase)
		if phase == "" {
			phase = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%d/%d\t%s\t%d\t%s\n", gj.Name, phase, gj.Status.WorldSize, len(gj.Status.Allocation),
			jobGoodput(gj), gj.Status.Step, age(now, gj.CreationTimestamp.Time))
	}
	return w.Flush()
}

// jobGoodput is the goodput the job's model predicts at its allocation, or
// "-" when there is no model or allocation.
func jobGoodput(gj *api.GorovodJob) string {
	g, a := gj.Status.Goodput, gj.Status.Allocation
	if g == nil || len(a) == 0 {
		return "-"
	}
	nodes := len(nodeCounts(a))
	v := scheduler.ModelGoodput(g.Model, goodput.Limits{MaxBatch: int(gj.Spec.Batch.Max)})(nodes, len(a))
	if !(v > 0) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// age is a duration as kubectl prints it: 45s, 12m, 3h, 4d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// logsCommand is `gorovod logs JOB [--worker N] [-f]`: a pod's log through
// the API server (which asks the pod's node's kubelet).
func logsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod logs", flag.ContinueOnError)
	var kf kubeFlags
	kf.register(fs, false)
	worker := fs.Int("worker", -1, "the log of worker `N` (pod JOB-worker-N) rather than the driver's")
	follow := fs.Bool("follow", false, "keep printing the log as it grows")
	fs.BoolVar(follow, "f", false, "short for --follow")
	usage := `Usage: gorovod logs [--worker N] [-f] JOB

Prints the log of a GorovodJob's driver pod (what 'gorovod run' prints: the
worlds, the workers' lines, the scheduler's resizes), or of one of its
worker pods.`
	if err := parseFlags(fs, reorderFlags(fs, args), usage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return jobUsage(stderr, "logs", "want one job name, got %d arguments", fs.NArg())
	}
	name := fs.Arg(0)
	c, err := kf.connect(ctx)
	if err != nil {
		return &commandError{command: "logs", err: err}
	}
	gj, err := c.getJob(ctx, name)
	if err != nil {
		return &commandError{command: "logs", err: err}
	}
	pod := gj.Status.Driver
	if pod == "" {
		pod = name + "-driver"
	}
	opts := &corev1.PodLogOptions{Follow: *follow}
	if *worker >= 0 {
		pod = fmt.Sprintf("%s-worker-%d", name, *worker)
		opts.Container = kube.ContainerName
	}
	// The log's stream has no deadline of its own (-f reads until the pod
	// ends or ctx does): a client without the request timeout.
	cfg := rest.CopyConfig(c.config)
	cfg.Timeout = 0
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return &commandError{command: "logs", err: err}
	}
	stream, err := core.CoreV1().Pods(c.namespace).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("pod %s of gorovodjob %s not found in namespace %s (phase %q)", pod, name, c.namespace, gj.Status.Phase)
		} else {
			err = fmt.Errorf("the log of pod %s: %w", pod, c.apiError(err))
		}
		return &commandError{command: "logs", err: err}
	}
	defer stream.Close()
	if _, err := io.Copy(stdout, stream); err != nil && ctx.Err() == nil {
		return &commandError{command: "logs", err: fmt.Errorf("the log of pod %s: %w", pod, err)}
	}
	return nil
}

// reorderFlags moves the flags after the first argument before it (`gorovod
// logs JOB -f`, as kubectl takes them); "--" ends the flags. The arguments
// follow the flags after a "--".
func reorderFlags(fs *flag.FlagSet, args []string) []string {
	var flags, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		default:
			rest = append(rest, a)
		}
	}
	if len(rest) == 0 {
		return flags
	}
	// After "--" nothing is a flag, even what begins with '-'.
	return append(append(flags, "--"), rest...)
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// deleteCommand is `gorovod delete JOB...`.
func deleteCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod delete", flag.ContinueOnError)
	var kf kubeFlags
	kf.register(fs, false)
	usage := `Usage: gorovod delete JOB...

Deletes GorovodJobs: the job's driver stops its workers (they leave at a
committed step) and the job's pods are deleted with it.`
	if err := parseFlags(fs, reorderFlags(fs, args), usage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return jobUsage(stderr, "delete", "name the jobs to delete")
	}
	c, err := kf.connect(ctx)
	if err != nil {
		return &commandError{command: "delete", err: err}
	}
	var errs []error
	for _, name := range fs.Args() {
		err := c.jobs(c.namespace).Delete(ctx, name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("gorovodjob %q not found in namespace %s", name, c.namespace))
		case err != nil:
			errs = append(errs, fmt.Errorf("deleting gorovodjob %s: %w", name, c.apiError(err)))
		default:
			fmt.Fprintf(stdout, "gorovodjob %s/%s deleted\n", c.namespace, name)
		}
	}
	if len(errs) > 0 {
		return &commandError{command: "delete", err: errors.Join(errs...)}
	}
	return nil
}
