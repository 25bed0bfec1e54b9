// Command fashion-mnist trains a small perceptron on Fashion-MNIST: the
// example trainer that gorovod's elastic layer is built around. Under
// `gorovod run` it is one worker of an elastic job (package sync): its
// gradients are averaged across the current world every step, its state
// (parameters, optimizer state, step, sampler position) is handed to workers
// that join, and workers may join, leave (SIGTERM) and die while it trains.
// Started on its own it trains as a world of one, for comparison. Its batch
// order comes from the elastic sampler (sync/sampler), and its model keeps
// parameters, gradients and optimizer state as the flat vectors the
// collectives move.
//
//	go build -o /tmp/fmnist ./examples/fashion-mnist
//	gorovod run --np 3 -- /tmp/fmnist --epochs 5
//	/tmp/fmnist --epochs 5 --json | jq .
package main
