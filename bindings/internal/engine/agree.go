package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"math"
	"strings"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// A call's description, which every rank compares with every other's before
// the call moves any data (Engine.agree). The collectives compare their own
// frames' headers too, but a difference found there leaves the communicator
// spent, and only the world's rebuild (a world change the trainer must
// recover from) makes the next collective possible; some differences (a
// broadcast that each rank calls with itself as the root, scale factors)
// they never see. A difference found here fails the call on every rank with
// a *collective.MismatchError, before anything was sent, and the next call
// runs as if it had never been made — as Horovod reports a mismatched
// request and goes on.

// callKind names a call's collective in its description.
type callKind int64

const (
	kindAllreduce callKind = iota + 1
	kindBroadcast
	kindAllgather
	kindAlltoall
	kindReduceScatter
	kindBarrier
	kindJoin
	kindAddSet
	kindRemoveSet
)

func (k callKind) String() string {
	switch k {
	case kindAllreduce:
		return "allreduce"
	case kindBroadcast:
		return "broadcast"
	case kindAllgather:
		return "allgather"
	case kindAlltoall:
		return "alltoall"
	case kindReduceScatter:
		return "reducescatter"
	case kindBarrier:
		return "barrier"
	case kindJoin:
		return "join"
	case kindAddSet:
		return "add process set"
	case kindRemoveSet:
		return "remove process set"
	}
	return fmt.Sprintf("call kind %d", int64(k))
}

// The fields of a description, in the order they are compared: the first
// that differs is the one an error names.
const (
	fieldKind = iota
	fieldTensors
	fieldDType
	fieldCount
	fieldTotal
	fieldLayout
	fieldShape
	fieldOp
	fieldRoot
	fieldPrescale
	fieldPostscale
	numFields
)

var fieldNames = [numFields]string{
	fieldKind:      "collective",
	fieldTensors:   "number of tensors",
	fieldDType:     "dtype",
	fieldCount:     "element count",
	fieldTotal:     "element count",
	fieldLayout:    "dtypes and element counts of the tensors",
	fieldShape:     "tensor shapes",
	fieldOp:        "reduce op",
	fieldRoot:      "root rank",
	fieldPrescale:  "prescale factor",
	fieldPostscale: "postscale factor",
}

// description is what every rank must agree on about one call.
type description [numFields]int64

// describe returns the description of a call of kind on bufs: their
// number, the first one's dtype and element count, the total count and a
// digest of every buffer's dtype and count (the per-rank counts of the
// calls every rank passes alike, for allgather and reducescatter), and the
// reduction's op and factors where the call reduces.
//
// Every description carries a digest of its tensors' shapes (shapeDigest;
// a tensor without a shape is one dimension of its element count), so that
// an allreduce of 17×1311 elements on one rank meets 17×23×57 on another as
// a mismatch, as in Horovod, though the element counts are equal.
func describe(kind callKind, bufs []collective.Buffer, counts []int, how *gsync.Reduction, root int) description {
	return describeShaped(kind, bufs, nil, counts, how, root)
}

// describeShaped is describe of tensors of the given shapes (nil: each one
// dimension of its element count).
func describeShaped(kind callKind, bufs []collective.Buffer, shapes [][]int64, counts []int, how *gsync.Reduction, root int) description {
	var d description
	d[fieldKind] = int64(kind)
	d[fieldTensors] = int64(len(bufs))
	var h digest63
	put := h.put
	for i, b := range bufs {
		if i == 0 {
			d[fieldDType], d[fieldCount] = int64(b.DType), int64(b.Count)
		}
		d[fieldTotal] += int64(b.Count)
		put(int64(b.DType))
		put(int64(b.Count))
	}
	for _, n := range counts {
		put(int64(n))
	}
	d[fieldLayout] = h.sum()
	d[fieldShape] = shapeDigest(bufs, shapes)
	if how != nil {
		d[fieldOp] = int64(how.Op)
		// +0: -0's bits are MinInt64, which has no negation (allAgree).
		d[fieldPrescale] = int64(math.Float64bits(how.Prescale + 0))
		d[fieldPostscale] = int64(math.Float64bits(how.Postscale + 0))
	}
	d[fieldRoot] = int64(root)
	return d
}

// digest63 hashes a sequence of int64s (FNV-1a over their little-endian
// bytes) into a 63-bit digest, which a description field holds without a
// sign (allAgree negates fields).
type digest63 struct{ h hash.Hash64 }

