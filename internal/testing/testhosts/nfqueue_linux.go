package testhosts

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink_queue (linux/netfilter/nfnetlink_queue.h), the part a delayer
// needs: bind a queue, ask for each packet's id (all a verdict needs) and the
// first bytes of the packet (its flow, for Impairment.KeepOrder), receive
// packets, give verdicts.
const (
	nfnlSubsysQueue = 3
	nfqnlMsgPacket  = 0
	nfqnlMsgVerdict = 1
	nfqnlMsgConfig  = 2

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2
	nfqaPayload    = 10

	nfqaCfgCmd      = 1
	nfqaCfgParams   = 2
	nfqaCfgQueueMax = 3
	nfqaCfgMask     = 4
	nfqaCfgFlags    = 5

	nfqnlCfgCmdBind = 1
	nfqnlCopyPacket = 2
	copyRange       = 64 // an IPv4 header with options, and the ports after it
	nfqaCfgFGSO     = 4  // hand over GSO packets whole instead of segmenting them
	nfDrop          = 0
	nfAccept        = 1
)

// delayer gives every packet of one queue its verdict: drop it with the
// impairment's probability, else accept it after the impairment's delay.
// Held packets wait in a heap ordered by release time, and a timerfd armed
// for the earliest one wakes the releaser: Go's own timers sleep through the
// netpoller in whole milliseconds, which would round most delays up.
type delayer struct {
	conn   *netlink.Conn
	queue  uint16
	im     atomic.Pointer[Impairment]
	timer  *os.File // timerfd, CLOCK_MONOTONIC, read through the netpoller
	tfd    int      // the same descriptor (File.Fd would make it blocking)
	closed atomic.Bool
	done   chan struct{} // the receive loop has ended
	freed  chan struct{} // the releaser has ended

	mu   sync.Mutex
	held heldHeap
	seq  uint64 // orders packets of equal release times as they came

	// lastRelease is, per flow, the release time of its newest held packet
	// (KeepOrder; only the receive loop uses it).
	lastRelease map[flowKey]int64
}

type heldPacket struct {
	release int64 // CLOCK_MONOTONIC ns
	seq     uint64
	id      uint32
}

type heldHeap []heldPacket

func (h heldHeap) Len() int { return len(h) }
func (h heldHeap) Less(i, j int) bool {
	return h[i].release < h[j].release || h[i].release == h[j].release && h[i].seq < h[j].seq
}
func (h heldHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)   { *h = append(*h, x.(heldPacket)) }
func (h *heldHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// startDelayer binds queue in the network namespace at nsPath.
func startDelayer(nsPath string, queue uint16) (*delayer, error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	timer := os.NewFile(uintptr(tfd), "delayer-timerfd")
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Fd())})
	if err != nil {
		timer.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	// A full socket buffer would lose packet messages (the kernel then drops
	// the packets); a large buffer and no ENOBUFS errors keep the loop simple.
	_ = conn.SetReadBuffer(8 << 20)
	_ = conn.SetOption(netlink.NoENOBUFS, true)

	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nfqaCfgCmd, []byte{nfqnlCfgCmdBind, 0, 0, 0})
	params := binary.BigEndian.AppendUint32(nil, copyRange) // copy_range (be32), copy_mode
	params = append(params, nfqnlCopyPacket)
	ae.Bytes(nfqaCfgParams, params)
	ae.Bytes(nfqaCfgQueueMax, be32(1<<16))
	ae.Bytes(nfqaCfgMask, be32(nfqaCfgFGSO))
	ae.Bytes(nfqaCfgFlags, be32(nfqaCfgFGSO))
	attrs, err := ae.Encode()
	if err == nil {
		_, err = conn.Execute(netlink.Message{
			Header: netlink.Header{Type: msgType(nfqnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(nfgenmsg(queue), attrs...),
		})
	}
	if err != nil {
		conn.Close()
		timer.Close()
		return nil, fmt.Errorf("binding NFQUEUE %d: %w", queue, err)
	}
	d := &delayer{conn: conn, queue: queue, timer: timer, tfd: tfd, done: make(chan struct{}), freed: make(chan struct{}),
		lastRelease: map[flowKey]int64{}}
	d.set(Impairment{})
	go d.receive()
	go d.release()
	return d, nil
}

func (d *delayer) set(im Impairment) { d.im.Store(&im) }

// close stops receiving, lets every held packet go now, and closes.
func (d *delayer) close() {
	if d.closed.Swap(true) {
		return
	}
	_ = d.conn.SetReadDeadline(time.Unix(1, 0))
	<-d.done
	_ = d.timer.Close()
	<-d.freed
	d.mu.Lock()
	for _, p := range d.held {
		d.verdict(p.id, nfAccept)
	}
	d.held = nil
	d.mu.Unlock()
	_ = d.conn.Close()
}

func (d *delayer) receive() {
	defer close(d.done)
	failures := 0
	for {
		msgs, err := d.conn.Receive()
		if err != nil {
			if d.closed.Load() {
				return
			}
			// Receive errors are transient (the packet stays queued). Should the
			// socket be broken for good, stop: closing it unbinds the queue, and
			// --queue-bypass then lets packets pass unimpaired rather than
			// holding them forever.
			if failures++; failures > 100 {
				_ = d.conn.Close()
				return
			}
			continue
		}
		failures = 0
		for _, m := range msgs {
			id, payload, ok := queuedPacket(m)
			if !ok {
				continue
			}
			im := d.im.Load()
			if im.Loss > 0 && rand.Float64() < im.Loss {
				d.verdict(id, nfDrop)
				continue
			}
			wait := int64(im.Delay)
			if j := int64(im.Jitter); j > 0 {
				wait += rand.Int64N(2*j+1) - j
			}
			now := monotonic()
			release := now + wait
			if im.KeepOrder {
				flow := flowOf(payload)
				release = max(release, d.lastRelease[flow])
				d.lastRelease[flow] = release
				if len(d.lastRelease) > 4096 {
					d.forgetFlows(now)
				}
			}
			if release <= now {
				d.verdict(id, nfAccept)
				continue
			}
			d.hold(heldPacket{release: release, id: id})
		}
	}
}

// forgetFlows drops the flows with no packet held: a later packet of theirs
// can overtake nothing.
func (d *delayer) forgetFlows(now int64) {
	for f, r := range d.lastRelease {
		if r <= now {
			delete(d.lastRelease, f)
		}
	}
}

// flowKey names a flow: the IPv4 protocol, addresses and, for TCP, UDP and
// SCTP, ports. Anything else (IPv6, fragments) is one flow per protocol
// and address pair, or a flow of its own.
type flowKey [13]byte

func flowOf(pkt []byte) flowKey {
	var k flowKey
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return k
	}
	k[0] = pkt[9]            // protocol
	copy(k[1:9], pkt[12:20]) // source, destination
	ihl := int(pkt[0]&0xf) * 4
	fragment := binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0 // offset or more fragments
	switch pkt[9] {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if !fragment && len(pkt) >= ihl+4 {
			copy(k[9:13], pkt[ihl:ihl+4]) // source and destination ports
		}
	}
	return k
}

