// Package sync is gorovod's trainer-facing elastic layer: what a training loop
// calls every step to average its gradients with the other workers, and what
// keeps that working while workers join, leave and fail — the trainer sees
// only its rank and the world size change.
//
// # The training loop
//
// Train owns the loop: the trainer writes one step (compute the gradients,
// Session.Allreduce them, apply the update) and Train redoes a step the world
// changed under, counts a step only once it committed, leaves the job
// gracefully on SIGTERM, ends cleanly when the job goes on without the worker,
// reports the end of training, trains alone in a world of one when no
// launcher started the process, and, given a sampler, owns the data epochs.
// The batch size of each step comes from a BatchPolicy (fixed by default).
// The job's result, written in TrainConfig.Final, outlives a rank 0 that
// dies at the end: the members wait at a barrier for it, and the new
// world's rank 0 writes it if the old one died first.
//
// # Ways into a job
//
// Train is the one entry for trainers: it joins the job, runs the loop and
// reports the end. The other ways in are layers of it, for code that drives
// its own loop:
//
//   - JoinJob is Train's join without the loop (Train calls the same join):
//     the job cfg names, the launcher's job, or a world of one, as Train
//     decides; it returns the JobMember a binding (bindings/c, and the
//     Python package over it) holds while it runs the steps itself.
//   - StartWorker is the join of an elastic job under both: cfg names the
//     job (WorkerConfigFromEnv reads a launcher's), never a world of one;
//     it returns the Worker, for a Go program that drives the Worker itself
//     (its tests' workers, a loop of its own).
//
// Below Train, such a loop drives the Session of its Worker or JobMember
// step by step: Allreduce or AllreduceAsync and WaitAll, then Commit, whose
// ErrWorldChanged and ErrExcluded say what happened (and what Train does
// about them: redo the step, rejoin as a new member with Worker.Rejoin, end). Gradients
// and the registered State are collective.Buffers: any of the seven dtypes,
// in host memory or in device memory (collective.DeviceMemory, such as
// collective/cuda's); fusion packs them into one buffer per dtype and memory
// kind, as Horovod does, and every worker ends with bit-identical results.
//
// # World epochs
//
// The membership layer (package membership, gossip) is eventually consistent;
// collectives need every participant to agree on one ordered member list. A
// world epoch is such a list with a number. Epochs are made by one proposer at
// a time (the protocol is sync/epoch's; sync/driver runs it over gossip):
//
//   - Who proposes: the job's driver (`gorovod run`, a gossip member with role
//     driver) while one is alive; otherwise the oldest ready worker (members
//     sorted by start time, then name). A worker takes over only after no
//     driver has been in its view for a grace of 2 s, so a briefly incomplete
//     view does not start a second proposer. It first asks every worker in
//     view which epoch it knows and continues the numbering after the newest
//     (the driver's last epoch may have reached only some workers), dropping
//     members that are gone and appending ready workers.
//   - What it proposes: survivors keep their relative order and joiners are
//     appended, so rank 0 of a new epoch is the oldest survivor. Changes closer
//     together than driver.Config.Coalesce (10 ms) make one epoch; no epoch
//     with fewer than MinWorkers members is proposed (the job waits for
//     joiners). A worker the driver removed (Driver.Remove, a scale-down) is
//     never admitted again.
//   - Inputs: a worker becomes a candidate when it announces itself ready (after
//     its own start-up, so joining never stalls the others); it is dropped when
//     it announces leaving, when gossip reports it left or failed, or when a
//     worker reports that a collective failed because of it and it does not
//     answer a liveness probe (three pings within 500 ms): blame alone is not
//     proof, as a survivor that aborted looks dead to its neighbours too. The
//     world whose collective failed is formed again even when the blamed worker
//     proves alive, as its members wait for a newer epoch. A worker blamed for
//     three worlds in a row that answered every probe is stuck (its gossip
//     runs, its training does not) and is removed all the same; connecting a
//     world is bounded by Config.ConnectTimeout, so a member that never
//     connects is blamed too. A worker left out of a world while it was alive
//     (paused, cut off, stuck) rejoins as a new member (Worker.Rejoin; Train
//     does it), unless the job said it is out for good (ErrOutForGood).
//   - Delivery: the proposer sends each epoch to every worker it knows, and
//     again every second, because gossip messages may be lost or reordered;
//     workers keep only the highest number. A worker re-sends its failure
//     report every second until a newer epoch arrives.
//
// How agreement is reached: a worker never acts on an epoch alone. Every
// gradient allreduce carries, in its frame headers, the highest epoch number
// any member has heard of (collective.MaxTag), so at the end of a step every
// member of the world holds the same number; if it is newer than the world
// they are in, all of them switch at that same step boundary (Session.Commit).
// No two workers finish a step in different worlds. A member holds back the
// number of a world with joiners while its links to them are being connected
// ahead (Session.Prepare), for at most Config.JoinHold (1 s): the members
// train on in their world while the joiners connect, and switch at the end
// of the first step after one of them is connected. Joining is connecting the
// new epoch's ring (the transport handshake rejects any other job or epoch) and
// receiving the registered State from the members that hold it: in stripes
// from several of them at once (collective.Replicate) when they are at least
// as many as the ranks that need it, else by broadcast from rank 0. Only the
// tensors that some member holds differently move: one small allreduce of
// per-tensor digests tells which (a joiner that loaded the job's checkpoint
// of a frozen layer receives none of it).
//
// When the proposer dies: a dead driver is noticed by gossip; after the grace
// the oldest ready worker proposes instead, as above. Under `gorovod run` the
// driver is also the workers' launcher: its workers train on without it and
// finish (their output goes to files in the job directory), nothing joins
// until a driver takes the job back (`gorovod run --attach`), and the
// fallback equally serves jobs whose workers were started by hand or by
// another launcher (docs/multihost.md, "When gorovod run dies"). Two
// proposers can coexist only while views disagree; a proposer that hears of
// an epoch newer than its own (in a report, a pong or another's announcement)
// numbers its next one above it, and a worker stuck in a world that cannot
// connect reports it, so the world settles on the next epoch.
//
// # Failures
//
// A collective that fails (a peer died, froze past the I/O timeout, or was
// declared dead by gossip, which aborts the stuck collective) makes the
// session report the peer to the proposer, abort the world, wait for the next
// epoch, rebuild and re-broadcast the state from the new rank 0, and return
// ErrWorldChanged: the trainer redoes the interrupted step from that state.
// No rollback to a checkpoint, no process restart. A collective can complete on
// some members while it fails on others, so members may reach the next world
// a step apart; the new rank 0's state wins, and a member rolled back by it
// gets ErrWorldChanged from the Commit that moved it, not success at a step
// the world did not keep. At the last step, the members that completed it
// finish (Worker.Finish: the first one's done message ends admissions, and
// departures no longer shrink the world) and leave; the proposer then gives
// the members that report its failure a world without the finished ones,
// however small, to redo it in, and Driver.Unfinished tells the launcher to
// let them finish. A worker admitted into a world that the finished members
// never entered (a cut-off worker back just as the others finish) never held
// the last step's state: it is out for good, not rescued, and ends without
// training (a world of its own would train on from the state it had before
// it was cut off). A worker that proposes (no driver) leaves last, once
// those are done.
//
// # Gradient noise and the adaptive batch size
//
// Train measures the gradient noise scale where the gradients pass
// (Config.GradientNoise; TrainConfig.NoGradientNoise turns it off): every
// gradient allreduce carries, beside the gradients and without an extra
// collective, each worker's squared norm of its local gradient (per
// micro-batch with RecordMicroBatch), and the averaged gradient's norm after
// it feeds AdaptDL's estimator (goodput.Estimator). The smoothed statistics go
// to the driver with the step statistics (the goodput heuristic) and to the
// batch policy. AdaptiveBatch learns the global batch, micro-batch and
// gradient accumulation that maximize goodput, with the learning-rate factor
// of its rule (TrainStep.Plan); rank 0 decides off the training path and its
// decision travels in the same allreduce, so every worker switches at the
// same step. docs/goodput.md has the models and the measurements.
//
// # Packages
//
// This package is what a trainer calls: Train (the loop), Worker (a process's
// membership in a job), Session (a world's collectives and step boundaries)
// and State (what a joining worker receives); JoinJob and its JobMember are
// the bindings' way in. Beneath it:
//
//   - sync/epoch: worlds (numbered member lists), the source a session
//     learns them from, and the epoch protocol as pure state machines
//     (Proposer, Follower);
//   - sync/driver: the loops that run the protocol over gossip: the job's
//     Driver, a worker's Agent, and an in-process Coordinator;
//   - sync/control: the wire format of the control messages;
//   - sync/fusion: packing many tensors into few allreduces (Horovod's fusion
//     buffer, one per dtype and memory kind) and overlapping them with the
//     backward pass;
//   - sync/sampler: sharding a data epoch across a changing number of workers
//     without skipping or repeating a sample;
//   - sync/stats: the step statistics workers send the driver.
package sync
