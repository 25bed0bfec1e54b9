package collective

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Config tunes a Communicator. A zero field means its default
// (DefaultConfig). Every rank of a world must use the same SmallMessageBytes,
// HierarchicalBytes, HierarchicalPieceBytes, Algorithm, AllgatherAlgorithm and
// ChunkBytes: they
// decide the algorithm and the framing, and a difference is reported as a
// mismatch.
type Config struct {
	// SmallMessageBytes: an allreduce or broadcast of at most this many bytes uses
	// the latency-optimal algorithm (recursive doubling, binomial tree); larger
	// ones the bandwidth-optimal pipelined ring or chain. Negative: none does.
	SmallMessageBytes int
	// HierarchicalBytes: with Algorithm auto, an allreduce larger than
	// SmallMessageBytes and of at least this many bytes runs the
	// hierarchical algorithm when the world spans several hosts and some
	// host runs more than one rank (see Topology); smaller ones, and every
	// one on a single host, the flat ring. Negative: auto never picks it.
	HierarchicalBytes int
	// Algorithm forces the allreduce algorithm (AlgorithmAuto, the
	// default, chooses per call by size and topology).
	Algorithm Algorithm
	// AllgatherAlgorithm forces the allgather algorithm: AlgorithmAuto
	// (the default: the ring, whose host-adjacent order already moves each
	// host's data over its link once), AlgorithmRing or
	// AlgorithmHierarchical (which needs every host to run the same number
	// of ranks, and runs the ring otherwise).
	AllgatherAlgorithm Algorithm
	// ChunkBytes is the pipelining unit of the ring and chain algorithms
	// (and the frame size and smallest stripe of Replicate). 0 (the
	// default) chooses: DefaultChunkBytes, or on a world of one host whose
	// ranks outnumber its CPUs (transport.HostCPUs) the chunk its
	// transport suggests for that (transport.ChunkHinter: TCP 1 MiB,
	// shared memory none). Leave it at 0 on
	// every rank or set the same size on every rank: a rank that sets
	// 256 KiB next to ranks that choose 1 MiB is a mismatch.
	ChunkBytes int
	// HierarchicalPieceBytes: a hierarchical allreduce of host memory of
	// at least twice this many bytes runs as pieces of about this size (at
	// most 64 of them), so that the transfer between hosts of one piece
	// overlaps the reduce-scatter and allgather inside the host of the
	// next and previous ones. Negative: one piece. Every rank must use the
	// same value.
	HierarchicalPieceBytes int
	// StripeSources is how many holders feed each receiver of Replicate
	// at most; 0 (the default) chooses by the link kinds (see Replicate).
	// Every rank must use the same value.
	StripeSources int
	// AbortTimeout bounds how long a failing rank spends telling its peers why.
	AbortTimeout time.Duration
	// KeepLinksOnFailure: a failed collective tells its peers with an
	// abort frame as always, but leaves the links open instead of closing
	// them, so that Salvage can bring each back to a frame boundary and
	// hand it to the next world (transport.Carry) instead of it being
	// dialled again. The owner must then end the communicator with
	// Salvage, Abort or Close; until it does, a peer blocked sending to
	// this rank stays blocked. Every rank should set it alike: a link is
	// kept only when both its ends salvage it.
	KeepLinksOnFailure bool
	// Logger receives failures; nil discards.
	Logger *slog.Logger
	// Tracer, when set, is told of every collective and its phases (a
	// timeline); nil costs a pointer check.
	Tracer Tracer
	// P2PBufferBytes bounds the bytes of point-to-point messages (Send)
	// that arrived before their receive was posted and are kept until it
	// is; a message over the bound fails the communicator. Only messages
	// of up to 16 KiB are ever kept, and at most 32 KiB of them per peer:
	// others wait for their receive (rendezvous, p2p.go).
	P2PBufferBytes int
	// NewDeviceAllreducer, when set, makes each new communicator's
	// DeviceAllreducer, which then runs its allreduces of device buffers
	// (see DeviceAllreducer). Every rank must set it alike.
	NewDeviceAllreducer func() DeviceAllreducer
}

// ErrInvalidConfig is wrapped by every error about a Config no communicator
// can run with.
var ErrInvalidConfig = errors.New("collective: invalid configuration")

