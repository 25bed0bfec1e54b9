// Package benchmark measures the collectives the way nccl-tests does: for each
// message size it times the operation, verifies the result, and reports time,
// algorithm bandwidth and bus bandwidth. `gorovod bench` runs it in every worker
// process; tests run it in one process.
package benchmark
