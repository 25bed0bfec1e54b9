// Package collective owns gorovod's communicator: the collectives one fixed,
// ordered group of workers runs together — allreduce, broadcast, allgather (equal
// and variable counts), reduce-scatter, alltoall, barrier and replicate — over any
// transport.Transport, and the algorithms behind them.
//
// Algorithms. Allreduce picks by size and topology (Config.Algorithm forces
// one): up to Config.SmallMessageBytes it uses recursive doubling (log2 p
// exchanges of the whole buffer, the fewest hops); above it the
// bandwidth-optimal ring (reduce-scatter then allgather, each rank moving
// 2(p-1)/p of the buffer), with every segment cut into Config.ChunkBytes
// chunks that a sender goroutine forwards as soon as the receiver has reduced
// them, so sending, receiving and reducing overlap. When the world spans
// several hosts and some host runs several ranks, allreduces of at least
// Config.HierarchicalBytes run the hierarchical algorithm instead:
// reduce-scatter inside each host, allreduce of each stripe between the ranks
// of one local index on every host, allgather inside each host, so each
// host's link carries its data once rather than once per local rank. A
// buffer of at least two Config.HierarchicalPieceBytes runs as pieces, so
// that the allreduce between hosts of one piece overlaps the work inside the
// host on the next and previous ones.
// Broadcast uses a binomial tree for small buffers and a pipelined chain for
// large ones; allgather and reduce-scatter run the ring (allgather the
// hierarchical gather when Config.AllgatherAlgorithm asks); alltoall pairs
// ranks k apart in step k; barrier is the dissemination algorithm.
// Replicate copies a buffer from a set of holders (ranks with identical
// bytes) to a set of receivers, each receiver taking contiguous stripes from
// up to k holders at once over their direct links (k from
// Config.StripeSources, or from the link kinds: holders on the receiver's
// host, else one per other host). Every rank ends with bit-identical results.
//
// Topology. Which ranks share a host comes from the world
// (transport.World.Hosts, or the host part of each rank's address); see
// Topology. Every ring orders the ranks host by host, so a flat ring crosses
// each host's link once in each direction; broadcast's chain and tree run over
// the same host order, from the root's host on, so a large broadcast enters
// each other host once.
//
// Memory. A Buffer is host bytes or DeviceMemory. The algorithms reach memory only
// through a small set of operations (stage out for sending, land received bytes,
// reduce a received chunk into place, scale), which are slice operations on the
// host and staged copies plus device kernels elsewhere, so accelerator memory
// runs through the same ring.
//
// Allocation. Once a communicator has run a collective of a shape (size,
// dtype, world), more of them allocate nothing: the communicator keeps what a
// collective needs from call to call — staging buffers, segment plans, frame
// headers, each algorithm's state (stepper), one context it binds to each
// call's (opContext) — and runs the sending half of a pipelined collective on
// one helper goroutine that lives until Close, Abort or a failure (a
// pipelined hierarchical allreduce adds a second lane of steps, with its own
// sender, and a goroutine that drives it: three at most). Options are plain
// values. TestSteadyStateAllocations checks it on every transport.
//
// Failure. Every collective takes a context. A peer that closes, dies or goes
// silent yields a *PeerError naming its rank within the context deadline or the
// transport's I/O timeout; ranks that call mismatched collectives get a
// *MismatchError describing both calls; a rank that fails tells the others why
// (*RemoteAbortError). After any failure the communicator is spent: build the
// next one. Abort stops it from another goroutine. Release hands a healthy
// communicator's links to the next world; with Config.KeepLinksOnFailure,
// Salvage does it for a failed one's, reading each link up to its peer's
// abort frame (salvage.go).
//
// Subsets. Communicator.Subset gives some of a communicator's ranks a
// communicator of their own over the same links, with sequence numbers of
// its own in the frames, for collectives among them while the other ranks
// do something else (process sets).
//
// Point-to-point. Communicator.Send and Recv move one message between two
// ranks, with a tag, on the same links, beside the collectives and outside
// their order (p2p.go): whoever reads a link sorts the frames, and a
// message's length is checked against its receive (*SizeMismatchError).
// RecvAny receives the next message with a tag from any rank; PostRecv and
// PostRecvAny post a receive at once for a Wait elsewhere.
// Messages over 16 KiB, and small ones beyond a 32 KiB window per peer, go
// by rendezvous (ready-to-send, clear-to-send): messages never fill a link
// before their receive is posted, so a collective started after a send is
// never stuck behind it.
//
// Element types are float32, float64, float16, bfloat16, int32, int64 and uint8;
// reduce ops sum, average, min, max and product, with Horovod's prescale and
// postscale factors. Float16 and bfloat16 reduce through float32 arithmetic,
// rounded once per element to nearest-even. Allreduce also offers Horovod's
// Adasum (adasum.go): floating-point types, a power-of-two world, each
// tensor of a fused buffer (Tensors) combined with its own dot product and
// norms, by vector halving and distance doubling.
package collective
