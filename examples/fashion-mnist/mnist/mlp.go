package mnist

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// Config describes the network's shape and initialization.
type Config struct {
	// Inputs is the number of input features (784 for 28×28 images).
	Inputs int
	// Hidden is the width of the relu layer.
	Hidden int
	// Classes is the number of outputs.
	Classes int
	// Seed drives the weight initialization: equal seeds give bit-identical
	// initial parameters.
	Seed uint64
}

// DefaultConfig is the example's network: 784 → 128 relu → 10.
func DefaultConfig() Config {
	return Config{Inputs: 28 * 28, Hidden: 128, Classes: Classes, Seed: 1}
}

// SGD holds the optimizer's hyper-parameters. They are passed to every Update
// rather than stored, so the trainer may change them between steps (a learning
// rate schedule, or rescaling when the world size changes).
type SGD struct {
	LR          float32
	Momentum    float32
	WeightDecay float32
}

// ErrShape is wrapped by errors about inputs that do not fit the model.
var ErrShape = errors.New("mnist: input does not fit the model")

// MLP is a 784 → hidden (relu) → 10 perceptron with a softmax cross-entropy
// loss, trained by SGD with momentum. Not safe for concurrent use.
type MLP struct {
	cfg Config

	// params, grads and velocity are the three flat vectors the elastic layer
	// moves; the matrices below are views into params and grads.
	params, grads, velocity []float32

	w1, w2   blas32.General // weights: Inputs×Hidden and Hidden×Classes
	b1, b2   []float32
	gw1, gw2 blas32.General
	gb1, gb2 []float32

	// Per-batch work space, grown to the largest batch seen.
	hidden, logits, dHidden []float32
}

// Result summarizes a batch: the summed (not averaged) loss, so that sums from
// several ranks or batches combine exactly, and the correct predictions.
type Result struct {
	LossSum float64
	Correct int
	N       int
}

// Loss returns the mean loss per sample.
func (r Result) Loss() float64 {
	if r.N == 0 {
		return 0
	}
	return r.LossSum / float64(r.N)
}

// Accuracy returns the fraction of correct predictions.
func (r Result) Accuracy() float64 {
	if r.N == 0 {
		return 0
	}
	return float64(r.Correct) / float64(r.N)
}

// New builds a network with weights drawn from cfg.Seed: He-normal for the
// relu layer (std √(2/Inputs)), Glorot-normal for the output layer
// (std √(2/(Hidden+Classes))), zero biases.
func New(cfg Config) (*MLP, error) {
	if cfg.Inputs < 1 || cfg.Hidden < 1 || cfg.Classes < 2 {
		return nil, fmt.Errorf("mnist: invalid network shape %d → %d → %d", cfg.Inputs, cfg.Hidden, cfg.Classes)
	}
	in, h, c := cfg.Inputs, cfg.Hidden, cfg.Classes
	n := in*h + h + h*c + c
	m := &MLP{
		cfg:      cfg,
		params:   make([]float32, n),
		grads:    make([]float32, n),
		velocity: make([]float32, n),
	}
	m.w1, m.b1, m.w2, m.b2 = layers(m.params, in, h, c)
	m.gw1, m.gb1, m.gw2, m.gb2 = layers(m.grads, in, h, c)

	// The stream comes from math/rand/v2, whose values may change between Go
	// versions; that is fine because the elastic layer broadcasts rank 0's
	// parameters rather than relying on every rank to draw the same ones.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6c70))
	std1 := math.Sqrt(2 / float64(in))
	for i := range m.w1.Data {
		m.w1.Data[i] = float32(rng.NormFloat64() * std1)
	}
	std2 := math.Sqrt(2 / float64(h+c))
	for i := range m.w2.Data {
		m.w2.Data[i] = float32(rng.NormFloat64() * std2)
	}
	return m, nil
}

