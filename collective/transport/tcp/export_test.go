package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
)

// DefaultSocketBuffer is Config.SocketBuffer's default where the kernel grants it.
const DefaultSocketBuffer = defaultSocketBuffer

// KernelGrants reports whether this kernel gives sockets buffers of n bytes.
func KernelGrants(n int) bool { return kernelGrants(n) }

// OversubscribedChunk is the chunk a TCP transport's links suggest for
// oversubscribed worlds.
const OversubscribedChunk = oversubscribedChunk

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

// AutoLanes is how many connections a link to another host opens when
// Config.Lanes is 0.
const AutoLanes = autoLanes

// SendLanes is how many lanes carry the data frames a laned link sends
// now (what its peer was last told), RecvLanes how many its peer said
// carry the frames it receives. The caller must not be receiving on l.
func SendLanes(l transport.Link) int {
	ll := l.(*lanedLink)
	ll.smu.Lock()
	defer ll.smu.Unlock()
	return ll.sactive
}

func RecvLanes(l transport.Link) int { return l.(*lanedLink).ractive }

// SetSendLanes makes a laned link send its next data frames over n lanes,
// as a chooser settled at n would.
func SetSendLanes(l transport.Link, n int) {
	ll := l.(*lanedLink)
	ll.smu.Lock()
	defer ll.smu.Unlock()
	ll.auto = true
	ll.chooser = laneChooser{max: n, cur: n, settled: true}
	ll.probing.Store(false)
}

// CountPauses makes a laned link's chooser count every gap between frames
// as sending time, for tests that need the senders to settle whatever the
// machine's load: under -race beside other packages' tests the gaps between
// frames passed the 20 ms pause rule so often that nothing was measured and
// the senders never settled (CI: "did not settle within 100 rounds"). The
// pause rule has its own test (TestLaneChooser's rows). Call it after
// SetLaneTrial.
func CountPauses(l transport.Link) {
	ll := l.(*lanedLink)
	ll.smu.Lock()
	defer ll.smu.Unlock()
	ll.chooser.idleGap = time.Hour
}

// SetLaneTrial restarts a laned link's choice of its sending lanes with
// warm bytes skipped and trial bytes measured at each count.
func SetLaneTrial(l transport.Link, warm, trial int64) {
	ll := l.(*lanedLink)
	ll.smu.Lock()
	defer ll.smu.Unlock()
	ll.chooser = newLaneChooser(len(ll.lanes), warm, trial, ll.unacked)
	ll.probing.Store(ll.auto)
}

// LanesChosen reports whether a laned link has settled its sending lanes,
// on how many, and the rate it measured at each count tried (bytes per
// second, by count; 0: not tried).
func LanesChosen(l transport.Link) (settled bool, lanes int, rates []float64) {
	ll := l.(*lanedLink)
	ll.smu.Lock()
	defer ll.smu.Unlock()
	return ll.auto && ll.chooser.settled, ll.chooser.lanes(), append([]float64(nil), ll.chooser.rates[:]...)
}

// PaceLanes caps what each connection of a link sends at rate bytes per
// second (SO_MAX_PACING_RATE, which TCP enforces itself): a link whose
// every connection is bound on its own, as one stream is by a core or a
// congestion window.
func PaceLanes(l transport.Link, rate int) error {
	for _, ln := range lanesOf(l) {
		var serr error
		if err := ln.rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, rate)
		}); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
	}
	return nil
}
