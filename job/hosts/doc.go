// Package hosts owns where a multi-host job may run: host lists as
// `horovodrun -H host1:2,host2:2` and `--hostfile` ("host slots=N" lines)
// give them, host discovery scripts (`--host-discovery-script`, run every
// second, printing "host:slots" lines) and the blacklist of failing hosts
// with Horovod's cooldown rule (`--blacklist-cooldown-range`).
//
// Set is the state machine: discovery answers and blacklistings in, the
// usable hosts in assignment order (oldest first) and what changed out.
// Watch drives a Set from a Discovery and delivers each Change to the job
// runner, which starts workers on added hosts, stops those on removed ones,
// and blacklists a host whose workers fail or cannot be started.
//
// Every parser names the line or entry it rejects; host names are checked
// so that neither ssh nor a shell can take one for an option or split it.
package hosts