// DefaultConfig returns the settings measured best on loopback TCP.
func DefaultConfig() Config {
	return Config{
		SmallMessageBytes: 64 << 10,
		// Above SmallMessageBytes the hierarchy is never slower than the
		// flat ring in the ring's own cost model: it takes fewer steps
		// (2(L-1) inside the host + 2(H-1) across hosts, against 2(HL-1))
		// and puts 2(H-1)/H of the buffer on each host's link against the
		// ring's 2(HL-1)/HL, as long as moving bytes inside a host (shared
		// memory) is cheaper than across.
		HierarchicalBytes:  64 << 10,
		Algorithm:          AlgorithmAuto,
		AllgatherAlgorithm: AlgorithmAuto,
		// 8 MiB: a 64 MiB allreduce runs as 8 pieces, a 256 MiB one as 32,
		// and each piece's stripe is still many ChunkBytes long. Over
		// 1 Gbit/s links, 4 to 32 MiB measured alike within the noise of a
		// busy machine (docs/multihost.md).
		HierarchicalPieceBytes: 8 << 20,
		AbortTimeout:           200 * time.Millisecond,
		P2PBufferBytes:         DefaultP2PBufferBytes,
	}
}

// DefaultChunkBytes is the ring's chunk unless the transport suggests
// another (Config.ChunkBytes).
const DefaultChunkBytes = 256 << 10

// chunkBytes is the chunk a communicator runs with: configured when set;
// otherwise, on a world of one host whose ranks outnumber its CPUs, the
// chunk every link suggests for that case; else DefaultChunkBytes. Every
// rank decides alike, as the framing needs: the ranks of one host see the
// same world and the same CPUs (ranks on different hosts might not, so a
// world across hosts keeps the default). hints holds each link's
// (0: none, or not a transport.ChunkHinter).
func chunkBytes(configured, hosts, localRanks, hostCPUs int, hints []int) int {
	if configured != 0 {
		return configured
	}
	if hosts != 1 || localRanks <= hostCPUs || len(hints) == 0 {
		return DefaultChunkBytes
	}
	for _, h := range hints {
		if h != hints[0] {
			return DefaultChunkBytes
		}
	}
	if hints[0] < 64 || hints[0] > transport.MaxPayload {
		return DefaultChunkBytes
	}
	return hints[0]
}

