// Package service owns gorovod's scheduler service on Kubernetes (`gorovod
// scheduler`): it shares a cluster's nodes among the GorovodJobs (package
// cluster/kube/api) with a cluster scheduling policy (package scheduler:
// Pollux by default, Optimus or Tiresias) and records each job's share in the
// job's status, which the job's driver carries out by growing or shrinking the
// job in place.
//
// The service watches GorovodJobs (a dynamic informer), nodes, the drivers'
// pods and every pod bound to a node (typed informers). A scheduling round
// runs every Config.Interval, and Config.EventDelay after a change of the
// cluster: a job arrives or ends, a node is added, cordoned, tainted, made
// not Ready, changes its capacity or its labels or is deleted, or a pod not the jobs' is
// bound to a node, ends or is resized (a delaying work queue gathers a
// burst's changes into one round); no round starts sooner than
// Config.MinRoundGap after the last one ended. A round:
//
//   - builds the cluster from the Ready, schedulable nodes whose NoSchedule
//     and NoExecute taints the workers tolerate (WorkerTolerations); a
//     node's slots are its allocatable nvidia.com/gpu where that is above
//     0, else its allocatable gorovod.io/slot (an extended resource), else
//     its label gorovod.io/slots=N, else it has none; less what the pods
//     bound to it that are not the scheduled jobs' request (FreeSlots,
//     OthersRequests: their GPUs, slots, or for a labelled node their CPU
//     in proportion).
//   - gives a new job the phase Pending (Failed, with the reason, when its
//     spec fails api.Spec.Validate), and ends a running job when its driver
//     pod ends (exit 0: Succeeded, otherwise Failed with the container's
//     reason; the job's worker pods left are deleted); an ended job's slots
//     are free in the same round. A driver pod
//     killed (exit 137), left on SIGTERM (143), deleted or lost with its
//     node while its job runs is replaced instead, when the driver recorded
//     status.adoption and did not mark it ended (replaceDriver): a pod
//     <job>-driver-<n> with the job secret from the Secret the record names
//     (a secretKeyRef), counted in status.driverRestarts, at most
//     Config.MaxDriverRestarts times; it takes the running job back.
//   - asks the policy for an allocation of the jobs not ended, from their
//     recorded allocations, fitted goodput models (status.goodput), attained
//     service and reallocation counts; repairs it to the jobs' minimums
//     (scheduler.RepairToMinimums: a running job keeps its minimum, a job
//     starts with at least its minimum); admits waiting jobs in priority
//     order, then by submission (scheduler.AdmitByPriority); and places the
//     workers on nodes (scheduler.PlaceCounts: the policy's placement where
//     it stands, else the job's current nodes, then packing). A job with
//     spec.nodeSelector or spec.requiredNodeAffinity gets workers only on
//     the nodes that match them (api.Spec.MatchesNode; scheduler.Job
//     Eligible), and waits, its message saying why, while they cannot hold
//     its minimum; once running, it keeps its minimum where it is while
//     they cannot (keepStranded). So does a job for the kind of a node's
//     slots (KindOf, SlotKind.Fits): a job whose spec.resources asks for
//     nvidia.com/gpu (api.Spec.WantsGPUs) gets workers on GPU nodes only,
//     any other job on nodes without GPUs only. A job with spec.preferredNodeAffinity has
//     its workers placed on the nodes of highest summed weight first
//     (api.Spec.NodePreference; scheduler.Job Preference). A job with
//     spec.maxWorkersPerNode gets at most that many workers on a node
//     (scheduler.Job MaxPerNode), waits, its message saying why, while its
//     nodes cannot hold its minimum so, and is kept as above once running.
//     Where a waiting job's placement would take slots a running job needs
//     for its minimum, the running jobs are placed first. Its driver pod
//     carries its selection and preferences.
//   - writes each changed job's scheduler fields (phase, message, allocation:
//     one node name per worker, reallocations, driver, times, attained
//     service, observedGeneration, scheduledBy) with a JSON merge patch on
//     the status subresource, leaving the driver's fields alone; and creates
//     the driver pod `<job>-driver` of a job admitted for the first time
//     (owned by the GorovodJob), and before it the pod's
//     PodDisruptionBudget (minAvailable 1: a drain does not evict a
//     running driver, whose end would end the job), after making sure the
//     job's namespace has the driver's ServiceAccount and a RoleBinding to
//     the ClusterRole gorovod-driver.
//
// Everything the service decides from is in the API server (the jobs'
// status), so a new scheduler — a restart, or another replica taking over —
// continues from the recorded allocations, which the reallocation penalty
// sees as current. With leader election (a coordination.k8s.io Lease) only
// the leader runs rounds and writes; a replica that loses the lease stops
// before its next write, and one that stops releases the lease only after its
// last write has returned.
//
// Config.Metrics (NewMetrics) records the service's leadership, rounds, jobs
// by phase and slots in Prometheus's format, for `gorovod scheduler
// --metrics-addr`.
package service
