package sync

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The control messages between the driver and the workers ride on the
// membership layer's reliable messages, as small JSON objects.

const (
	msgEpoch   = "epoch"   // driver → worker: the newest agreed epoch
	msgFailure = "failure" // worker → driver: a collective failed, blaming a member
	msgPing    = "ping"    // driver → worker: are you alive? (answered by the gossip goroutines)
	msgPong    = "pong"    // worker → driver: yes
	msgDone    = "done"    // worker → driver: training finished at this epoch
)

// maxCauseLen bounds the error text a failure report carries.
const maxCauseLen = 512

type controlMsg struct {
	Type    string   `json:"t"`
	Number  uint64   `json:"n,omitempty"`
	Members []Member `json:"m,omitempty"`
	Blamed  string   `json:"b,omitempty"`
	Cause   string   `json:"c,omitempty"`
	Nonce   uint64   `json:"o,omitempty"`
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
	case msgPing, msgPong:
		if m.Nonce == 0 {
			return m, errors.New("sync: ping without a nonce")
		}
	default:
		return m, fmt.Errorf("sync: unknown control message %q", m.Type)
	}
	return m, nil
}