// chunkHints is what each link (but the nil one, this rank's) suggests for
// an oversubscribed world.
func chunkHints(links []transport.Link) []int {
	var hints []int
	for _, l := range links {
		if l == nil {
			continue
		}
		h := 0
		if ch, ok := l.(transport.ChunkHinter); ok {
			h = ch.OversubscribedChunkBytes()
		}
		hints = append(hints, h)
	}
	return hints
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.SmallMessageBytes == 0 {
		c.SmallMessageBytes = d.SmallMessageBytes
	}
	if c.HierarchicalBytes == 0 {
		c.HierarchicalBytes = d.HierarchicalBytes
	}
	if c.HierarchicalPieceBytes == 0 {
		c.HierarchicalPieceBytes = d.HierarchicalPieceBytes
	}
	if c.Algorithm == "" {
		c.Algorithm = d.Algorithm
	}
	if c.AllgatherAlgorithm == "" {
		c.AllgatherAlgorithm = d.AllgatherAlgorithm
	}
	if c.AbortTimeout == 0 {
		c.AbortTimeout = d.AbortTimeout
	}
	if c.P2PBufferBytes == 0 {
		c.P2PBufferBytes = d.P2PBufferBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports settings no communicator can run with (zero fields take
// the defaults, which are valid), as errors wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.ChunkBytes != 0 && c.ChunkBytes < 64 {
		return fmt.Errorf("%w: ChunkBytes %d is below 64", ErrInvalidConfig, c.ChunkBytes)
	}
	if c.ChunkBytes > transport.MaxPayload {
		return fmt.Errorf("%w: ChunkBytes %d is over the frame limit %d", ErrInvalidConfig, c.ChunkBytes, transport.MaxPayload)
	}
	if c.StripeSources < 0 {
		return fmt.Errorf("%w: StripeSources %d is negative", ErrInvalidConfig, c.StripeSources)
	}
	if c.AbortTimeout < 0 {
		return fmt.Errorf("%w: AbortTimeout %v is negative", ErrInvalidConfig, c.AbortTimeout)
	}
	if c.P2PBufferBytes < 0 {
		return fmt.Errorf("%w: P2PBufferBytes %d is negative", ErrInvalidConfig, c.P2PBufferBytes)
	}
	if _, err := ParseAlgorithm(string(c.Algorithm)); err != nil {
		return fmt.Errorf("%w: Algorithm: %v", ErrInvalidConfig, err)
	}
	switch a, err := ParseAlgorithm(string(c.AllgatherAlgorithm)); {
	case err != nil:
		return fmt.Errorf("%w: AllgatherAlgorithm: %v", ErrInvalidConfig, err)
	case a == AlgorithmRecursiveDoubling:
		return fmt.Errorf("%w: AllgatherAlgorithm %q: allgather runs auto, ring or hierarchical", ErrInvalidConfig, c.AllgatherAlgorithm)
	}
	return nil
}

// Communicator runs collectives among the ranks of one world: a fixed, ordered
// group of workers at one membership epoch.
//
// Collectives on one Communicator run one at a time, in the same order on every
// rank. When a collective fails — a peer died, froze, closed, sent a mismatched
// frame, or the context ended — the communicator tells its peers why, closes its
// links and refuses further work: a world whose streams are out of step cannot be
// repaired in place, so the caller builds the next one (the elastic layer does
// this per epoch). Abort stops it from another goroutine.
type Communicator struct {
	cfg   Config
	world transport.World
	topo  Topology
	grp   groups
	// algorithm and allgatherAlgo are cfg's, parsed.
	algorithm, allgatherAlgo Algorithm
	links                    []transport.Link
	// inPlace[i] is links[i] when it can hand payloads over in place, else nil.
	inPlace []transport.InPlaceLink
	log     *slog.Logger
	// devReduce runs allreduces of device buffers (Config.NewDeviceAllreducer);
	// devReduceClose closes it once.
	devReduce      DeviceAllreducer
	devReduceClose sync.Once

	opMu sync.Mutex // held for the duration of one collective
	// linkMu is held for the duration of one collective by this
	// communicator and by every subset communicator over its links
	// (Subset): frames of two collectives must never interleave on a link.
	linkMu *sync.Mutex
	// parent is the communicator whose links a subset communicator runs
	// on (nil for one that owns its links), and members the parent's rank
	// of each of its ranks.
	parent  *Communicator
	members []int
	// p2p is the point-to-point state of the links (p2p.go), shared like
	// linkMu.
	p2p *p2pState
	// seqBase is added to every collective's sequence number in its
	// frames: a subset's calls can never be taken for the parent's, or
	// another subset's, on a shared link.
	seqBase uint64
	seq     uint64
	// adasumHost is the host copy an Adasum allreduce of device memory
	// works in.
	adasumHost []byte
	work       []byte // host working space (reduce-scatter)
	// sendBroken marks links whose last send failed part-way: the peer's stream
	// may hold half a frame, so no abort frame may follow on it.
	sendBroken []bool
	// abortSent[r]: this rank's abort frame went whole onto the link to
	// rank r, the last frame this world sends on it; abortSeen[r]: rank
	// r's abort frame was read off its link, the last frame it sends
	// (Salvage reads up to it).
	abortSent []atomic.Bool
	abortSeen []atomic.Bool

	stateMu sync.Mutex
	failure error // the first failure; every later collective returns it
	// handed[r]: the link to rank r was handed over by Release, and
	// closing the communicator leaves it open (guarded by stateMu).
	handed []bool

	tracer   Tracer
	started  atomic.Uint64         // collectives begun (seq), for Progress
	inflight atomic.Pointer[opRun] // the collective running, for Progress

	// State kept from collective to collective (opMu), so that one of a
	// shape already run allocates nothing.
	op   opRun
	octx *opContext
	// lane runs the collectives' steps: its helper goroutine sends while
	// the caller's goroutine receives. crossLane is a second one, and
	// driver the goroutine that runs it, for the hierarchical allreduce's
	// steps between hosts while the caller's goroutine runs those inside
	// the host (hierarchical.go).
	lane
	crossLane lane
	driver    *helper
	hierPipe  *hierPipe
	sendHdr   []transport.Header // per peer: the frame header being sent
	recvHdr   []transport.Header // per peer: the frame header being received
	plan      segPlan            // the running collective's layout
	plan2     segPlan            // and a second one (alltoall's receive side)
	counts    []int              // the running collective's per-rank counts, when it makes them
	hier      hierState
}

// New connects the ranks of w through t and returns the communicator.
func New(ctx context.Context, t transport.Transport, w transport.World, cfg Config) (*Communicator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	links, err := t.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	return NewFromLinks(w, links, cfg)
}

// NewFromLinks builds a communicator over links already connected for w (one per
// rank, nil at w.Rank). The communicator owns the links from then on.
func NewFromLinks(w transport.World, links []transport.Link, cfg Config) (*Communicator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if len(links) != w.Size() {
		return nil, fmt.Errorf("collective: %d links for a world of %d ranks", len(links), w.Size())
	}
	for i, l := range links {
		if (l == nil) != (i == w.Rank) {
			return nil, fmt.Errorf("collective: link for rank %d is missing or unexpected", i)
		}
		if l != nil && l.Peer() != i {
			return nil, fmt.Errorf("collective: link at index %d leads to rank %d", i, l.Peer())
		}
	}
	log := cfg.Logger
	algorithm, _ := ParseAlgorithm(string(cfg.Algorithm))
	allgatherAlgo, _ := ParseAlgorithm(string(cfg.AllgatherAlgorithm))
	topo := topologyOf(w)
	if cfg.ChunkBytes == 0 {
		cfg.ChunkBytes = chunkBytes(0, topo.NumHosts(), topo.LocalSize, transport.HostCPUs(), chunkHints(links))
	}
	inPlace := make([]transport.InPlaceLink, len(links))
	for i, l := range links {
		inPlace[i], _ = l.(transport.InPlaceLink)
	}
	c := &Communicator{
		cfg:           cfg,
		world:         w,
		topo:          topo,
		grp:           newGroups(topo, w.Rank),
		algorithm:     algorithm,
		allgatherAlgo: allgatherAlgo,
		links:         links,
		inPlace:       inPlace,
		log:           log.With("rank", w.Rank, "epoch", w.Epoch),
		sendBroken:    make([]bool, len(links)),
		abortSent:     make([]atomic.Bool, len(links)),
		abortSeen:     make([]atomic.Bool, len(links)),
		tracer:        cfg.Tracer,
		octx:          newOpContext(),
		driver:        newHelper(),
		hierPipe:      newHierPipe(),
		sendHdr:       make([]transport.Header, len(links)),
		recvHdr:       make([]transport.Header, len(links)),
		linkMu:        new(sync.Mutex),
	}
	c.p2p = newP2PState(len(links), cfg.P2PBufferBytes, c.p2pFail)
	c.op.c = c
	c.lane.init(&c.op)
	c.crossLane.init(&c.op)
	if cfg.NewDeviceAllreducer != nil {
		c.devReduce = cfg.NewDeviceAllreducer()
	}
	c.log.Debug("collective: ring chunk", "bytes", cfg.ChunkBytes)
	if c.allgatherAlgo == AlgorithmHierarchical && topo.NumHosts() > 1 && !topo.Uniform() {
		c.log.Info("hierarchical allgather needs the same number of ranks on every host; allgather runs the ring", "hosts", topo.NumHosts())
	}
	// The helper goroutine references none of c, so a communicator dropped
	// without Close still becomes garbage, and this stops its helper.
	runtime.AddCleanup(c, (*helper).stop, c.helper)
	runtime.AddCleanup(c, (*helper).stop, c.crossLane.helper)
	runtime.AddCleanup(c, (*helper).stop, c.driver)
	return c, nil
}

// Rank is this worker's position in the world.
func (c *Communicator) Rank() int { return c.world.Rank }

// Size is the number of ranks.
func (c *Communicator) Size() int { return c.world.Size() }

// Epoch is the membership epoch the communicator was built for.
func (c *Communicator) Epoch() uint64 { return c.world.Epoch }

// JobID is the job the communicator belongs to.
func (c *Communicator) JobID() string { return c.world.JobID }

// Err returns the failure that stopped the communicator, or nil while it
// works. A subset communicator (Subset) stops with its parent.
func (c *Communicator) Err() error {
	c.stateMu.Lock()
	err := c.failure
	c.stateMu.Unlock()
	if err == nil && c.parent != nil {
		return c.parent.Err()
	}
	return err
}

// Abort stops the communicator from any goroutine: the running collective, if
// any, returns promptly with an error wrapping ErrAborted, and so does every later
// one. Peers see the links close and fail their own collectives. Aborting a
// subset communicator (Subset) aborts its parent: their links are shared.
func (c *Communicator) Abort(cause error) {
	c.setFailure(fmt.Errorf("%w: %v", ErrAborted, cause))
	if c.parent != nil {
		c.parent.Abort(cause)
	}
	c.closeLinks()
}

// Close releases the links and the communicator's helper goroutine. A
// running collective fails; later ones return ErrClosed. Close is idempotent.
// Closing a subset communicator (Subset) leaves its parent's links open.
func (c *Communicator) Close() error {
	c.setFailure(ErrClosed)
	c.closeLinks()
	return c.closeDeviceAllreducer()
}

// closeDeviceAllreducer closes the communicator's DeviceAllreducer, once.
func (c *Communicator) closeDeviceAllreducer() error {
	var err error
	c.devReduceClose.Do(func() {
		if c.devReduce != nil {
			err = c.devReduce.Close()
		}
	})
	return err
}

// Release ends the communicator as Close does, except that the links to
// the ranks r with keep(r) stay open and are returned, indexed by rank, for
// the next world to carry over (transport.Carry); the communicator no
// longer owns them. Only a healthy communicator hands links over: one that
// has failed, or one with a collective running on it or on one of its
// subsets (Subset), closes them all and returns nil, as does a link whose
// last send failed part-way.
//
// The subsets of a released communicator stop with it (their collectives
// return ErrClosed and never touch the handed links again). A subset owns
// no links: releasing one closes it and returns nil.
func (c *Communicator) Release(keep func(rank int) bool) []transport.Link {
	if c.parent != nil {
		c.Close()
		return nil
	}
	// linkMu before opMu, as runTagged takes them: a subset's collective
	// holds the shared linkMu only, and its frames may be on the links.
	if !c.linkMu.TryLock() {
		c.Close()
		return nil
	}
	defer c.linkMu.Unlock()
	if !c.opMu.TryLock() {
		c.Close()
		return nil
	}
	c.stateMu.Lock()
	releasing := c.failure == nil
	if releasing {
		c.failure = ErrClosed
	}
	c.stateMu.Unlock()
	var out []transport.Link
	if releasing {
		// A link that point-to-point traffic is on (a receive's pump reading
		// it, a send part-way, a message arriving or kept) is not handed
		// over: its next reader would meet this world's frames. halt stops
		// new traffic first, so none starts after the look.
		busy := c.p2p.halt(ErrClosed)
		c.stateMu.Lock()
		c.handed = make([]bool, len(c.links))
		for r, l := range c.links {
			if l != nil && !c.sendBroken[r] && !busy[r] && keep(r) {
				if out == nil {
					out = make([]transport.Link, len(c.links))
				}
				out[r] = l
				c.handed[r] = true
			}
		}
		c.stateMu.Unlock()
	}
	c.opMu.Unlock()
	c.closeLinks()
	if err := c.closeDeviceAllreducer(); err != nil {
		c.log.Warn("closing the device allreducer", "err", err)
	}
	return out
}

// closeLinks ends the communicator: its links close, which fails any
// blocked call at once, and its helper goroutine exits once idle; and it
// stops watching its last caller's context, now or, when a collective is
// running, as that collective returns (releaseIfSpent: the failure is
// recorded before this).
func (c *Communicator) closeLinks() {
	if c.parent != nil { // a subset's links are its parent's
		return
	}
	c.stateMu.Lock()
	handed := c.handed
	c.stateMu.Unlock()
	for r, l := range c.links {
		if l != nil && (handed == nil || !handed[r]) {
			_ = l.Close()
		}
	}
	if c.parent == nil {
		c.p2p.stop(c.Err())
	}
	c.helper.stop()
	c.crossLane.helper.stop()
	c.driver.stop()
	if c.opMu.TryLock() {
		c.octx.release()
		c.opMu.Unlock()
	}
}

// releaseIfSpent stops watching the caller's context once the communicator
// has failed or closed (called with opMu held): it will run no collective
// again, and the registration would keep it alive as long as that context.
func (c *Communicator) releaseIfSpent() {
	if c.Err() != nil {
		c.octx.release()
	}
}

// setFailure records err as the failure unless there is one; it returns the
// failure in force.
func (c *Communicator) setFailure(err error) error {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.failure == nil {
		c.failure = err
	}
	return c.failure
}

// collKind names a collective in frames and errors.
type collKind uint8

const (
	collAllreduce collKind = iota + 1
	collBroadcast
	collAllgather
	collReduceScatter
	collAlltoall
	collBarrier
	collReplicate
)

func (k collKind) String() string {
	switch k {
	case collAllreduce:
		return "allreduce"
	case collBroadcast:
		return "broadcast"
	case collAllgather:
		return "allgather"
	case collReduceScatter:
		return "reducescatter"
	case collAlltoall:
		return "alltoall"
	case collBarrier:
		return "barrier"
	case collReplicate:
		return "replicate"
	}
	return fmt.Sprintf("collective(%d)", uint8(k))
}

func (k collKind) reduces() bool { return k == collAllreduce || k == collReduceScatter }
func (k collKind) rooted() bool  { return k == collBroadcast }

// Algorithms, carried in frame flags so ranks that chose differently (different
// configuration) see a mismatch rather than misread each other.
const (
	algoRing uint8 = iota + 1
	algoRecursiveDoubling
	algoTree
	algoChain
	algoPairwise
	algoDissemination
	algoHierarchical
	algoAdasum
	algoStripes
)

// opRun is one collective in progress. The communicator keeps one and
// reuses it for each collective.
type opRun struct {
	c *Communicator
	// infoMu guards desc and algo against Progress, which may read them
	// from another goroutine while the next collective sets them; the
	// collective's own goroutines read them without it.
	infoMu sync.Mutex
	desc   opDesc
	algo   uint8
	// tag is the largest Header.Tag seen so far: this rank's own value to
	// start with, then raised by every frame received. The sending and
	// receiving goroutines of the op share it.
	tag atomic.Uint64
	// waitingOn is the peer the receiving side waits for (-1: none), for
	// Progress.
	waitingOn atomic.Int32
	// t0 is when the collective started, when a tracer watches.
	t0 time.Time
}

// raiseTag records a received tag.
func (o *opRun) raiseTag(v uint64) {
	for {
		cur := o.tag.Load()
		if v <= cur || o.tag.CompareAndSwap(cur, v) {
			return
		}
	}
}

// run executes one collective: it serializes it with the others, numbers it,
// and turns a failure into the communicator's failure, telling the peers.
func (c *Communicator) run(ctx context.Context, d opDesc, algo uint8, body func(ctx *opContext, o *opRun) error) error {
	return c.runTagged(ctx, d, algo, nil, body)
}

// runTagged is run for a collective that spreads a tag: *tag goes in as this
// rank's value and comes out as the largest of all ranks'.
//
// body runs under an opContext bound to ctx (see opContext).
func (c *Communicator) runTagged(ctx context.Context, d opDesc, algo uint8, tag *uint64, body func(ctx *opContext, o *opRun) error) error {
	c.linkMu.Lock()
	defer c.linkMu.Unlock()
	c.opMu.Lock()
	defer c.opMu.Unlock()
	defer c.releaseIfSpent()
	if err := c.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Nothing was sent yet, so the world is still in step.
		return err
	}
	defer c.p2p.leave()
	c.seq++
	d.seq = c.seqBase + c.seq
	o := &c.op
	o.infoMu.Lock()
	o.desc, o.algo = d, algo
	o.infoMu.Unlock()
	o.waitingOn.Store(-1)
	var t uint64
	if tag != nil {
		t = *tag
	}
	o.tag.Store(t)
	octx := c.octx.bind(ctx)
	c.octx = octx
	c.started.Store(c.seq)
	c.inflight.Store(o)
	if c.tracer != nil {
		o.t0 = time.Now()
		c.tracer.CollectiveStart(o.info(), o.t0)
	}
	err := body(octx, o)
	c.inflight.Store(nil)
	if c.tracer != nil {
		c.tracer.CollectiveEnd(o.info(), o.t0, o.t0.Add(o.mark()), err)
	}
	if err == nil {
		if tag != nil {
			*tag = o.tag.Load()
		}
		return nil
	}
	return c.fail(err)
}

