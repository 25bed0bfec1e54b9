// Command multihost measures allreduce across hosts: gorovod's benchmark
// workers (`gorovod _bench-worker`, what `gorovod bench` runs) against Open
// MPI over TCP (bench/peers/mpi_allreduce.c under mpirun), on the same
// network-namespace hosts (internal/testing/testhosts), each host reached over ssh.
// A head host runs the launcher, the rendezvous and mpirun; the ranks run on
// the other hosts, one per host (or --slots per host). Runs interleave the
// implementations and repeat; the report gives, per size, the median bus
// bandwidth over the repetitions and its range.
//
//	go build -o /tmp/gorovod ./cmd/gorovod
//	go run ./internal/testing/multihostbench --gorovod /tmp/gorovod --hosts 2,3 --reps 5
//
// Needs root (namespaces), openssh-server, and for the MPI side openmpi-bin
// and libopenmpi-dev (mpicc). The machine's own network is never used: every
// address is inside the harness's namespaces.
package main
