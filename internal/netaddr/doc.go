// Package netaddr picks the address a gorovod process binds to and
// advertises, so that processes on other hosts can reach it: the address of
// a named interface (`--network-interface`, as Horovod's), or the address
// this host uses to reach a given peer (the driver, say), or loopback for a
// job that never leaves this host.
package netaddr
