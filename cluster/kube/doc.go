// Package kube runs an elastic gorovod job's workers as Kubernetes pods: a
// Provisioner (heuristics.Provisioner) on client-go that the autoscaling
// engine grows and shrinks the job through, and a watch that reports what
// happens to the pods.
//
// What a job is made of, all in one namespace and labelled
// gorovod.io/job=<job>:
//
//   - worker pods <job>-worker-<n> (n counts up, never reused), restartPolicy
//     Never, rank-free: gorovod assigns ranks itself, so any worker can
//     stand in for any other. Each learns its pod name, namespace, uid and
//     IP from the downward API (GOROVOD_POD_*) and binds its collective
//     transport and gossip to its pod IP. Its hostname is its pod name,
//     which is how the engine's workers (gossip members, known by host) map
//     to pods.
//   - a Secret <job>-secret-<hash> holding the job secret (and anything
//     else in Config.SecretEnv), given to the workers by secretKeyRef: it
//     never appears in the pod spec. The hash is of its contents, so that a
//     Secret made in advance by someone without the job secret is never the
//     one the workers read (the provisioner cannot read Secrets to check).
//   - a headless Service <job> (publishNotReadyAddresses) whose name is
//     the workers' subdomain: <pod>.<job>.<namespace>.svc resolves to a
//     worker's IP.
//   - owner references from all of them to Config.Owner (the driver's pod,
//     or for a GorovodJob the job): deleting the owner deletes the workers,
//     Secret and Service, through the garbage collector of
//     kube-controller-manager.
//
// A driver that leaves its job to another (Launcher.Detach) deletes nothing
// from then on. The next driver of the same job (same name and secret)
// finds the job's pods through its watch: Provisioner.Workers lists them,
// with the job host each was launched for (annotation gorovod.io/host), and
// Launcher.Adopt (job.WorkerAdopter) follows a running one as a job.Process,
// with its exit status when it ends.
//
// Stop (shrinking) waits Config.Grace for a removed worker to exit by itself,
// then deletes its pod with that grace period: the kubelet sends SIGTERM, the
// trainer leaves the job, and SIGKILL follows after the grace period. A pod
// that ends with exit code 143 (128+SIGTERM) or with a DisruptionTarget
// condition (preemption, eviction, node drain) is reported as preempted, so
// that the engine can start a replacement; the provisioner itself does not.
// A pod still not running PendingTimeout after its creation (unschedulable,
// image not found) is deleted and reported as given up.
//
// The RBAC Role the provisioner needs is in deploy/kubernetes/rbac.yaml:
// pods create, list, watch and delete; secrets and services create and
// delete; nothing else, in its namespace only.
package kube
