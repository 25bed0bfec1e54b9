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
// A control plane alone runs no pod: pods are stored, validated and
// watched. ControlPlane.NewNode adds a node that runs them (a kubelet with
// its own containerd and runc; see Node), from images of a few static files
// (Image; BuildStatic builds a test's Go command for one). AdminClient is
// the admin's client with the namespaces a test needs. Tests skip when
// etcd, openssl or the built binaries are missing, and a node's when
// containerd, runc or the kubelet is (MissingNode).
package testkube
