// Command fashion-mnist trains a small perceptron on Fashion-MNIST: the
// example trainer that gorovod's elastic layer is built around. It holds only
// the training logic — the data, the model, the step, the reports — and
// leaves the elastic loop to sync.Train: under `gorovod run` it trains
// elastically (workers may join, leave or die), alone it trains in a world of
// one. Its model keeps parameters, gradients and optimizer state as the flat
// vectors the collectives move; --grad-dtype averages the gradients in
// float16 or bfloat16.
//
//	go run ./examples/fashion-mnist --epochs 5
//	go run ./examples/fashion-mnist --json | jq .
//	gorovod run --np 3 -- fashion-mnist --epochs 2 --grad-dtype bfloat16
package main
