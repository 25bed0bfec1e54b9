// Package testdaemon runs the daemons a test harness needs (munged, slurmctld,
// etcd, kube-apiserver, ...) as child processes it tracks by pid: each logs
// to its own file, stops with SIGTERM and then SIGKILL, and dies with the
// test process if that one is killed. It also finds what a harness's daemons
// left behind (grandchildren such as slurmstepd) by a marker only that
// harness's processes carry, never by a process name: other tests on the same
// machine run daemons with the same names.
package testdaemon
