// Package driver runs the epoch protocol (package sync/epoch's state
// machines) over the membership layer: thin loops that turn gossip events
// and control messages into the machines' inputs, arm one timer at the
// machine's deadline, and carry out its outputs — sends, each bounded by a
// timeout on its own goroutine, and notices. Every decision is the machine's;
// the loop only does what it is told, so the steady state costs nothing
// beyond the once-a-second re-announcement.
//
//   - Driver (Start): the job's driver, the process `gorovod run` runs: a
//     gossip member with role driver around an epoch.Proposer. Launchers and
//     autoscaling engines use Current, Await, Workers, Remove (evict),
//     Finished, Unfinished, and Config.OnEpoch / OnStats. One that takes a
//     running job back (Config.Adopt) contacts the workers at their gossip
//     addresses (Config.Contact); of two drivers that see each other, the
//     older stops and leaves (Superseded).
//   - Agent (StartAgent): a worker's side, around an epoch.Follower: it
//     delivers the epochs announced to the worker (OnAdopt), answers
//     liveness probes, sends failure reports and the end of training to the
//     proposer, and proposes itself when the job has no driver and it is the
//     oldest ready worker (the takeover). sync.Worker runs one.
//   - Coordinator: an in-process proposer for workers in one process (tests,
//     benchmarks), around an epoch.Proposer, without gossip.
//   - ElectProposer: who proposes, in a membership view.
//
// A send that fails is reported back to the machine (a blamed worker that
// cannot be reached is removed at once) and logged: as a warning only when
// its target is still in view and not leaving — a normal departure is
// silent.
package driver
