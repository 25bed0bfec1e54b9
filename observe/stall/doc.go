// Package stall is gorovod's stall inspector: it notices collectives that
// some ranks have entered and others have not, and says which ranks are
// missing and which tensors they lack (Horovod warns after 60 s; so does
// this, configurable).
//
// gorovod has no central negotiation: a collective starts on each rank when
// its trainer calls it, and a rank blocked in it knows only the peer whose
// frame it waits for (collective.Communicator.Progress). The inspector is
// therefore in two halves:
//
//   - On every worker, an Inspector polls its communicator's Progress (a few
//     atomic loads, once per Interval). When the same collective stays in
//     flight past Threshold it logs a warning naming the collective, how long
//     it has waited and the rank it waits for, marks it on the timeline, and
//     keeps a Snapshot current: the rank's epoch, how many collectives it
//     has started, the one in flight and its tensors (SetTensors; the
//     elastic layer names the tensors of each fused allreduce). With
//     AbortAfter it aborts the communicator, so that the elastic layer
//     rebuilds the world instead of hanging.
//
//   - The driver, which hears from every worker over gossip, gathers their
//     Snapshots and calls Find: the ranks that are in collective #S past the
//     threshold, and the ranks of the same world that have not entered it
//     (their count of started collectives is below S) — those are the
//     missing ranks, and they lack every tensor of #S. A rank that has not
//     entered is usually a trainer stuck in its own code (a data loader, a
//     deadlock), or one that called a different sequence of collectives.
//
// Find is a pure function, so the driver's side costs nothing until a
// worker reports a stall.
package stall
