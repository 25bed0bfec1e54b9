// Command synthetic is an elastic trainer with a known answer: its per-step
// compute is simulated (a sleep per sample, so many workers fit on a few cores
// as if each had its own accelerator) while its gradients are real buffers that
// go through the real allreduce, and its data order comes from the elastic
// Sampler. Its loop is sync.Train's; the trainer writes only the step. Run it
// under `gorovod run` (alone, it trains in a world of one):
//
//	gorovod run --np 3 -- synthetic --steps 200 --json
//
// Each step prints (with --json) one object with step, epoch, world_epoch,
// rank, size, loss, params_sha256, time_us (when the worker committed the
// step, µs since the Unix epoch by its clock) and, with --log-samples, the
// sample indices this worker processed, so tests can check that workers agree
// and that no sample is lost or processed twice across resizes, and time a
// world change by the workers' own clocks.
package main
