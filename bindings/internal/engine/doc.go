// Package engine is what stands behind gorovod's C ABI (bindings/c) and the
// language bindings over it: one process's membership in a job, and every
// collective the framework asks for, run on the current world's session in
// the order they were submitted.
//
// # Ordering
//
// gorovod's collectives pair up by their position in each rank's sequence
// (there is no negotiation by tensor name, as in Horovod), so the engine runs
// what it is given strictly in submission order, one call at a time: only
// the running call touches the session. An asynchronous call returns a
// Handle at once; Wait or Poll collect it. Every rank must submit the same
// collectives, with the same dtypes and sizes, in the same order — what a
// framework's deterministic backward pass does.
//
// Before a call moves any data, every rank compares its description (the
// collective, the tensors' dtypes and element counts, an allreduce's
// tensor shapes where the caller gives them, reduce op, root and scale
// factors) with every other rank's in one small allreduce (agree.go;
// the descriptions are gathered only when they differ).
// Ranks that called different collectives all get a
// *collective.MismatchError for that call, and the world stays usable for
// the next one, as Horovod reports a mismatched request and goes on.
// Config.SkipAgreement leaves the comparison out.
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
// Buffers are host memory the caller owns (C memory, a tensor's storage):
// the engine reads and writes it only while the handle that carries it is
// running, and keeps no reference once it completes. The caller keeps it
// valid and untouched until then.
package engine
