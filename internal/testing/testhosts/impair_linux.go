package testhosts

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Impairment is what happens to the packets a host sends, as `tc qdisc add dev
// eth0 root netem loss L delay D J` would do (netem applies to a device's
// egress). The kernels here lack netem, so it is built from what they have:
// an iptables rule sends every packet leaving eth0 to an NFQUEUE, and this
// process gives each its verdict: drop with probability Loss, else accept
// Delay ± Jitter (uniform, as netem's default) after it was queued. Like
// netem with jitter (its time-sorted queue), packets can overtake each
// other, unless KeepOrder holds each flow's packets in the order they were
// sent. Like netem, and unlike an iptables DROP (whose EPERM reaches the
// sender), a loss is silent.
type Impairment struct {
	Loss   float64       // in [0, 1]; 1 drops everything the host sends
	Delay  time.Duration // added to every packet the host sends
	Jitter time.Duration // the delay is uniform in [Delay-Jitter, Delay+Jitter]
	// KeepOrder releases the packets of one flow (protocol, addresses and
	// ports) in the order they were sent, as a path whose queues vary but
	// do not reorder: a packet whose drawn delay would let it overtake the
	// flow's previous one leaves right after it instead. Every packet is
	// still held within [Delay-Jitter, Delay+Jitter] (the previous one left
	// no later than that after it was sent, which was before this one);
	// back-to-back packets of a flow lean towards the longer delays.
	KeepOrder bool
}

// CanImpair reports why impairments cannot be applied here (nil if they can).
func CanImpair() error {
	if _, err := exec.LookPath(iptablesRestore); err != nil {
		return fmt.Errorf("%w: %s not found (apt-get install iptables)", ErrUnavailable, iptablesRestore)
	}
	return nil
}

// The legacy backend: the NFQUEUE target exists there as an xtables target,
// while the nftables backend needs the kernel's nft queue expression, which
// these kernels lack (CONFIG_NFT_QUEUE unset).
const iptablesRestore = "iptables-legacy-restore"

// delayQueue is the NFQUEUE number; queues are per network namespace.
const delayQueue = 0

// Impair replaces the host's impairment (the zero Impairment removes it).
func (h *Host) Impair(im Impairment) error {
	if im.Loss < 0 || im.Loss > 1 {
		return fmt.Errorf("testhosts: loss %v outside [0, 1]", im.Loss)
	}
	if im.Delay < 0 || im.Jitter < 0 || im.Jitter > im.Delay {
		return fmt.Errorf("testhosts: delay %v ± %v: want 0 ≤ jitter ≤ delay", im.Delay, im.Jitter)
	}
	if err := CanImpair(); err != nil {
		if im == (Impairment{}) {
			return nil // nothing can have been applied
		}
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.removed {
		return fmt.Errorf("testhosts: %s was removed", h.Name)
	}
	// The delayer listens on the queue before packets are sent to it (and
	// the rule says --queue-bypass: without a listener packets pass).
	active := im != Impairment{}
	if active {
		if h.delay == nil {
			d, err := startDelayer(h.nsPath, delayQueue)
			if err != nil {
				return fmt.Errorf("testhosts: impairing %s: %w", h.Name, err)
			}
			h.delay = d
		}
		h.delay.set(im)
	}
	var rules strings.Builder
	rules.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	if active {
		fmt.Fprintf(&rules, "-A OUTPUT -o eth0 -j NFQUEUE --queue-num %d --queue-bypass\n", delayQueue)
	}
	rules.WriteString("COMMIT\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+h.nsPath, "--", iptablesRestore)
	cmd.Stdin = strings.NewReader(rules.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testhosts: impairing %s: %s: %v: %s", h.Name, iptablesRestore, err, strings.TrimSpace(string(out)))
	}
	if !active && h.delay != nil {
		// No packet enters the queue any more; the ones in it get their verdicts.
		h.delay.close()
		h.delay = nil
	}
	return nil
}

// Heal removes the host's impairment and plugs its cable back in.
func (h *Host) Heal() error {
	return errors.Join(h.Impair(Impairment{}), h.SetLink(true))
}