func (d *digest63) put(v int64) {
	if d.h == nil {
		d.h = fnv.New64a()
	}
	var word [8]byte
	binary.LittleEndian.PutUint64(word[:], uint64(v))
	d.h.Write(word[:])
}

func (d *digest63) sum() int64 {
	if d.h == nil {
		d.h = fnv.New64a()
	}
	return int64(d.h.Sum64() >> 1)
}

// shapeDigest is a 63-bit digest of the tensors' shapes: shapes[i] is
// bufs[i]'s, or, where shapes is nil, the one dimension of its count.
func shapeDigest(bufs []collective.Buffer, shapes [][]int64) int64 {
	var h digest63
	put := h.put
	for i, b := range bufs {
		if shapes == nil {
			put(1)
			put(int64(b.Count))
			continue
		}
		put(int64(len(shapes[i])))
		for _, n := range shapes[i] {
			put(n)
		}
	}
	return h.sum()
}

func (d description) String() string {
	k := callKind(d[fieldKind])
	var b strings.Builder
	b.WriteString(k.String())
	switch k {
	case kindBarrier, kindJoin:
		return b.String()
	case kindAddSet:
		fmt.Fprintf(&b, " of %d ranks (digest %x)", d[fieldTensors], d[fieldLayout])
		return b.String()
	case kindRemoveSet:
		fmt.Fprintf(&b, " %d", d[fieldRoot])
		return b.String()
	}
	fmt.Fprintf(&b, " of %d tensor(s) (the first %d × %v, %d elements in all", d[fieldTensors], d[fieldCount],
		collective.DType(d[fieldDType]), d[fieldTotal])
	switch k {
	case kindAllreduce, kindReduceScatter:
		fmt.Fprintf(&b, ", %v, prescale %v, postscale %v", collective.ReduceOp(d[fieldOp]),
			math.Float64frombits(uint64(d[fieldPrescale])), math.Float64frombits(uint64(d[fieldPostscale])))
	case kindBroadcast:
		fmt.Fprintf(&b, ", root %d", d[fieldRoot])
	}
	b.WriteString(")")
	return b.String()
}

// agree compares d with every rank's description of the call it is about
// to run (one small allreduce on the call's communicator, on, the world's or
// a process set's, and an
// allgather of the descriptions when they differ) and
// returns a *collective.MismatchError naming the first rank whose call
// differs from this one, and what differs, when any does. Every rank
// gathers the same descriptions, so every rank fails the call, and none
// has sent any of its data: the communicator stays as it was.
//
// Ranks inside Join take part as joined ranks (joinServe): an allreduce of
// the others runs with their zeros, after the lowest of the calling ranks
// has sent them its tensors' layout (layout: dtype and element count of
// each); any other call fails on the calling ranks, as in Horovod.
func agree(ctx context.Context, on runOn, d description, layout []int64) error {
	return on(ctx, func(ctx context.Context, c *collective.Communicator) error {
		all, err := gatherDescriptions(ctx, c, d)
		if err != nil || all == nil {
			return err
		}
		active, joined := splitJoined(all)
		for _, r := range active {
			if f := differs(all[r], d); f >= 0 {
				return &collective.MismatchError{Peer: r, Field: fieldNames[f], Local: d.String(), Remote: all[r].String()}
			}
		}
		if len(joined) == 0 {
			return nil
		}
		if callKind(d[fieldKind]) != kindAllreduce {
			return &collective.MismatchError{Peer: joined[0], Field: "collective (a rank that joined serves only allreduce)",
				Local: d.String(), Remote: all[joined[0]].String()}
		}
		_, err = shareLayout(ctx, c, active[0], layout)
		return err
	})
}

// allAgree reports whether every rank's description is d, in one small
// allreduce: the minimum of (d, -d) across the ranks is (d, -d) exactly
// when no rank's field is below or above this one's. Every field is
// above MinInt64, so each negation is exact. It is the common case's
// cost: an allreduce of 160 bytes, which runs on the calling goroutine.
func allAgree(ctx context.Context, c *collective.Communicator, d description) (bool, error) {
	var both [2 * numFields]int64
	for f, v := range d {
		both[f], both[numFields+f] = v, -v
	}
	if err := collective.Allreduce(ctx, c, both[:], both[:], collective.Min); err != nil {
		return false, err
	}
	for f, v := range d {
		if both[f] != v || both[numFields+f] != -v {
			return false, nil
		}
	}
	return true, nil
}

