// Package slurm runs an elastic gorovod job's workers through Slurm: it reads
// the allocation a job runs in (CurrentAllocation: hosts and slots from
// Slurm's environment) and implements heuristics.Provisioner, so that the
// autoscaling engine grows and shrinks the job through the cluster's own
// scheduler.
//
// Two ways to place workers (Config.Mode):
//
//   - Steps (the default): inside one allocation (salloc / sbatch), each
//     worker is its own `srun` job step of one task, started with --exact so
//     that steps share the allocation's CPUs without waiting on each other.
//     The job can grow up to the allocation's task count, at once: no queue.
//     One step per worker lets one be cancelled alone.
//   - Jobs: each worker is a separate one-task batch job (sbatch) that joins
//     through the gossip seeds in its environment when Slurm starts it. The
//     job can grow as far as the cluster lets it, at the price of queueing;
//     each worker is scheduled, preempted and time-limited on its own, like
//     a spot instance.
//
// What Slurm delivers (checked against slurm-wlm 22.05 by this package's
// tests): `scancel --signal=TERM JOB.STEP` delivers SIGTERM to the step's
// processes and nothing more; `scancel JOB.STEP` SIGKILLs the step at once,
// with no SIGTERM first; `scancel JOB` and preemption send SIGCONT and
// SIGTERM to every process of the job, then SIGKILL after the cluster's
// KillWait (30 s by default; Slurm ends a job at its time limit the same way,
// which is not timed here). SIGTERM to the srun process itself makes srun
// kill the step (SIGKILL, no SIGTERM). So Stop
// signals a step with `scancel --signal=TERM` first — the trainer leaves the
// job gracefully — and kills it only after the grace period; a worker that
// Slurm cancels gets its SIGTERM from Slurm and leaves within KillWait.
//
// The job secret never appears on a command line: srun and sbatch run with
// the worker's environment (GOROVOD_SECRET included) and export it to the
// task (--export=ALL). Slurm carries that environment in its launch request
// from srun to slurmd, authenticated by munge but not encrypted, and sbatch
// stores a batch job's environment in slurmctld's StateSaveLocation until the
// job ends, readable by the Slurm administrators.
//
// To map the engine's workers (gossip members, known by host and pid) to
// steps and jobs, each worker starts as `/bin/sh -c 'echo marker; exec
// trainer'`: the shell prints its step or job id, host and pid — the
// trainer's pid, since exec keeps it — on stderr before becoming the
// trainer.
package slurm
