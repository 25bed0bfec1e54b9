package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// The control messages between the driver and the workers ride on the
// membership layer's reliable messages, as small JSON objects.

// SendTimeout bounds the delivery of one control message (over the
// membership layer's TCP connection to one member): a member that does not
// take it in time is dead or frozen, which gossip reports on its own.
const SendTimeout = 2 * time.Second

// Kind is a control message's type.
type Kind string

// The kinds of control message.
const (
	KindEpoch   Kind = "epoch"   // proposer → worker: the newest agreed epoch
	KindFailure Kind = "failure" // worker → proposer: a collective failed, blaming a member
	KindPing    Kind = "ping"    // proposer → worker: are you alive? (answered by the gossip goroutines)
	KindPong    Kind = "pong"    // worker → proposer: yes, and the newest epoch I know
	KindDone    Kind = "done"    // worker → proposer: training finished at this epoch
	KindStats   Kind = "stats"   // worker → driver: step statistics for the autoscaling engine
	KindStall   Kind = "stall"   // worker → driver: its stall inspector's snapshot
)

// maxCauseLen bounds the error text a failure report carries.
const maxCauseLen = 512

// Message is a decoded control message; which fields are set depends on
// Kind.
type Message struct {
	Kind    Kind            `json:"t"`
	Number  uint64          `json:"n,omitempty"` // the epoch (epoch, failure, done, pong)
	Members []epoch.Member  `json:"m,omitempty"` // epoch, pong
	Blamed  string          `json:"b,omitempty"` // failure: the member blamed ("" when none)
	Cause   string          `json:"c,omitempty"` // failure: the error, at most maxCauseLen bytes
	Nonce   uint64          `json:"o,omitempty"` // ping, pong
	Final   bool            `json:"f,omitempty"` // epoch: the recipient is left out for good
	Stats   []wireStat      `json:"s,omitempty"`
	Total   int64           `json:"T,omitempty"`
	Stall   *stall.Snapshot `json:"x,omitempty"`
	// GradSqr and GradVar are the gradient statistics after a stats
	// message's last step (stats.Step).
	GradSqr float64 `json:"q,omitempty"`
	GradVar float64 `json:"v,omitempty"`
}

// Bounds of the tensor names a stall snapshot carries, so that one fits a
// membership message whatever the trainer names its tensors.
const (
	maxStallTensors    = 64
	maxStallTensorName = 128
)

// EncodeStall carries a stall inspector's snapshot to the driver; a long
// list of tensor names is cut (its last entry says how many were left out).
func EncodeStall(s stall.Snapshot) []byte {
	if len(s.Tensors) > maxStallTensors || slices.ContainsFunc(s.Tensors, func(n string) bool { return len(n) > maxStallTensorName }) {
		names := make([]string, 0, min(len(s.Tensors), maxStallTensors))
		for i, n := range s.Tensors {
			if i == maxStallTensors-1 && len(s.Tensors) > maxStallTensors {
				names = append(names, fmt.Sprintf("… %d more", len(s.Tensors)-i))
				break
			}
			if len(n) > maxStallTensorName {
				n = n[:maxStallTensorName]
			}
			names = append(names, n)
		}
		s.Tensors = names
	}
	s.Worker = "" // the sender's name comes with the message
	return marshal(Message{Kind: KindStall, Stall: &s})
}

// wireStat is a stats.Step with times in microseconds and short keys: a batch
// of 256 steps must fit one membership message.
type wireStat struct {
	Epoch   uint64 `json:"e"`
	Step    int64  `json:"n"`
	Samples int    `json:"b,omitempty"`
	Compute int64  `json:"c"`
	Time    int64  `json:"d"`
	// Loss is set only when the trainer reported one (a pointer: 0 is a loss).
	Loss   *float64 `json:"l,omitempty"`
	Accum  int      `json:"a,omitempty"`
	Bytes  int64    `json:"y,omitempty"`
	Switch int64    `json:"w,omitempty"` // microseconds
}

