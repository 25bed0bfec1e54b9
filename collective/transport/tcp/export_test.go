package tcp

import (
	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
)

// DefaultSocketBuffer is Config.SocketBuffer's default where the kernel grants it.
const DefaultSocketBuffer = defaultSocketBuffer

// KernelGrants reports whether this kernel gives sockets buffers of n bytes.
func KernelGrants(n int) bool { return kernelGrants(n) }

// SocketBuffers returns the link's SO_RCVBUF and SO_SNDBUF as the kernel
// reports them (Linux: twice what it grants).
func SocketBuffers(l transport.Link) (rcv, snd int, err error) {
	var rerr, serr error
	err = lanesOf(l)[0].rc.Control(func(fd uintptr) {
		rcv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	if err == nil {
		err = rerr
	}
	if err == nil {
		err = serr
	}
	return rcv, snd, err
}

// YieldsToProcesses reports whether a link's polls, both ways, yield to other
// processes (this host's ranks outnumber its CPUs).
func YieldsToProcesses(l transport.Link) bool {
	tl := lanesOf(l)[0]
	return tl.rio.spin.YieldsToProcesses() && tl.wio.spin.YieldsToProcesses()
}

// Sealed reports whether a link seals its frames, and whether it encrypts
// them.
func Sealed(l transport.Link) (sealed, encrypted bool) {
	tl := lanesOf(l)[0]
	if tl.wseal == nil {
		return false, false
	}
	return true, tl.wseal.Encrypts()
}

// Lanes reports how many connections a link has.
func Lanes(l transport.Link) int { return len(lanesOf(l)) }

// StripeMin is the smallest stripe a lane carries.
const StripeMin = stripeMin

// LanesFor is the lanes of a link given Config.Lanes and whether the peer is
// on this host.
func LanesFor(configured int, sameHost bool) int { return lanesFor(configured, sameHost) }

// Conns names each lane's connection of a link by its two ends' addresses
// ("local>remote"): a link carried into another world keeps them.
func Conns(l transport.Link) []string {
	var out []string
	for _, ln := range lanesOf(l) {
		out = append(out, ln.conn.LocalAddr().String()+">"+ln.conn.RemoteAddr().String())
	}
	return out
}
