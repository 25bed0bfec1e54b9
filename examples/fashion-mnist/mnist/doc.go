// Package mnist holds the model and data of gorovod's Fashion-MNIST example
// trainer: a reader for the IDX files the Debian package dataset-fashion-mnist
// ships, a generated stand-in for machines without it (Generate;
// LoadOrGenerate uses it, and says so, only when the package's own directory
// is missing), and a one-hidden-layer perceptron (784 → hidden relu → 10,
// softmax cross-entropy) trained by SGD with momentum.
//
// The model keeps its parameters, its gradients and its optimizer state each
// in one contiguous []float32 (per-layer weights are views into it), because
// that is what data-parallel training moves: the elastic layer allreduces
// Grads() every step and broadcasts Params() and OptimizerState() to a worker
// that joins. ComputeGradients takes an explicit scale so that ranks holding
// unequal shares of a global batch still produce the exact global mean
// gradient with a plain Sum allreduce (scale = 1/global batch).
//
// Results are deterministic: the same seed and the same batches give
// bit-identical parameters (ParamsSHA256 makes that easy to compare across
// processes).
package mnist
