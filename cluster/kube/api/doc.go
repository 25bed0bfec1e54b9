// Package api owns the GorovodJob custom resource (gorovod.io/v1alpha1): the
// Go types that the cluster scheduler service (package cluster/kube/service),
// a job's driver pod and the `gorovod submit / jobs / logs / delete` commands
// share, and their conversion to and from the unstructured objects of
// client-go's dynamic client. Its CustomResourceDefinition is in
// deploy/kubernetes/gorovod.yaml.
//
// A GorovodJob's spec is what its user asks for (image, command, the bounds
// on its worker count and batch size, a priority, the nodes it may run on:
// Spec.MatchesNode); its status is written by
// the scheduler (phase, allocation) and by the job's driver (world size,
// fitted goodput model), each only its own fields, through the status
// subresource.
package api
