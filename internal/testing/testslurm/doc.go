// Package testslurm runs a real one-node Slurm cluster for tests: munged,
// slurmctld and slurmd from Debian's slurm-wlm and munge packages, with a
// configuration it writes in a temporary directory of its own (its own munge
// key and socket, free ports, its own state and spool directories, a unique
// cluster and node name), so that several clusters can run at once on one
// machine. Stop ends every job, then every daemon it started, by pid, and
// checks that nothing the cluster ran is left.
//
// It installs nothing: .ci/run installs slurm-wlm and munge. Tests skip when
// the programs are missing or the test does not run as root (slurmd and the
// jobs run as root here).
package testslurm
