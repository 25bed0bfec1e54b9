package sync

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The control messages between the driver and the workers ride on the
// membership layer's reliable messages, as small JSON objects.

const (
	msgEpoch   = "epoch"   // driver → worker: the newest agreed epoch
	msgFailure = "failure" // worker → driver: a collective failed, blaming a member
	msgPing    = "ping"    // driver → worker: are you alive? (answered by the gossip goroutines)
	msgPong    = "pong"    // worker → driver: yes
	msgDone    = "done"    // worker → driver: training finished at this epoch
	msgStats   = "stats"   // worker → driver: step statistics for the autoscaling engine
)

// maxCauseLen bounds the error text a failure report carries.
const maxCauseLen = 512

type controlMsg struct {
	Type    string     `json:"t"`
	Number  uint64     `json:"n,omitempty"`
	Members []Member   `json:"m,omitempty"`
	Blamed  string     `json:"b,omitempty"`
	Cause   string     `json:"c,omitempty"`
	Nonce   uint64     `json:"o,omitempty"`
	Stats   []wireStat `json:"s,omitempty"`
	Total   int64      `json:"T,omitempty"`
}

// wireStat is a StepStat with times in microseconds and short keys: a batch
// of 256 steps must fit one membership message.
type wireStat struct {
	Epoch   uint64 `json:"e"`
	Step    int64  `json:"n"`
	Samples int    `json:"b,omitempty"`
	Compute int64  `json:"c"`
	Time    int64  `json:"d"`
}

// encodeStats writes a stats message by hand: it runs beside the training
// loop every few steps, and encoding/json's reflection made it cost more
// than the clock reads it reports (measured by BenchmarkStatsOverhead).
func encodeStats(b StatsBatch) []byte {
	out := make([]byte, 0, 32+48*len(b.Steps))
	out = append(out, `{"t":"`+msgStats+`","s":[`...)
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
		out = append(out, '}')
	}
	out = append(out, ']')
	if b.TotalSteps != 0 {
		out = append(out, `,"T":`...)
		out = strconv.AppendInt(out, b.TotalSteps, 10)
	}
	return append(out, '}')
}

// statsBatch converts a decoded stats message.
func (m controlMsg) statsBatch() StatsBatch {
	b := StatsBatch{Steps: make([]StepStat, len(m.Stats)), TotalSteps: m.Total}
	for i, w := range m.Stats {
		b.Steps[i] = StepStat{Epoch: w.Epoch, Step: w.Step, Samples: w.Samples,
			Compute: time.Duration(w.Compute) * time.Microsecond, StepTime: time.Duration(w.Time) * time.Microsecond}
	}
	return b
}

func encodeDone(epoch uint64) []byte {
	b, _ := json.Marshal(controlMsg{Type: msgDone, Number: epoch})
	return b
}

func encodePing(kind string, nonce uint64) []byte {
	b, _ := json.Marshal(controlMsg{Type: kind, Nonce: nonce})
	return b
}

func encodeEpoch(e Epoch) []byte {
	b, _ := json.Marshal(controlMsg{Type: msgEpoch, Number: e.Number, Members: e.Members})
	return b
}

func encodeFailure(epoch uint64, blamed string, cause error) []byte {
	c := ""
	if cause != nil {
		c = cause.Error()
		if len(c) > maxCauseLen {
			c = c[:maxCauseLen]
		}
	}
	b, _ := json.Marshal(controlMsg{Type: msgFailure, Number: epoch, Blamed: blamed, Cause: c})
	return b
}

// decodeControl parses and checks a control message.
func decodeControl(b []byte) (controlMsg, error) {
	var m controlMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("sync: malformed control message: %w", err)
	}
	switch m.Type {
	case msgEpoch:
		if m.Number == 0 || len(m.Members) == 0 {
			return m, errors.New("sync: epoch message without number or members")
		}
		seen := make(map[string]bool, len(m.Members))
		for _, mem := range m.Members {
			if mem.Name == "" || mem.Addr == "" || seen[mem.Name] {
				return m, fmt.Errorf("sync: epoch %d has an empty or repeated member", m.Number)
			}
			seen[mem.Name] = true
		}
	case msgFailure:
		if m.Number == 0 {
			return m, errors.New("sync: failure report without an epoch")
		}
	case msgDone:
		if m.Number == 0 {
			return m, errors.New("sync: done message without an epoch")
		}
	case msgStats:
		if len(m.Stats) == 0 {
			return m, errors.New("sync: stats message without steps")
		}
		for _, st := range m.Stats {
			if st.Epoch == 0 || st.Step < 1 || st.Samples < 0 || st.Compute < 0 || st.Time < 0 || st.Compute > st.Time {
				return m, fmt.Errorf("sync: stats message with an impossible step %+v", st)
			}
		}
		if m.Total < 0 {
			return m, errors.New("sync: stats message with a negative total")
		}
	case msgPing, msgPong:
		if m.Nonce == 0 {
			return m, errors.New("sync: ping without a nonce")
		}
	default:
		return m, fmt.Errorf("sync: unknown control message %q", m.Type)
	}
	return m, nil
}
