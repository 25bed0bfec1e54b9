// Command fashion-mnist trains a small perceptron on Fashion-MNIST: the
// example trainer that gorovod's elastic layer is built around. For now it is
// a single process (rank 0 of a world of 1); its batch order already comes
// from the elastic Sampler, and its model keeps parameters, gradients and
// optimizer state as the flat vectors the collectives move.
//
//	go run ./examples/fashion-mnist --epochs 5
//	go run ./examples/fashion-mnist --json | jq .
package main
