package engine

import (
	"context"
	"fmt"
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
func describe(kind callKind, bufs []collective.Buffer, counts []int, how *gsync.Reduction, root int) description {
	var d description
	d[fieldKind] = int64(kind)
	d[fieldTensors] = int64(len(bufs))
	h := fnv.New64a()
	var word [8]byte
	put := func(v int64) {
		for i := range word {
			word[i] = byte(v >> (8 * i))
		}
		h.Write(word[:])
	}
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
	d[fieldLayout] = int64(h.Sum64() >> 1)
	if how != nil {
		d[fieldOp] = int64(how.Op)
		d[fieldPrescale] = int64(math.Float64bits(how.Prescale))
		d[fieldPostscale] = int64(math.Float64bits(how.Postscale))
	}
	d[fieldRoot] = int64(root)
	return d
}

func (d description) String() string {
	k := callKind(d[fieldKind])
	var b strings.Builder
	b.WriteString(k.String())
	switch k {
	case kindBarrier, kindJoin:
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
// to run (one small allgather on the current world's communicator) and
// returns a *collective.MismatchError naming the first rank whose call
// differs from this one, and what differs, when any does. Every rank
// gathers the same descriptions, so every rank fails the call, and none
// has sent any of its data: the communicator stays as it was.
func agree(ctx context.Context, s *gsync.Session, d description) error {
	return s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
		n := c.Size()
		if n == 1 {
			return nil
		}
		all := make([]int64, numFields*n)
		if err := collective.Allgather(ctx, c, d[:], all); err != nil {
			return err
		}
		for r := range n {
			var theirs description
			copy(theirs[:], all[r*numFields:])
			for f := range theirs {
				if theirs[f] != d[f] {
					return &collective.MismatchError{Peer: r, Field: fieldNames[f], Local: d.String(), Remote: theirs.String()}
				}
			}
		}
		return nil
	})
}