// fail stops the communicator after a failed collective: it records err, tells
// every peer whose stream is still at a frame boundary why, and closes the links.
func (c *Communicator) fail(err error) error {
	var origin *RemoteAbortError
	originPeer := -1
	if errors.As(err, &origin) {
		originPeer = origin.Rank
	}
	err = c.inParentRanks(err)
	c.stateMu.Lock()
	prior := c.failure
	if prior == nil {
		c.failure = err
	}
	c.stateMu.Unlock()
	if prior != nil {
		// Abort or Close got there first and already closed the links; the
		// error the link gave is a consequence, the recorded cause is the news.
		return fmt.Errorf("%w (%v)", prior, err)
	}
	c.log.Warn("collective failed; aborting communicator", "err", err)
	reason := fmt.Sprintf("rank %d: %v", c.world.Rank, err)
	if len(reason) > transport.MaxAbortReason {
		reason = reason[:transport.MaxAbortReason]
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.AbortTimeout)
	defer cancel()
	var wg sync.WaitGroup
	// Links kept open for Salvage end with an abort frame each way, the
	// one to the rank that aborted first included: its Salvage reads up
	// to it. No point-to-point frame may follow it (stop, first).
	keep := c.cfg.KeepLinksOnFailure && c.parent == nil
	if keep {
		c.p2p.stop(err)
	}
	for peer, l := range c.links {
		if l == nil || c.sendBroken[peer] || (originPeer == peer && !keep) {
			continue
		}
		wg.Go(func() {
			h := transport.Header{Kind: transport.FrameAbort, Length: uint32(len(reason))}
			if l.Send(ctx, &h, []byte(reason)) == nil {
				c.abortSent[peer].Store(true)
			}
		})
	}
	wg.Wait()
	if c.parent != nil {
		// The shared links' streams are out of step now: the parent, and
		// every other subset over its links, cannot run either.
		c.parent.Abort(err)
	}
	if !keep {
		c.closeLinks()
	}
	return err
}

