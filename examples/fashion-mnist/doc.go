// Command fashion-mnist trains a small perceptron on Fashion-MNIST: the
// example trainer that gorovod's elastic layer is built around. It holds only
// the training logic — the data, the model, the step, the reports — and
// leaves the elastic loop to sync.Train: under `gorovod run` it is one worker
// of an elastic job (its gradients averaged across the current world every
// step, its state handed to workers that join; workers may join, leave with
// SIGTERM and die while it trains); started on its own it trains in a world of
// one, for comparison. Its batch order comes from the elastic sampler
// (sync/sampler), and its model keeps parameters, gradients and optimizer
// state as the flat vectors the collectives move; --grad-dtype averages the
// gradients in float16 or bfloat16.
//
//	go build -o /tmp/fmnist ./examples/fashion-mnist
//	gorovod run --np 3 -- /tmp/fmnist --epochs 5 --grad-dtype bfloat16
//	/tmp/fmnist --epochs 5 --json | jq .
package main
