// Package envconfig is the one place gorovod reads its environment: the
// variables a launcher (gorovod run, gorovod bench) sets for each worker process
// so that it can find the others, the pod a process runs in, and the ways to
// the Kubernetes API server that kubectl reads ($KUBECONFIG, $HOME, the
// in-cluster service address). Everything else takes configuration structs.
package envconfig