func (o *opRun) header(step, n int, count uint64) transport.Header {
	d := &o.desc
	return transport.Header{
		Kind:   transport.FrameData,
		Seq:    d.seq,
		Count:  count,
		Step:   uint32(step),
		Length: uint32(n),
		Coll:   uint8(d.coll),
		DType:  uint8(d.dtype),
		Op:     uint8(d.op),
		Flags:  o.algo,
		Aux:    d.aux,
		Tag:    o.tag.Load(),
	}
}

// streamWhole reports whether a link whose send just failed says its
// streams hold no part of a frame (a send refused before it wrote
// anything, as when the collective was cancelled): an abort frame may then
// follow. Links that cannot tell are taken as broken.
func streamWhole(l transport.Link) bool {
	rl, ok := l.(transport.RekeyableLink)
	return ok && rl.Keepable()
}

// send sends one frame of the collective to peer.
func (o *opRun) send(ctx context.Context, peer, step int, payload []byte) error {
	return o.sendCount(ctx, peer, step, o.desc.count, payload)
}

// sendCount is send for collectives whose element count differs per peer pair.
func (o *opRun) sendCount(ctx context.Context, peer, step int, count uint64, payload []byte) error {
	h := &o.c.sendHdr[peer]
	*h = o.header(step, len(payload), count)
	if err := o.c.links[peer].Send(ctx, h, payload); err != nil {
		o.c.sendBroken[peer] = !streamWhole(o.c.links[peer])
		return err
	}
	return nil
}

