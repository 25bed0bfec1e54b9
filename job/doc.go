// Package job runs an elastic training job: it starts the job's driver (the
// proposer of its world epochs, sync/driver), launches the worker processes,
// runs the autoscaling engine (package heuristics) that grows, shrinks and
// repairs the job, follows the job to its end and says how it ended. `gorovod
// run` is its command line; a Go program runs a job with Run, or with Start
// and the returned Job's methods (AddWorkers, Status, Wait).
//
// What varies between environments is injected through Config:
//
//   - a Launcher starts worker processes on a host (LocalLauncher: this one;
//     SSHLauncher: other hosts over ssh; Slurm job steps or Kubernetes pods in
//     launchers of their own). Each worker is told its launch index, which it
//     publishes, so the runner knows its processes on every host.
//   - a Discovery lists the hosts and their slots (StaticHosts; HostWatch: a
//     host list or a discovery script, minus blacklisted hosts); workers fill
//     the hosts in order, the workers of a host that leaves the list are
//     taken out of the job, and a host that loses a worker (a *launch.HostError) is
//     blacklisted.
//   - the start (start.go): the first world waits for all Workers, as
//     Horovod starts a job with -np workers, up to StartTimeout; then it
//     forms with those that came (at least MinWorkers) and a Notice says so.
//   - the floor (minimum.go) keeps the job at MinWorkers whatever took it
//     below: lost workers (at once, with Config.ReplaceLost), leavers and
//     excluded workers gone (once the shortage is seen twice) are replaced
//     on free slots.
//   - the bound on unresponsive workers (unresponsive.go): after the first
//     world, a process out of the driver's view for WakeAfter since it was
//     last listed (half of ElasticTimeout if it never joined) is woken
//     (SIGCONT), and stopped and replaced a quarter of ElasticTimeout later
//     if it is still out.
//   - Config.Gossip sets the driver's bind and advertise addresses;
//     Config.StartDriver replaces the driver (tests).
//   - Config.Autoscaling is the engine's configuration, its heuristic
//     included; the runner is the engine's cluster and provisioner.
//   - Sinks receive every event: the job's start, each worker started and
//     exited (and how), its output lines, each world (with the members that
//     joined and left, workers started by hand among them), the engine's
//     decisions, the end of training and the Outcome.
//
// The job file (Config.JobFile, jobfile.go) is what a worker started by hand
// needs to join, the job secret included: mode 0600, named after the
// launcher's pid and pid namespace so that a later launcher removes the
// files of launchers that died, and read back by ReadJobFile (`gorovod attach`).
//
// The job's directory (Config.OutputDir, outputdir.go) holds its workers'
// output files, its record (record.tsv) and its environment (job.env): a
// job outlives its runner, and a new runner takes it back with Config.Adopt
// (adopt.go, `gorovod run --attach`): its driver binds the dead driver's
// gossip address when it can, else its own, and contacts the workers at the
// gossip addresses the record holds; it learns the workers' world before
// proposing, becomes the job's seed (job.env), and the running workers are
// followed by pid (on this host) or through the Launcher (WorkerAdopter:
// over ssh on other hosts).
//
// The rules that end a job are in one place, end.go; Outcome.Err is the
// job's verdict.
//
// Inside, a Job composes one type per concern, each owning its state: the
// roster of its processes (roster.go), which composes under its one lock
// where workers go (placement, placement.go), where the job stands
// (standing, standing.go) and the workers that joined by hand (handStarted,
// handstarted.go); the start (firstWorld, start.go), the floor under
// MinWorkers (floor, minimum.go), the end of training and its clock (ending,
// end.go), each process's exclusions and returns (presence, rejoin.go), what
// supervise has yet to act on (inbox, inbox.go), the driver's half of the
// stall inspector (stallWatch, observe.go), the job's timeline (jobTimeline,
// observe.go) and the stream of events to the sinks (eventStream,
// stream.go); job.go starts the job, supervises it and ties them together,
// workers.go launches the processes and follows each to its exit, and
// changes.go acts on the driver's worlds and removals and on the host lists.
package job
