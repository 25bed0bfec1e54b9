// Package testhosts gives tests several real hosts on one Linux machine: each
// host is a network namespace with its own veth on a private bridge and its
// own address in 198.18.0.0/24 (the benchmarking range), its own mount and
// UTS namespaces (a private tmpfs on /dev/shm, so gorovod's shared-memory
// transport sees another machine, its own hostname, an /etc/hosts naming
// every host), and an OpenSSH daemon listening only on that address, with a
// throwaway host key and a throwaway client key. Tests start workers there
// over ssh exactly as a user would, and break the hosts as real machines
// break: every process killed with SIGKILL, the link taken down, packets lost
// or delayed. A host's link can be given a rate (Host.Shape, Config.Link: a
// tbf qdisc on each end), so that bandwidth is measured against a network of
// a known speed rather than memory.
//
// Nothing is created in the machine's own network namespace: the bridge lives
// in a namespace of its own (the "switch"), so two harnesses, in this test
// binary or another agent's, never share a device, a route or an address.
// Every name starts with a prefix unique to the harness (its pid and random
// bytes), and Close (t.Cleanup when built with NewT) removes exactly what the
// harness created, also after a failed test. Namespaces left by a harness
// whose process died (kill -9 of a test binary) are removed by the next
// harness, which recognises them by its prefix and the dead pid in the name.
//
// Needs root, util-linux (nsenter, unshare), iproute2 (ip, and tc for
// shaping), openssh-server and, for packet loss and delay, iptables (its
// legacy backend). The kernels these
// tests run on are built without the netem qdisc (CONFIG_NET_SCH_NETEM is
// unset), so loss is an iptables statistic match and delay is the NFQUEUE
// target with the verdicts given late by this process (see Impairment).
// Available says what is missing; NewT skips the test with that reason.
package testhosts
