package fusion

import (
	"context"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"unsafe"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/half"
)

// DefaultBytes is Horovod's fusion buffer size: tensors are packed into
// buckets of up to this many bytes, one allreduce each.
const DefaultBytes = 128 << 20

// Fuser allreduces many tensors as few collectives: it packs them, in order,
// into buckets of at most the threshold's bytes and unpacks the results. A
// model with hundreds of small layers then costs a handful of allreduces
// instead of hundreds of round trips.
//
// A bucket holds one dtype in one kind of memory, as Horovod's fusion buffer
// does: tensors of different dtypes, or in host and device memory, go to
// different buckets (device tensors are packed in device memory, with the
// device's own copies). A tensor as large as the threshold travels alone, in
// place, and so does a bucket that ends up with one tensor. Every rank that
// passes the same list of tensors (dtypes, counts, memory kinds, order) runs
// the same collectives in the same order, so the results are bit-identical on
// every rank. With collective.Adasum each bucket tells the collective where
// its tensors lie (collective.Tensors), so that each is combined with its own
// dot product and norms: fusing does not change the result.
//
// A Fuser is used by one goroutine at a time; its buffers are reused between
// calls. Close frees the device buffers it allocated.
type Fuser struct {
	threshold int // bytes

	// The plan of the call in progress: groups of tensors, each reduced by
	// one collective, in order (members lists their tensors' indices); the
	// buckets still open while planning, one per dtype and memory kind
	// (index bucketIndex), in the order the call first used them.
	groups  []group
	members []int
	open    [2 * numDTypes]bucket
	used    []int

	// The packing buffers, kept between calls.
	host [numDTypes][]uint64 // uint64 words keep every element aligned
	dev  [numDTypes]collective.DeviceMemory

	// For Adasum, which combines tensor by tensor: the element counts of
	// the bucket being reduced, and its options with collective.Tensors
	// added.
	layout []int
	opts   []collective.Option
}

// numDTypes bounds the DType values (1 to 7) so buckets live in arrays, not
// maps: the fuser runs on every training step.
const numDTypes = 8

// group is the tensors members[lo:hi], of one dtype and memory kind, bytes
// in all.
type group struct{ lo, hi, bytes int }

type bucket struct {
	members []int // indices into the call's tensors
	bytes   int
}

// NewFuser returns a fuser with buckets of at most thresholdBytes (<= 0 means
// DefaultBytes).
func NewFuser(thresholdBytes int) *Fuser {
	if thresholdBytes <= 0 {
		thresholdBytes = DefaultBytes
	}
	return &Fuser{threshold: thresholdBytes}
}

// Check reports the first malformed tensor of a list a Fuser would be given
// (an invalid dtype, a negative count, host bytes that do not match the
// count, too little device memory, both or neither kind of memory set), so
// that bad input is refused before any collective starts.
func Check(tensors []collective.Buffer) error {
	for i, t := range tensors {
		if _, err := checkedBytes(t); err != nil {
			return fmt.Errorf("fusion: tensor %d: %w", i, err)
		}
	}
	return nil
}

// checkedBytes returns t's size in bytes, or why t is malformed.
func checkedBytes(t collective.Buffer) (int, error) {
	if t.Device == nil && len(t.Host) > 0 && t.DType.Valid() && len(t.Host) == t.Count*t.DType.Size() {
		return len(t.Host), nil // the usual case, inlined
	}
	return slowCheckedBytes(t)
}

func slowCheckedBytes(t collective.Buffer) (int, error) {
	size := t.DType.Size()
	n := t.Count * size
	switch {
	case size == 0:
		return 0, fmt.Errorf("invalid dtype %v", t.DType)
	case t.Count < 0:
		return 0, fmt.Errorf("negative count %d", t.Count)
	case t.Device != nil && t.Host != nil:
		return 0, errors.New("both host and device memory are set")
	case t.Device != nil && t.Device.Size() < n:
		return 0, fmt.Errorf("%d bytes of device memory cannot hold %d %v elements", t.Device.Size(), t.Count, t.DType)
	case t.Device == nil && len(t.Host) != n:
		return 0, fmt.Errorf("%d host bytes for %d %v elements (want %d)", len(t.Host), t.Count, t.DType, n)
	}
	return n, nil
}

// bucketIndex keys a tensor's bucket by dtype and memory kind.
func bucketIndex(t collective.Buffer) int {
	i := int(t.DType)
	if t.Device != nil {
		i += numDTypes
	}
	return i
}