// recv receives one frame of the collective from peer straight into into, after
// checking that the peer is running the same collective at the same step.
func (o *opRun) recv(ctx context.Context, peer, step int, into []byte) error {
	return o.recvCount(ctx, peer, step, o.desc.count, into)
}

// recvCount is recv for collectives whose element count differs per peer pair.
func (o *opRun) recvCount(ctx context.Context, peer, step int, count uint64, into []byte) error {
	if err := o.recvHeader(ctx, peer, step, len(into), count); err != nil {
		return err
	}
	return o.c.links[peer].RecvPayload(ctx, into)
}

// recvHeader receives the header of the next frame from peer and checks that
// it is step of this collective, with n payload bytes.
func (o *opRun) recvHeader(ctx context.Context, peer, step, n int, count uint64) error {
	l := o.c.links[peer]
	h := &o.c.recvHdr[peer]
	o.waitFor(peer)
	defer o.waitFor(-1)
	root := peer
	if o.c.members != nil {
		root = o.c.members[peer]
	}
	// Point-to-point frames may come first on the link (p2p.go): the pump
	// may have read this collective's header already, and p2p frames
	// before it are taken off here.
	if got, err := o.c.p2p.claim(ctx, root, h); err != nil {
		return err
	} else if !got {
		for {
			if err := l.RecvHeader(ctx, h); err != nil {
				return err
			}
			if !isP2P(h) {
				break
			}
			if err := o.c.p2p.receiveFrame(ctx, l, root, h); err != nil {
				return err
			}
		}
	}
	if h.Kind == transport.FrameAbort {
		reason := make([]byte, h.Length)
		if err := l.RecvPayload(ctx, reason); err != nil {
			return &RemoteAbortError{Rank: peer, Reason: "(reason lost: " + err.Error() + ")"}
		}
		if o.c.parent == nil {
			o.c.abortSeen[peer].Store(true)
		}
		return &RemoteAbortError{Rank: peer, Reason: string(reason)}
	}
	if err := o.check(peer, h, step, n, count); err != nil {
		return err
	}
	o.raiseTag(h.Tag)
	return nil
}