// gatherDescriptions returns every rank's description (nil alone), or
// nil when they are all d (allAgree); only when some differ are they
// gathered.
func gatherDescriptions(ctx context.Context, c *collective.Communicator, d description) ([]description, error) {
	n := c.Size()
	if n == 1 {
		return nil, nil
	}
	if same, err := allAgree(ctx, c, d); err != nil || same {
		return nil, err
	}
	flat := make([]int64, numFields*n)
	if err := collective.Allgather(ctx, c, d[:], flat); err != nil {
		return nil, err
	}
	all := make([]description, n)
	for r := range all {
		copy(all[r][:], flat[r*numFields:])
	}
	return all, nil
}

// splitJoined returns the ranks that call something and those inside Join.
func splitJoined(all []description) (active, joined []int) {
	for r, d := range all {
		if callKind(d[fieldKind]) == kindJoin {
			joined = append(joined, r)
		} else {
			active = append(active, r)
		}
	}
	return active, joined
}

// differs returns the first field where a and b differ, or -1.
func differs(a, b description) int {
	for f := range a {
		if a[f] != b[f] {
			return f
		}
	}
	return -1
}

// shareLayout broadcasts root's layout (its length first) and returns it.
func shareLayout(ctx context.Context, c *collective.Communicator, root int, layout []int64) ([]int64, error) {
	n := []int64{int64(len(layout))}
	if err := c.Broadcast(ctx, collective.SliceBuffer(n), root); err != nil {
		return nil, err
	}
	if c.Rank() != root {
		layout = make([]int64, n[0])
	}
	if err := c.Broadcast(ctx, collective.SliceBuffer(layout), root); err != nil {
		return nil, err
	}
	return layout, nil
}

// layoutOf is the layout of an allreduce's buffers that a joined rank
// mirrors: dtype and element count of each.
func layoutOf(bufs []collective.Buffer) []int64 {
	l := make([]int64, 0, 2*len(bufs))
	for _, b := range bufs {
		l = append(l, int64(b.DType), int64(b.Count))
	}
	return l
}

// joinServe is Join's run while the engine compares descriptions: until
// every rank has joined, it takes part in the other ranks' calls, running
// their allreduces with zeros of their layout (so a rank that ran out of
// data can stop while the others finish theirs, as with Horovod's join).
// It returns the rank that joined last: the latest by the wall clock of
// its call (at, nanoseconds), the highest rank of a tie.
func joinServe(ctx context.Context, s *gsync.Session, at int64) (int, error) {
	d := describe(kindJoin, nil, nil, nil, 0)
	d[fieldCount] = at
	for {
		var (
			all    []description
			layout []int64
			how    gsync.Reduction
		)
		err := s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			var err error
			if all, err = gatherDescriptions(ctx, c, d); err != nil || all == nil {
				return err
			}
			active, _ := splitJoined(all)
			if len(active) == 0 {
				return nil
			}
			// What the calling ranks decide, from the same table: they
			// go on only with an allreduce they all agree on.
			first := all[active[0]]
			for _, r := range active[1:] {
				if differs(all[r], first) >= 0 {
					return nil
				}
			}
			if callKind(first[fieldKind]) != kindAllreduce {
				return nil
			}
			how = gsync.Reduction{Op: collective.ReduceOp(first[fieldOp]),
				Prescale:  math.Float64frombits(uint64(first[fieldPrescale])),
				Postscale: math.Float64frombits(uint64(first[fieldPostscale]))}
			layout, err = shareLayout(ctx, c, active[0], nil)
			return err
		})
		if err != nil {
			return -1, err
		}
		if all == nil {
			// Alone, or every rank's description is this one's: every
			// rank joined, at the same nanosecond; the highest rank is
			// the last of a tie.
			return len(s.World().Members) - 1, nil
		}
		if active, _ := splitJoined(all); len(active) == 0 {
			last := 0
			for r, theirs := range all {
				if theirs[fieldCount] >= all[last][fieldCount] {
					last = r
				}
			}
			return last, nil
		}
		if layout == nil {
			continue
		}
		bufs := make([]collective.Buffer, len(layout)/2)
		for i := range bufs {
			dt, count := collective.DType(layout[2*i]), int(layout[2*i+1])
			bufs[i] = collective.Buffer{DType: dt, Count: count, Host: make([]byte, count*dt.Size())}
		}
		if err := s.Allreduce(ctx, how, bufs...); err != nil {
			return -1, err
		}
	}
}
