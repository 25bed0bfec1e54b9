package sync

import (
	"context"
	"fmt"

	"github.com/gorovod/gorovod/collective"
)

// State is what a new or recovering worker must receive to continue training
// as if nothing happened: the step counter plus everything the trainer
// registers (parameters, optimizer state, the sampler's position, ...).
//
// Registered float32 slices are broadcast in place; blobs are read with get
// before a broadcast and installed with set after one.
type State struct {
	Step    int64
	tensors []namedTensor
	blobs   []namedBlob
}

type namedTensor struct {
	name string
	data []float32
}

type namedBlob struct {
	name string
	get  func() ([]byte, error)
	set  func([]byte) error
}

// NewState returns an empty state at step 0.
func NewState() *State { return &State{} }

// RegisterTensor adds a float32 slice (parameters, momentum buffers) that is
// synchronized in place. Every worker must register the same names, sizes and
// order.
func (s *State) RegisterTensor(name string, data []float32) {
	s.tensors = append(s.tensors, namedTensor{name, data})
}

// RegisterBlob adds opaque state (a sampler position, a learning-rate
// schedule) as bytes.
func (s *State) RegisterBlob(name string, get func() ([]byte, error), set func([]byte) error) {
	s.blobs = append(s.blobs, namedBlob{name, get, set})
}

// broadcast makes every rank's state a copy of root's: the step and blob sizes
// first, so that a mismatch shows as an error rather than misread bytes.
func (s *State) broadcast(ctx context.Context, c *collective.Communicator, root int) error {
	head := make([]int64, 2+len(s.tensors)+len(s.blobs))
	head[0], head[1] = s.Step, int64(len(s.tensors))
	blobs := make([][]byte, len(s.blobs))
	for i, t := range s.tensors {
		head[2+i] = int64(len(t.data))
	}
	for i, b := range s.blobs {
		if c.Rank() == root {
			data, err := b.get()
			if err != nil {
				return fmt.Errorf("sync: reading state %q: %w", b.name, err)
			}
			blobs[i] = data
			head[2+len(s.tensors)+i] = int64(len(data))
		}
	}
	if err := collective.Broadcast(ctx, c, head, root); err != nil {
		return err
	}
	for i, t := range s.tensors {
		if head[2+i] != int64(len(t.data)) {
			return fmt.Errorf("sync: state tensor %q has %d elements here but %d on rank %d", t.name, len(t.data), head[2+i], root)
		}
		if err := collective.Broadcast(ctx, c, t.data, root); err != nil {
			return err
		}
	}
	for i, b := range s.blobs {
		if c.Rank() != root {
			blobs[i] = make([]byte, head[2+len(s.tensors)+i])
		}
		if err := collective.Broadcast(ctx, c, blobs[i], root); err != nil {
			return err
		}
		if c.Rank() != root {
			if err := b.set(blobs[i]); err != nil {
				return fmt.Errorf("sync: installing state %q: %w", b.name, err)
			}
		}
	}
	s.Step = head[0]
	return nil
}