// sendInPlace is send for a frame the peer consumes with recvInPlace: links
// that can (transport.InPlaceLink) put it where the peer reads it in place.
func (o *opRun) sendInPlace(ctx context.Context, peer, step int, payload []byte) error {
	ipl := o.c.inPlace[peer]
	if ipl == nil {
		return o.send(ctx, peer, step, payload)
	}
	h := &o.c.sendHdr[peer]
	*h = o.header(step, len(payload), o.desc.count)
	if err := ipl.SendInPlace(ctx, h, payload); err != nil {
		o.c.sendBroken[peer] = !streamWhole(ipl)
		return err
	}
	return nil
}

// recvInPlace receives step's frame from peer and hands its payload to
// consume piece by piece where it lands (transport.InPlaceLink), or, on other
// links, whole after receiving it into scratch (as long as the payload).
// Pieces are multiples of the element size.
func (o *opRun) recvInPlace(ctx context.Context, peer, step int, scratch []byte, consume func(off int, piece []byte) error) error {
	if err := o.recvHeader(ctx, peer, step, len(scratch), o.desc.count); err != nil {
		return err
	}
	ipl := o.c.inPlace[peer]
	if ipl == nil {
		if err := o.c.links[peer].RecvPayload(ctx, scratch); err != nil {
			return err
		}
		return consume(0, scratch)
	}
	return ipl.RecvPayloadInPlace(ctx, scratch, consume)
}