// EncodeStats writes a stats message by hand: it runs beside the training
// loop every few steps, and encoding/json's reflection made it cost more
// than the clock reads it reports (measured by BenchmarkStatsOverhead).
func EncodeStats(b stats.Batch) []byte {
	out := make([]byte, 0, 32+48*len(b.Steps))
	out = append(out, `{"t":"stats","s":[`...)
	for i, s := range b.Steps {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"e":`...)
		out = strconv.AppendUint(out, s.Epoch, 10)
		out = append(out, `,"n":`...)
		out = strconv.AppendInt(out, s.Step, 10)
		if s.Samples != 0 {
			out = append(out, `,"b":`...)
			out = strconv.AppendInt(out, int64(s.Samples), 10)
		}
		out = append(out, `,"c":`...)
		out = strconv.AppendInt(out, s.Compute.Microseconds(), 10)
		out = append(out, `,"d":`...)
		out = strconv.AppendInt(out, s.StepTime.Microseconds(), 10)
		if s.Accum != 0 {
			out = append(out, `,"a":`...)
			out = strconv.AppendInt(out, int64(s.Accum), 10)
		}
		if s.HasLoss && !math.IsNaN(s.Loss) && !math.IsInf(s.Loss, 0) {
			// A float32's precision is plenty for a loss, and half the bytes.
			out = append(out, `,"l":`...)
			out = strconv.AppendFloat(out, float64(float32(s.Loss)), 'g', -1, 32)
		}
		if s.Bytes != 0 {
			out = append(out, `,"y":`...)
			out = strconv.AppendInt(out, s.Bytes, 10)
		}
		if us := s.Switch.Microseconds(); us != 0 {
			out = append(out, `,"w":`...)
			out = strconv.AppendInt(out, us, 10)
		}
		out = append(out, '}')
	}
	out = append(out, ']')
	// The gradient statistics are smoothed over many steps: the batch's
	// newest go once, for its last step, which keeps a full batch within one
	// membership message. JSON has no infinities: statistics that are not
	// finite are not sent.
	if n := len(b.Steps); n > 0 {
		if last := b.Steps[n-1]; last.GradVar > 0 && last.GradSqr >= 0 && finite(last.GradSqr) && finite(last.GradVar) {
			out = append(out, `,"q":`...)
			out = strconv.AppendFloat(out, last.GradSqr, 'g', -1, 64)
			out = append(out, `,"v":`...)
			out = strconv.AppendFloat(out, last.GradVar, 'g', -1, 64)
		}
	}
	if b.TotalSteps != 0 {
		out = append(out, `,"T":`...)
		out = strconv.AppendInt(out, b.TotalSteps, 10)
	}
	return append(out, '}')
}

// StatsBatch converts a decoded stats message.
func (m Message) StatsBatch() stats.Batch {
	b := stats.Batch{Steps: make([]stats.Step, len(m.Stats)), TotalSteps: m.Total}
	for i, w := range m.Stats {
		b.Steps[i] = stats.Step{Epoch: w.Epoch, Step: w.Step, Samples: w.Samples,
			Compute: time.Duration(w.Compute) * time.Microsecond, StepTime: time.Duration(w.Time) * time.Microsecond,
			Accum: w.Accum, Bytes: w.Bytes, Switch: time.Duration(w.Switch) * time.Microsecond}
		if w.Loss != nil {
			b.Steps[i].Loss, b.Steps[i].HasLoss = *w.Loss, true
		}
	}
	if n := len(b.Steps); n > 0 {
		b.Steps[n-1].GradSqr, b.Steps[n-1].GradVar = m.GradSqr, m.GradVar
	}
	return b
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// World is a decoded epoch message's world, or the world a pong reports.
func (m Message) World() epoch.World { return epoch.World{Number: m.Number, Members: m.Members} }

// Protocol returns the epoch-protocol message m carries; false for step
// statistics, which are not the protocol's.
func (m Message) Protocol() (epoch.Message, bool) {
	switch m.Kind {
	case KindEpoch:
		return epoch.Message{Kind: epoch.MsgEpoch, World: m.World(), Final: m.Final}, true
	case KindFailure:
		return epoch.Message{Kind: epoch.MsgFailure, Number: m.Number, Blamed: m.Blamed, Cause: m.Cause}, true
	case KindPing:
		return epoch.Message{Kind: epoch.MsgPing, Nonce: m.Nonce}, true
	case KindPong:
		return epoch.Message{Kind: epoch.MsgPong, Nonce: m.Nonce, World: m.World()}, true
	case KindDone:
		return epoch.Message{Kind: epoch.MsgDone, Number: m.Number}, true
	}
	return epoch.Message{}, false
}

// Encode writes an epoch-protocol message.
func Encode(m epoch.Message) []byte {
	switch m.Kind {
	case epoch.MsgEpoch:
		if m.Final {
			return marshal(Message{Kind: KindEpoch, Number: m.World.Number, Members: m.World.Members, Final: true})
		}
		return EncodeEpoch(m.World)
	case epoch.MsgFailure:
		return encodeFailure(m.Number, m.Blamed, m.Cause)
	case epoch.MsgPing:
		return EncodePing(m.Nonce)
	case epoch.MsgPong:
		return EncodePong(m.Nonce, m.World)
	case epoch.MsgDone:
		return EncodeDone(m.Number)
	}
	return marshal(Message{Kind: Kind(m.Kind.String())})
}

// EncodeDone says that training finished at world epoch number.
func EncodeDone(number uint64) []byte { return marshal(Message{Kind: KindDone, Number: number}) }

// EncodePing asks a worker to prove it is alive; it answers EncodePong with
// the same nonce.
func EncodePing(nonce uint64) []byte { return marshal(Message{Kind: KindPing, Nonce: nonce}) }

// EncodePong answers a ping, saying which epoch is the newest the worker
// knows (the zero World when none); with nonce 0 it acknowledges an epoch
// received (latest is then not the zero World).
func EncodePong(nonce uint64, latest epoch.World) []byte {
	return marshal(Message{Kind: KindPong, Nonce: nonce, Number: latest.Number, Members: latest.Members})
}

// EncodeEpoch announces world w.
func EncodeEpoch(w epoch.World) []byte {
	return marshal(Message{Kind: KindEpoch, Number: w.Number, Members: w.Members})
}

// marshal encodes a message of plain fields, which cannot fail.
func marshal(m Message) []byte {
	b, _ := json.Marshal(m)
	return b
}

// EncodeFailure reports that a collective of world epoch number failed,
// blaming the member named blamed ("" when none).
func EncodeFailure(number uint64, blamed string, cause error) []byte {
	c := ""
	if cause != nil {
		c = cause.Error()
	}
	return encodeFailure(number, blamed, c)
}

func encodeFailure(number uint64, blamed, cause string) []byte {
	if len(cause) > maxCauseLen {
		cause = cause[:maxCauseLen]
	}
	return marshal(Message{Kind: KindFailure, Number: number, Blamed: blamed, Cause: cause})
}

// checkMembers checks a world's member list: names and addresses set, no
// name twice.
func checkMembers(m Message) error {
	seen := make(map[string]bool, len(m.Members))
	for _, mem := range m.Members {
		if mem.Name == "" || mem.Addr == "" || seen[mem.Name] {
			return fmt.Errorf("control: epoch %d has an empty or repeated member", m.Number)
		}
		seen[mem.Name] = true
	}
	return nil
}

// Decode parses and checks a control message.
func Decode(b []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("control: malformed control message: %w", err)
	}
	if len(m.Members) == 0 {
		// "m":[] and no "m" are the same world (none): one form, so that a
		// message decodes to what it re-encodes to.
		m.Members = nil
	}
	if m.Final && m.Kind != KindEpoch {
		return m, fmt.Errorf("control: a %s message cannot be final (only an epoch)", m.Kind)
	}
	// No epoch number above epoch.MaxNumber crosses the wire: nothing
	// derived from one can wrap around 2^64 (the machines also bound how
	// far ahead of what they know a number may be, epoch.MaxLead).
	if m.Number > epoch.MaxNumber {
		return m, fmt.Errorf("control: %s message: %w: %d is above %d", m.Kind, epoch.ErrNumberOutOfRange, m.Number, epoch.MaxNumber)
	}
	if m.Stall != nil && m.Stall.Epoch > epoch.MaxNumber {
		return m, fmt.Errorf("control: stall message: %w: %d", epoch.ErrNumberOutOfRange, m.Stall.Epoch)
	}
	for _, st := range m.Stats {
		if st.Epoch > epoch.MaxNumber {
			return m, fmt.Errorf("control: stats message: %w: %d", epoch.ErrNumberOutOfRange, st.Epoch)
		}
	}
	switch m.Kind {
	case KindEpoch:
		if m.Number == 0 || len(m.Members) == 0 {
			return m, errors.New("control: epoch message without number or members")
		}
		if err := checkMembers(m); err != nil {
			return m, err
		}
	case KindFailure:
		if m.Number == 0 {
			return m, errors.New("control: failure report without an epoch")
		}
	case KindDone:
		if m.Number == 0 {
			return m, errors.New("control: done message without an epoch")
		}
	case KindStats:
		if len(m.Stats) == 0 {
			return m, errors.New("control: stats message without steps")
		}
		for _, st := range m.Stats {
			if st.Epoch == 0 || st.Step < 1 || st.Samples < 0 || st.Compute < 0 || st.Time < 0 || st.Compute > st.Time || st.Bytes < 0 || st.Switch < 0 ||
				st.Accum < 0 {
				return m, fmt.Errorf("control: stats message with an impossible step %+v", st)
			}
		}
		if m.Total < 0 {
			return m, errors.New("control: stats message with a negative total")
		}
		if m.GradSqr < 0 || m.GradVar < 0 {
			return m, errors.New("control: stats message with negative gradient statistics")
		}
	case KindStall:
		st := m.Stall
		switch {
		case st == nil:
			return m, errors.New("control: stall message without a snapshot")
		case st.Epoch == 0 || st.Size < 1 || st.Rank < 0 || st.Rank >= st.Size || st.For < 0 || st.Bytes < 0 ||
			st.WaitingOn < -1 || st.WaitingOn >= st.Size || (st.InFlight && st.Started == 0):
			return m, fmt.Errorf("control: stall message with an impossible snapshot %+v", *st)
		case len(st.Tensors) > maxStallTensors:
			return m, fmt.Errorf("control: stall message with %d tensor names (at most %d)", len(st.Tensors), maxStallTensors)
		}
		for _, n := range st.Tensors {
			if len(n) > maxStallTensorName+8 { // the cut, plus "… N more"
				return m, errors.New("control: stall message with an overlong tensor name")
			}
		}
	case KindPing, KindPong:
		// A pong without a nonce answers no ping: it acknowledges an epoch
		// (the one it carries, or a newer one the worker knows).
		if m.Nonce == 0 && (m.Kind == KindPing || m.Number == 0) {
			return m, fmt.Errorf("control: %s without a nonce", m.Kind)
		}
		if m.Kind == KindPing && (m.Number != 0 || len(m.Members) != 0) {
			return m, errors.New("control: ping with a world")
		}
		if m.Kind == KindPong && (m.Number == 0) != (len(m.Members) == 0) {
			return m, errors.New("control: pong with a world without number or members")
		}
		if err := checkMembers(m); err != nil {
			return m, err
		}
	default:
		return m, fmt.Errorf("control: unknown control message %q", m.Kind)
	}
	return m, nil
}