// layers cuts a flat vector into the layer views, in the order
// W1 (in×h, row-major), b1 (h), W2 (h×c), b2 (c).
func layers(v []float32, in, h, c int) (w1 blas32.General, b1 []float32, w2 blas32.General, b2 []float32) {
	w1 = blas32.General{Rows: in, Cols: h, Stride: h, Data: v[: in*h : in*h]}
	v = v[in*h:]
	b1, v = v[:h:h], v[h:]
	w2 = blas32.General{Rows: h, Cols: c, Stride: c, Data: v[: h*c : h*c]}
	b2 = v[h*c:]
	return w1, b1, w2, b2
}

// Config returns the network's configuration.
func (m *MLP) Config() Config { return m.cfg }

// Params returns the flat parameter vector (W1, b1, W2, b2). It is the model's
// own storage: writing into it (a broadcast from rank 0) changes the model.
func (m *MLP) Params() []float32 { return m.params }

// Grads returns the flat gradient vector, laid out like Params, as left by the
// last ComputeGradients. Update reads it, so an allreduce in place between the
// two is how data-parallel training averages gradients.
func (m *MLP) Grads() []float32 { return m.grads }

// OptimizerState returns the momentum buffer, laid out like Params. A joining
// worker needs it as well as Params to continue bit-identically.
func (m *MLP) OptimizerState() []float32 { return m.velocity }

// ComputeGradients runs forward and backward on a batch (x holds len(labels)
// rows of Inputs features) and overwrites Grads with scale times the sum of the
// per-sample loss gradients. Use scale = 1/len(labels) for the batch mean, or
// 1/global batch on every rank followed by a Sum allreduce for the exact mean
// over a global batch split unevenly; an empty batch leaves zero gradients.
func (m *MLP) ComputeGradients(x []float32, labels []uint8, scale float32) (Result, error) {
	b := len(labels)
	if err := m.checkBatch(x, labels); err != nil {
		return Result{}, err
	}
	clear(m.grads)
	if b == 0 {
		return Result{}, nil
	}
	res, hidden, dLogits := m.forward(x, labels, b, true)
	in, h, c := m.cfg.Inputs, m.cfg.Hidden, m.cfg.Classes

	// Softmax cross-entropy: dLoss/dLogits = softmax − onehot, already in
	// dLogits; apply the caller's scale once here so it reaches every gradient.
	for i := range dLogits {
		dLogits[i] *= scale
	}
	dz := blas32.General{Rows: b, Cols: c, Stride: c, Data: dLogits}
	hm := blas32.General{Rows: b, Cols: h, Stride: h, Data: hidden}
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, hm, dz, 0, m.gw2)
	colSums(m.gb2, dLogits, c)

	m.dHidden = grow(m.dHidden, b*h)
	dh := blas32.General{Rows: b, Cols: h, Stride: h, Data: m.dHidden}
	blas32.Gemm(blas.NoTrans, blas.Trans, 1, dz, m.w2, 0, dh)
	for i, a := range hidden { // relu'(a) is 0 where the unit was off
		if a <= 0 {
			m.dHidden[i] = 0
		}
	}
	xm := blas32.General{Rows: b, Cols: in, Stride: in, Data: x}
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, xm, dh, 0, m.gw1)
	colSums(m.gb1, m.dHidden, h)
	return res, nil
}

// Update applies one SGD step with the current Grads: v ← μ·v + g + λ·w,
// w ← w − lr·v (PyTorch's formulation; weight decay applies to every
// parameter, biases included, as PyTorch does by default).
func (m *MLP) Update(o SGD) {
	for i, g := range m.grads {
		w := m.params[i]
		v := o.Momentum*m.velocity[i] + g + o.WeightDecay*w
		m.velocity[i] = v
		m.params[i] = w - o.LR*v
	}
}

