package tcp

import "github.com/gorovod/gorovod/collective/transport"

// YieldsToProcesses reports whether a link's polls, both ways, yield to other
// processes (this host's ranks outnumber its CPUs).
func YieldsToProcesses(l transport.Link) bool {
	tl := l.(*link)
	return tl.rio.spin.YieldsToProcesses() && tl.wio.spin.YieldsToProcesses()
}
