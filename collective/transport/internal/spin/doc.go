// Package spin is the bounded, adaptive polling the transports do before a
// blocking call parks.
//
// A rank waiting for its peer's next chunk usually waits a few microseconds.
// Parking costs more than that: the thread sleeps in the kernel, the core may
// go idle, and waking an idle virtual CPU costs tens of microseconds on a VM
// (a receiver that parks on every frame runs at half the speed of one that
// polls; 4 KiB round trips become bimodal). So a call first polls its
// condition (a ring counter, a non-blocking read) for a while and parks only
// when that fails.
//
// Polling must not burn cores that something else needs, nor keep an idle or
// blocked job busy:
//
//   - every few polls it yields to the process's other goroutines
//     (runtime.Gosched: at GOMAXPROCS=1 the sending goroutine runs only when
//     the receiving one yields);
//   - when the host's ranks outnumber its CPUs it also yields to other
//     processes (sched_yield: the peer often needs exactly this core). Not
//     otherwise: a sched_yield hands the CPU to any process that wants it,
//     and one that does not wait for anything (other work on the machine)
//     keeps it for a whole time slice, which at every wait made one busy
//     core cost a 4 KiB allreduce milliseconds and, under heavier load, a
//     4 MiB TCP allreduce half its speed. Even among oversubscribed ranks a
//     yield that comes back only after a whole slice stops the yields for a
//     while (100 ms, doubling while it recurs, up to 10 s; for polls of
//     shared memory two yields of over 1 ms within 10 ms, and 10 ms at
//     first: a lone slow yield on an idle machine is a blip, and these
//     ranks lose most while paused), and the waits meanwhile poll no longer
//     than non-yielding ones;
//   - it checks the context, the link's state and the clock, so cancellation,
//     Close and Abort end it within a few polls;
//   - it is bounded per wait by a Budget, which adapts: it halves each time a
//     wait outlasts it (the call parks anyway, so the polling was wasted)
//     and grows by a sixteenth of its maximum each time a poll succeeds. The
//     maximum is YieldingFactor times longer for polls that read memory and
//     yield to other processes (NewYieldingBudget): with ranks two to a core
//     a wait is mostly the neighbour's turn on the CPU, which a yield gives
//     at once and a parked wait pays a kernel wake-up on top of. A job that waits on a silent peer spins
//     once, briefly, then sleeps; a job whose waits are long (slow steps, a
//     straggler) soon spins only a little per wait; a job streaming data
//     spins at the maximum;
//   - a wait known to be long does not poll at all (Unpolled): a link's
//     re-key waits for its peer to reach the same step boundary, on every
//     link of every member at once.
package spin