// hold queues a packet, re-arming the timer when it is the earliest.
func (d *delayer) hold(p heldPacket) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	p.seq = d.seq
	heap.Push(&d.held, p)
	if d.held[0] == p {
		d.arm(p.release)
	}
}

// release wakes at each release time and accepts the packets due.
func (d *delayer) release() {
	defer close(d.freed)
	var buf [8]byte
	for {
		if _, err := d.timer.Read(buf[:]); err != nil {
			return // closed
		}
		now := monotonic()
		d.mu.Lock()
		for len(d.held) > 0 && d.held[0].release <= now {
			p := heap.Pop(&d.held).(heldPacket)
			d.verdict(p.id, nfAccept)
		}
		if len(d.held) > 0 {
			d.arm(d.held[0].release)
		}
		d.mu.Unlock()
	}
}

// arm sets the timer to fire at the absolute monotonic time t (at once if
// that has passed).
func (d *delayer) arm(t int64) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(t, 1))}
	_ = unix.TimerfdSettime(d.tfd, unix.TFD_TIMER_ABSTIME, &spec, nil)
}

func monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (d *delayer) verdict(id, verdict uint32) {
	ae := netlink.NewAttributeEncoder()
	v := make([]byte, 8)
	binary.BigEndian.PutUint32(v[0:4], verdict)
	binary.BigEndian.PutUint32(v[4:8], id)
	ae.Bytes(nfqaVerdictHdr, v)
	attrs, _ := ae.Encode()
	// A verdict that cannot be sent leaves its packet queued: the loss of one
	// packet, which TCP repairs.
	_, _ = d.conn.Send(netlink.Message{
		Header: netlink.Header{Type: msgType(nfqnlMsgVerdict), Flags: netlink.Request},
		Data:   append(nfgenmsg(d.queue), attrs...),
	})
}

// queuedPacket returns the id of a queued packet message and the packet's
// first bytes (up to copyRange).
func queuedPacket(m netlink.Message) (id uint32, payload []byte, ok bool) {
	if m.Header.Type != msgType(nfqnlMsgPacket) || len(m.Data) < 4 {
		return 0, nil, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return 0, nil, false
	}
	for ad.Next() {
		switch ad.Type() {
		case nfqaPacketHdr:
			b := ad.Bytes()
			if len(b) < 4 {
				return 0, nil, false
			}
			id, ok = binary.BigEndian.Uint32(b[:4]), true
		case nfqaPayload:
			payload = ad.Bytes()
		}
	}
	return id, payload, ok
}

func msgType(msg int) netlink.HeaderType { return netlink.HeaderType(nfnlSubsysQueue<<8 | msg) }

// nfgenmsg is the nfnetlink header: family (unspecified), version 0, and the
// queue number in network order.
func nfgenmsg(queue uint16) []byte {
	return []byte{unix.AF_UNSPEC, 0, byte(queue >> 8), byte(queue)}
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