// Allreduce reduces every tensor across the ranks of c with op (and opts), in
// place. Every rank must pass tensors of the same dtypes, sizes and memory
// kinds in the same order. The tensors are checked (see Check) before any
// collective runs. Device tensors of one call must belong to one device.
func (f *Fuser) Allreduce(ctx context.Context, c *collective.Communicator, tensors []collective.Buffer, op collective.ReduceOp, opts ...collective.Option) error {
	_, err := f.AllreduceExtra(ctx, c, tensors, nil, op, opts...)
	return err
}

// AllreduceExtra is Allreduce with a few scalars riding along at no extra
// collective: the extras are appended, converted to the bucket's dtype, to
// one host bucket of floating-point tensors, reduced with it (op and opts
// apply to them too), and on success overwritten with the reduced values.
// The carrier is the same on every rank that passes the same tensors: a
// float64 or float32 bucket that is packed anyway if there is one, else the
// smallest such tensor (then packed rather than reduced in place), else the
// same among float16 and bfloat16 tensors, whose precision the extras then
// have. carried is false, and the extras untouched, when no host tensor has
// a floating-point dtype.
func (f *Fuser) AllreduceExtra(ctx context.Context, c *collective.Communicator, tensors []collective.Buffer, extras []float64, op collective.ReduceOp, opts ...collective.Option) (carried bool, err error) {
	if len(tensors) == 1 && len(extras) == 0 {
		if err := Check(tensors); err != nil {
			return false, err
		}
		return false, c.Allreduce(ctx, tensors[0], tensors[0], op, opts...)
	}
	if err := f.plan(tensors); err != nil {
		return false, err
	}
	carrier := -1
	if len(extras) > 0 {
		carrier = f.carrier(tensors)
	}
	for i, g := range f.groups {
		members := f.members[g.lo:g.hi]
		var err error
		switch {
		case i == carrier:
			err = f.hostBucket(ctx, c, tensors, members, g.bytes, extras, op, opts)
		case len(members) == 1:
			t := tensors[members[0]]
			err = c.Allreduce(ctx, t, t, op, opts...)
		case tensors[members[0]].Device != nil:
			err = f.deviceBucket(ctx, c, tensors, members, g.bytes, op, opts)
		default:
			err = f.hostBucket(ctx, c, tensors, members, g.bytes, nil, op, opts)
		}
		if err != nil {
			return false, err
		}
	}
	return carrier >= 0, nil
}

// carrier picks the planned group that carries the extras (-1: none): host
// memory of a floating-point dtype; float64 and float32 before the 16-bit
// types, a bucket that is packed anyway before a tensor travelling alone,
// the smallest of those, the first of equals. It depends only on the
// tensors' dtypes, sizes and memory kinds, so every rank picks the same.
func (f *Fuser) carrier(tensors []collective.Buffer) int {
	best, bestKey := -1, [3]int{}
	for i, g := range f.groups {
		t := tensors[f.members[g.lo]]
		if t.Device != nil || !t.DType.IsFloat() {
			continue
		}
		low, alone, size := 0, 0, 0
		if t.DType == collective.Float16 || t.DType == collective.BFloat16 {
			low = 1
		}
		if g.hi-g.lo == 1 {
			alone, size = 1, g.bytes
		}
		key := [3]int{low, alone, size}
		if best < 0 || lessKey(key, bestKey) {
			best, bestKey = i, key
		}
	}
	return best
}