// check compares a received header with what this rank expects.
func (o *opRun) check(peer int, h *transport.Header, step, n int, count uint64) error {
	d := o.desc
	d.count = count
	remote := opDesc{seq: h.Seq, coll: collKind(h.Coll), dtype: DType(h.DType), op: ReduceOp(h.Op), count: h.Count, aux: h.Aux}
	field := ""
	switch {
	case h.Seq != d.seq:
		field = "sequence number (one rank ran more collectives than the other, or one of another subset)"
	case remote.coll != d.coll:
		field = "collective"
	case remote.dtype != d.dtype:
		field = "dtype"
	case d.coll.reduces() && remote.op != d.op:
		field = "reduce op"
	case h.Count != d.count:
		field = "element count"
	case d.coll.rooted() && h.Aux != d.aux:
		field = "root"
	case h.Aux != d.aux:
		field = "layout"
	case h.Flags != o.algo:
		field = "algorithm (Algorithm, SmallMessageBytes, HierarchicalBytes or the world's hosts differ between ranks)"
	case int(h.Step) != step || int(h.Length) != n:
		field = fmt.Sprintf("framing (step %d of %d bytes, expected step %d of %d bytes; ChunkBytes differs between ranks?)", h.Step, h.Length, step, n)
	default:
		return nil
	}
	return &MismatchError{Peer: peer, Field: field, Local: d.String(), Remote: remote.String()}
}