// Evaluate returns the loss and accuracy over a whole set, in batches of
// batch samples (any positive size; 1000 is a good default). It does not touch
// Grads.
func (m *MLP) Evaluate(s *Set, batch int) (Result, error) {
	if s.Features() != m.cfg.Inputs {
		return Result{}, fmt.Errorf("%w: set has %d features, model %d inputs", ErrShape, s.Features(), m.cfg.Inputs)
	}
	if batch < 1 {
		return Result{}, fmt.Errorf("mnist: evaluation batch %d < 1", batch)
	}
	var total Result
	f := s.Features()
	for lo := 0; lo < s.N; lo += batch {
		hi := min(lo+batch, s.N)
		labels := s.Labels[lo:hi]
		if err := m.checkBatch(s.Images[lo*f:hi*f], labels); err != nil {
			return Result{}, err
		}
		r, _, _ := m.forward(s.Images[lo*f:hi*f], labels, hi-lo, false)
		total.LossSum += r.LossSum
		total.Correct += r.Correct
		total.N += r.N
	}
	return total, nil
}

func (m *MLP) checkBatch(x []float32, labels []uint8) error {
	if len(x) != len(labels)*m.cfg.Inputs {
		return fmt.Errorf("%w: %d floats for %d samples of %d inputs", ErrShape, len(x), len(labels), m.cfg.Inputs)
	}
	for i, l := range labels {
		if int(l) >= m.cfg.Classes {
			return fmt.Errorf("%w: label %d of sample %d is not one of %d classes", ErrShape, l, i, m.cfg.Classes)
		}
	}
	return nil
}

// forward computes the hidden activations and the loss of a checked batch of
// b samples. With wantGrad it leaves softmax − onehot in the returned logits
// buffer for the backward pass.
func (m *MLP) forward(x []float32, labels []uint8, b int, wantGrad bool) (res Result, hidden, logits []float32) {
	in, h, c := m.cfg.Inputs, m.cfg.Hidden, m.cfg.Classes
	m.hidden = grow(m.hidden, b*h)
	m.logits = grow(m.logits, b*c)
	hidden, logits = m.hidden, m.logits

	// Bias first, then Gemm with beta = 1 adds the product onto it.
	for r := range b {
		copy(hidden[r*h:(r+1)*h], m.b1)
	}
	xm := blas32.General{Rows: b, Cols: in, Stride: in, Data: x}
	hm := blas32.General{Rows: b, Cols: h, Stride: h, Data: hidden}
	blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, xm, m.w1, 1, hm)
	for i, a := range hidden {
		if a < 0 {
			hidden[i] = 0
		}
	}
	for r := range b {
		copy(logits[r*c:(r+1)*c], m.b2)
	}
	zm := blas32.General{Rows: b, Cols: c, Stride: c, Data: logits}
	blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, hm, m.w2, 1, zm)

	res.N = b
	for r := range b {
		z := logits[r*c : (r+1)*c]
		y := int(labels[r])
		best, zmax := 0, z[0]
		for j, v := range z {
			if v > zmax {
				best, zmax = j, v
			}
		}
		if best == y {
			res.Correct++
		}
		// log-sum-exp shifted by the maximum so exp cannot overflow; summed in
		// float64 because the loss is only reported, never differentiated.
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v - zmax))
		}
		res.LossSum += math.Log(sum) - float64(z[y]-zmax)
		if wantGrad {
			for j, v := range z {
				z[j] = float32(math.Exp(float64(v-zmax)) / sum)
			}
			z[y]--
		}
	}
	return res, hidden, logits
}

// colSums sets dst[j] to the sum of column j of the row-major matrix a with
// len(dst) columns.
func colSums(dst, a []float32, cols int) {
	clear(dst)
	for r := 0; r+cols <= len(a); r += cols {
		for j, v := range a[r : r+cols] {
			dst[j] += v
		}
	}
}

// ParamsSHA256 returns the hex SHA-256 of v's bytes as little-endian float32s:
// a short fingerprint that two processes can print to show their parameters
// are bit-identical.
func ParamsSHA256(v []float32) string {
	h := sha256.New()
	var buf [4096]byte
	for len(v) > 0 {
		n := min(len(v), len(buf)/4)
		for i, f := range v[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
		}
		h.Write(buf[:4*n])
		v = v[n:]
	}
	return hex.EncodeToString(h.Sum(nil))
}