func lessKey(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// plan checks the tensors and groups them into collectives, in the order
// they will run: a tensor as large as the threshold alone, as it comes; a
// bucket when the next tensor of its dtype and memory kind would overflow it;
// the buckets left at the end in the order of their first tensors.
func (f *Fuser) plan(tensors []collective.Buffer) error {
	f.groups, f.members = f.groups[:0], f.members[:0]
	for _, k := range f.used {
		f.open[k].members, f.open[k].bytes = f.open[k].members[:0], 0
	}
	f.used = f.used[:0]
	for i, t := range tensors {
		n, err := checkedBytes(t)
		if err != nil {
			return fmt.Errorf("fusion: tensor %d: %w", i, err)
		}
		if n >= f.threshold {
			f.members = append(f.members, i)
			f.groups = append(f.groups, group{len(f.members) - 1, len(f.members), n})
			continue
		}
		k := bucketIndex(t)
		b := &f.open[k]
		if len(b.members) == 0 && !slices.Contains(f.used, k) {
			f.used = append(f.used, k)
		}
		if b.bytes+n > f.threshold {
			f.close(b)
		}
		b.members = append(b.members, i)
		b.bytes += n
	}
	for _, k := range f.used {
		f.close(&f.open[k])
	}
	return nil
}

// close adds bucket b to the plan, if it holds tensors, and empties it.
func (f *Fuser) close(b *bucket) {
	if len(b.members) == 0 {
		return
	}
	lo := len(f.members)
	f.members = append(f.members, b.members...)
	f.groups = append(f.groups, group{lo, len(f.members), b.bytes})
	b.members, b.bytes = b.members[:0], 0
}

// hostBucket packs the members' bytes, and the extras after them, into one
// host buffer, reduces it, and unpacks the results.
func (f *Fuser) hostBucket(ctx context.Context, c *collective.Communicator, tensors []collective.Buffer, members []int, total int, extras []float64, op collective.ReduceOp, opts []collective.Option) error {
	dt := tensors[members[0]].DType
	all := total + len(extras)*dt.Size()
	words := (all + 7) / 8
	if cap(f.host[dt]) < words {
		f.host[dt] = make([]uint64, words)
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f.host[dt][:words]))), all)
	off := 0
	for _, i := range members {
		off += copy(buf[off:], tensors[i].Host)
	}
	encodeExtras(dt, buf[total:], extras)
	fused := collective.Buffer{DType: dt, Count: all / dt.Size(), Host: buf}
	opts = f.withLayout(tensors, members, len(extras), op, opts)
	if err := c.Allreduce(ctx, fused, fused, op, opts...); err != nil {
		return err
	}
	decodeExtras(dt, buf[total:], extras)
	off = 0
	for _, i := range members {
		off += copy(tensors[i].Host, buf[off:])
	}
	return nil
}

func (f *Fuser) deviceBucket(ctx context.Context, c *collective.Communicator, tensors []collective.Buffer, members []int, total int, op collective.ReduceOp, opts []collective.Option) error {
	first := tensors[members[0]]
	dt := first.DType
	if f.dev[dt] == nil || f.dev[dt].Size() < total {
		size := total
		if f.dev[dt] != nil {
			// Grow geometrically (up to the threshold, the largest bucket)
			// so that a few calls settle on one allocation.
			size = max(total, min(2*f.dev[dt].Size(), f.threshold))
			_ = f.dev[dt].Free()
			f.dev[dt] = nil
		}
		m, err := first.Device.Alloc(ctx, size)
		if err != nil {
			return fmt.Errorf("fusion: allocating a %v fusion buffer on the device: %w", dt, err)
		}
		f.dev[dt] = m
	}
	scratch := f.dev[dt]
	off := 0
	for _, i := range members {
		t := tensors[i]
		if err := scratch.CopyFrom(ctx, off, t.Device, 0, t.Bytes()); err != nil {
			return fmt.Errorf("fusion: packing tensor %d: %w", i, err)
		}
		off += t.Bytes()
	}
	fused := collective.Buffer{DType: dt, Count: total / dt.Size(), Device: scratch}
	opts = f.withLayout(tensors, members, 0, op, opts)
	if err := c.Allreduce(ctx, fused, fused, op, opts...); err != nil {
		return err
	}
	off = 0
	for _, i := range members {
		t := tensors[i]
		if err := t.Device.CopyFrom(ctx, 0, scratch, off, t.Bytes()); err != nil {
			return fmt.Errorf("fusion: unpacking tensor %d: %w", i, err)
		}
		off += t.Bytes()
	}
	return nil
}

// withLayout returns opts, with, for Adasum, collective.Tensors giving the
// members' element counts (and the extras' as one more tensor).
func (f *Fuser) withLayout(tensors []collective.Buffer, members []int, extras int, op collective.ReduceOp, opts []collective.Option) []collective.Option {
	if op != collective.Adasum {
		return opts
	}
	f.layout = f.layout[:0]
	for _, i := range members {
		f.layout = append(f.layout, tensors[i].Count)
	}
	if extras > 0 {
		f.layout = append(f.layout, extras)
	}
	f.opts = append(append(f.opts[:0], opts...), collective.Tensors(f.layout))
	return f.opts
}

// Close frees the device fusion buffers. The Fuser may be used again
// afterwards (it allocates anew).
func (f *Fuser) Close() error {
	var errs []error
	for i, m := range f.dev {
		if m != nil {
			errs = append(errs, m.Free())
			f.dev[i] = nil
		}
	}
	return errors.Join(errs...)
}

// ErrQueueClosed is returned for work submitted to an AsyncReducer after Close.
var ErrQueueClosed = errors.New("fusion: async reducer closed")

