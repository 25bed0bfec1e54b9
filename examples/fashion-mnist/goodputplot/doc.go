// Command goodputplot draws the fixed-versus-adaptive batch comparison of
// docs/goodput.md from the Fashion-MNIST trainer's --json records: test
// accuracy against training time and against samples, and the global batch
// size, measured statistical efficiency and measured goodput (samples per
// second × efficiency, per 50 steps) over training. Each input file is
// one run (gorovod run's output or the trainer's; only rank 0's records
// count), labelled by its file name without extension. It also prints, per
// run, the training time and samples to reach --target accuracy, as a
// Markdown table (examples/fashion-mnist/compare-batch.sh runs it all).
//
//	goodputplot -o docs/goodput-fashion-mnist.png -target 0.85 runs/*.jsonl
package main
