// Command multihost measures allreduce across hosts: gorovod's benchmark
// workers (`gorovod _bench-worker`, what `gorovod bench` runs) against Open
// MPI over TCP (bench/peers/mpi_allreduce.c under mpirun) and PyTorch's Gloo
// backend (bench/peers/gloo_allreduce.py --env-rank, one process per rank,
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the launcher and Gloo bound
// to the host's interface), on the same network-namespace hosts
// (internal/testing/testhosts), each host reached over ssh.
// A head host runs the launcher, the rendezvous and mpirun; the ranks run on
// the other hosts, one per host (or --slots per host). The worker hosts'
// links can be shaped to set rates (--rates 1G,10G: testhosts.Link), and
// gorovod measured with several TCP lane counts (--lanes 0,1,4, each a
// column; 0 is the automatic choice, and --show-lanes prints what each
// link chose and the rates it measured). Every size is a run of its own, the implementations interleaved
// in an order that rotates from run to run, and the whole sweep repeats
// --reps times; the report gives, per rate, host count and size, the median
// bus bandwidth over the repetitions with its range, its share of the link
// rate, the CPU the worker hosts' processes used during the run (cores,
// from /proc: the test hosts share one machine's cores, so this tells a
// CPU-bound result from a link-bound one) and gorovod's ratio to Open MPI
// and to Gloo. With --op replicate it measures a joiner's state transfer
// instead (gorovod only): the last host's rank receives the buffer from
// the others' in stripes from each --sources count of them, the receiving
// host's link at --receiver-rate.
//
//	go build -o /tmp/gorovod ./cmd/gorovod
//	go run ./internal/testing/multihostbench --gorovod /tmp/gorovod --hosts 2,3 --reps 5
//	go run ./internal/testing/multihostbench --gorovod /tmp/gorovod --hosts 2,4 --slots 2 \
//		--rates 1G,10G --lanes 1,4 --transport auto --sizes 4K,4M,64M,256M --reps 5
//	go run ./internal/testing/multihostbench --gorovod /tmp/gorovod --impls gorovod --op replicate \
//		--hosts 9 --sizes 256M --rates 250M --receiver-rate 2G --sources 1,2,4,8
//
// Needs root (namespaces), openssh-server, and for the MPI side openmpi-bin
// and libopenmpi-dev (mpicc), for Gloo python3-torch (/usr/bin/python3). The machine's own network is never used: every
// address is inside the harness's namespaces.
package main