// AsyncReducer lets a trainer hand gradients over as soon as each is computed
// (during the backward pass) and wait for all of them at the end of the step:
// submissions run in order on one background goroutine, so the communication
// of early layers overlaps the computation of later ones.
type AsyncReducer struct {
	comm  *collective.Communicator
	fuser *Fuser
	op    collective.ReduceOp
	opts  []collective.Option
	work  chan *Pending
	done  chan struct{}
	once  stdsync.Once
}

// Pending is one submitted group of tensors.
type Pending struct {
	ctx     context.Context
	tensors []collective.Buffer
	err     error
	ready   chan struct{}
}

// Wait returns once the tensors are reduced (or the context ends) and reports
// the group's error.
func (p *Pending) Wait(ctx context.Context) error {
	select {
	case <-p.ready:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewAsyncReducer starts the background goroutine for c. Close stops it.
func NewAsyncReducer(c *collective.Communicator, fusionBytes int, op collective.ReduceOp, opts ...collective.Option) *AsyncReducer {
	a := &AsyncReducer{
		comm: c, fuser: NewFuser(fusionBytes), op: op, opts: opts,
		work: make(chan *Pending, 1024), done: make(chan struct{}),
	}
	go a.loop()
	return a
}

// Submit queues tensors for an in-place allreduce; their memory must not be
// touched until the returned Pending is done. Every rank must submit the same
// dtypes and sizes in the same order.
func (a *AsyncReducer) Submit(ctx context.Context, tensors ...collective.Buffer) *Pending {
	p := &Pending{ctx: ctx, tensors: tensors, ready: make(chan struct{})}
	select {
	case <-a.done:
		p.err = ErrQueueClosed
		close(p.ready)
		return p
	default:
	}
	select {
	case a.work <- p:
	case <-a.done:
		p.err = ErrQueueClosed
		close(p.ready)
	case <-ctx.Done():
		p.err = ctx.Err()
		close(p.ready)
	}
	return p
}

func (a *AsyncReducer) loop() {
	var failed error
	for {
		select {
		case p := <-a.work:
			if failed != nil {
				// The collectives after a failure cannot run on a spent
				// communicator: fail the rest of the queue with the cause.
				p.err = fmt.Errorf("fusion: an earlier submission failed: %w", failed)
			} else if p.err = a.fuser.Allreduce(p.ctx, a.comm, p.tensors, a.op, a.opts...); p.err != nil && a.comm.Err() != nil {
				failed = p.err // not a malformed submission: the communicator is spent
			}
			close(p.ready)
		case <-a.done:
			_ = a.fuser.Close()
			return
		}
	}
}

// Close stops the background goroutine. Submissions still queued fail with
// ErrQueueClosed; one already running finishes first.
func (a *AsyncReducer) Close() {
	a.once.Do(func() { close(a.done) })
	for {
		select {
		case p := <-a.work:
			p.err = ErrQueueClosed
			close(p.ready)
		default:
			return
		}
	}
}

// encodeExtras writes the extras as elements of the floating-point dtype dt
// into b (native byte order, as the collective reads them), rounding to
// nearest.
func encodeExtras(dt collective.DType, b []byte, extras []float64) {
	if len(extras) == 0 {
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	switch dt {
	case collective.Float64:
		copy(unsafe.Slice((*float64)(p), len(extras)), extras)
	case collective.Float32:
		out := unsafe.Slice((*float32)(p), len(extras))
		for i, v := range extras {
			out[i] = float32(v)
		}
	case collective.Float16, collective.BFloat16:
		narrow := half.F32ToF16
		if dt == collective.BFloat16 {
			narrow = half.F32ToBF16
		}
		out := unsafe.Slice((*uint16)(p), len(extras))
		for i, v := range extras {
			out[i] = narrow(float32(v))
		}
	}
}

// decodeExtras reads the reduced extras back from b.
func decodeExtras(dt collective.DType, b []byte, extras []float64) {
	if len(extras) == 0 {
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	switch dt {
	case collective.Float64:
		copy(extras, unsafe.Slice((*float64)(p), len(extras)))
	case collective.Float32:
		for i, v := range unsafe.Slice((*float32)(p), len(extras)) {
			extras[i] = float64(v)
		}
	case collective.Float16, collective.BFloat16:
		widen := half.F16ToF32
		if dt == collective.BFloat16 {
			widen = half.BF16ToF32
		}
		for i, v := range unsafe.Slice((*uint16)(p), len(extras)) {
			extras[i] = float64(widen(v))
		}
	}
}
