// Package testkube runs a real Kubernetes control plane for tests: Debian's
// etcd, and kube-apiserver and kube-controller-manager built from the Go
// module proxy by deploy/kubernetes/build-control-plane.sh into a cache
// outside the clone. Everything listens on loopback on free ports and lives in
// a temporary directory of its own: self-signed serving certificates
// (--cert-dir), a service-account key pair made with openssl, a token file
// with an admin token, RBAC authorization and the default admission plugins,
// so that a pod is refused until its namespace's default service account
// exists — which the controller manager creates, as its garbage collector
// deletes the dependents of a deleted owner. Stop ends the daemons by pid.
//
// There is no kubelet: pods are stored, validated and watched, never run.
// Tests skip when etcd, openssl or the built binaries are missing.
package testkube
