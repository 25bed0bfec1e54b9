// Package engine is what stands behind gorovod's C ABI (bindings/c) and the
// language bindings over it: one process's membership in a job, and every
// collective the framework asks for, run on the current world's session in
// the order they were submitted.
//
// # Ordering
//
// Calls pair up across the ranks by name, as in Horovod's negotiation: a
// call given a name (Name) pairs with the other ranks' call of that name,
// wherever it stands in each rank's queue; a call without one pairs with
// the other ranks' call of its position among their unnamed calls on the
// same process set. The engine runs one call at a time: the head of its
// queue when every rank's head is the same call, else the call the ranks
// negotiate (negotiate.go). Every rank must submit the same collectives,
// with the same dtypes and sizes — what a framework's deterministic
// backward pass does; without names, in the same order. An asynchronous
// call returns a Handle at once; Wait or Poll collect it.
//
// Before a call moves any data, every rank compares its description (the
// collective, the tensors' dtypes and element counts, an allreduce's
// tensor shapes where the caller gives them, reduce op, root, scale
// factors, and the digest of its name or number) with every other rank's
// in one small allreduce (agree.go; the descriptions are gathered only
// when they differ). Ranks whose heads have different names exchange their
// pending calls and run the first of rank 0's that every rank has pending;
// ranks that called one collective (one name, or one position)
// differently all get a *collective.MismatchError for that call, and the
// world stays usable for the next one, as Horovod reports a mismatched
// request and goes on; calls that no rank's pairs with fail with one after
// Config.PairTimeout. Config.SkipAgreement leaves the comparison out, and
// with it the pairing by name.
//
// Point-to-point messages (Send, Recv, RecvAny; p2p.go) are the exception:
// only two ranks take part, when they like, so they run beside the queue,
// each on a goroutine of its own (a receive posted before the call returns).
//
// Queued calls run on one goroutine, the executor. A caller that would wait
// at once uses a Now form (AllreduceNow, BroadcastNow, BarrierNow): when
// nothing is queued or running and the call is small (Config.InlineBytes),
// it runs on the caller's own goroutine instead, and the executor starts
// nothing meanwhile. That saves the hand-over to the executor and back, which
// for a thread calling in from C (a cgo callback, locked to its thread)
// parks that thread and wakes another twice per call: on an idle virtual
// machine more than the whole small collective costs. Such a call may be made
// interruptible: Interrupt (the C ABI's SIGINT watch) aborts it, breaking
// its world, since it cannot be handed back to a waiter that gives up.
//
// # World changes
//
// A collective that fails because the world broke (a peer died, froze, or
// left) comes back ErrWorldChanged after the session has rebuilt the world;
// Commit moves every member to a newer world at a step boundary and says so
// with ErrHostsUpdated. Either way the trainer's state must be
// re-synchronized from the new rank 0 before it goes on, and the
// collectives it had already submitted belong to the old world: those still
// queued fail with ErrWorldChanged without running, and so does every new
// submission until the trainer calls Reset, which says "my next collectives
// are for the new world" (the Python binding's elastic.run does it before
// state.sync()). So no rank ever runs an old world's collective in a new
// world, where it would pair with another rank's different call.
//
// # Process sets
//
// Collectives may run on a process set, some of the world's ranks that
// every rank registered (AddProcessSet): the ...On forms. A set's calls run
// on a subset communicator over the world's links, in the same submission
// order as every other call of the process; a world change removes every
// set but the world's. See processset.go.
//
// # Memory
//
// Buffers are host memory the caller owns (C memory, a tensor's storage),
// or an accelerator's memory (DeviceBuffer: a CUDA tensor's, reached
// through Config.OpenDevice, the one seam to the driver; see device.go for
// how a call waits for the framework's stream through AfterEvent): the
// engine reads and writes it only while the handle that carries it is
// running, and keeps no reference once it completes. The caller keeps it
// valid and untouched until then.
package engine
