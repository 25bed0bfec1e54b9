// Command gorovod launches and measures gorovod jobs. The command line itself
// is package cli, so that a program with its own Go heuristics can run it, and
// `gorovod run` is the command line of package job, the job runner a Go
// program can also call directly.
//
//	gorovod run --np 2 --max-np 8 --heuristic scaling-efficiency -- ./trainer
//	gorovod bench allreduce --np 4 --min-bytes 4K --max-bytes 64M
package main
